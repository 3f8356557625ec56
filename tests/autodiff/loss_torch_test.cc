// Cross-entropy (AddCrossEntropyLoss, and the SoftmaxCrossEntropyLoss op with class weights)
// against PyTorch's torch.nn.functional.cross_entropy: loss and gradient with respect to the
// logits, with ignore_index and label smoothing, per sample and per token, in fp64 (1e-10) and
// fp32 (1e-5), and from bf16 logits (the loss reads them as they are and computes in f32; the
// gradient comes back in bf16: within 2^-8 relative). The reference comes from
// tests/autodiff/ce_reference.py run by ONNXPIPE_PYTHON (for bf16 cases, on the bf16 values).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "frontend/autodiff/autodiff.h"
#include "frontend/autodiff/loss.h"
#include "frontend/ir/precision.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/autodiff/test_graph.h"

namespace onnxpipe::autodiff {
namespace {

struct CeCase {
  std::vector<int64_t> shape;
  std::vector<int64_t> labels;
  int64_t ignore_index = -100;
  double label_smoothing = 0;
  std::vector<double> weights;  // empty: none (then the graph comes from AddCrossEntropyLoss)
  bool bf16 = false;            // the loss reads bf16 logits (a Cast of an f32 parameter holding bf16 values)
};

std::vector<double> Logits(const std::vector<int64_t>& shape, int salt, bool bf16 = false) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) {
    v[i] = 2.5 * std::sin(0.37 * static_cast<double>(i) + salt);
    if (bf16) v[i] = ir::BF16ToFloat(ir::FloatToBF16(static_cast<float>(v[i])));
  }
  return v;
}

absl::StatusOr<nlohmann::json> TorchReference(const std::vector<CeCase>& cases) {
  nlohmann::json in = nlohmann::json::array();
  for (size_t k = 0; k < cases.size(); ++k) {
    const CeCase& c = cases[k];
    std::vector<int64_t> label_shape(c.shape.begin(), c.shape.end() - 1);
    nlohmann::json j = {{"logits", Logits(c.shape, static_cast<int>(k), c.bf16)}, {"shape", c.shape},
                        {"labels", c.labels}, {"label_shape", label_shape},
                        {"ignore_index", c.ignore_index}, {"label_smoothing", c.label_smoothing}};
    if (!c.weights.empty()) j["weights"] = c.weights;
    in.push_back(j);
  }
  const std::string path = ::testing::TempDir() + "/ce_cases.json";
  std::ofstream(path) << in.dump();
  const std::string cmd = std::string(ONNXPIPE_PYTHON) + " " + ONNXPIPE_SOURCE_DIR +
                          "/tests/autodiff/ce_reference.py " + path;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return absl::InternalError("cannot run " + cmd);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  if (rc != 0) return absl::InternalError(cmd + " failed with status " + std::to_string(rc));
  return nlohmann::json::parse(out);
}

// Builds the loss graph of case k; returns (graph with gradients, labels feed).
absl::StatusOr<std::pair<ir::Graph, std::vector<ir::Tensor>>> Build(const CeCase& c, int k) {
  ir::Graph g;
  ir::ValueId logits;
  const ir::DType loss_dtype = c.bf16 ? ir::DType::kF32 : ir::DType::kF64;
  if (c.bf16) {
    const ir::ValueId param = g.AddConstant(
        "logits_f32", ir::Tensor::FromVector<double>(c.shape, Logits(c.shape, k, true)).CastTo(ir::DType::kF32),
        /*is_initializer=*/true);
    logits = g.AddValue("logits", ir::DType::kBF16, ir::FromInts(c.shape));
    ir::Attrs a;
    a.Set("to", std::string("bf16"));
    g.AddNode(ir::OpKind::kCast, "to_bf16", {param}, {logits}, std::move(a));
  } else {
    logits = g.AddConstant("logits", ir::Tensor::FromVector<double>(c.shape, Logits(c.shape, k)),
                           /*is_initializer=*/true);
  }
  std::vector<int64_t> label_shape(c.shape.begin(), c.shape.end() - 1);
  ir::ValueId loss;
  if (c.weights.empty()) {
    CrossEntropyOptions opt;
    opt.ignore_index = c.ignore_index;
    opt.label_smoothing = c.label_smoothing;
    ASSIGN_OR_RETURN(LossInfo li, AddCrossEntropyLoss(&g, "logits", "labels", opt));
    loss = li.loss;
  } else {
    ir::ValueId labels = g.AddValue("labels", ir::DType::kI64, ir::FromInts(label_shape));
    g.inputs().push_back(labels);
    ir::ValueId w = g.AddConstant("class_weights", ir::Tensor::FromVector<double>(
                                                       {static_cast<int64_t>(c.weights.size())}, c.weights)
                                                       .CastTo(loss_dtype));
    loss = g.AddValue("loss", loss_dtype, {});
    g.AddNode(ir::OpKind::kSoftmaxCrossEntropyLoss, "sce", {logits, labels, w}, {loss},
              testing::MakeAttrs({{"reduction", std::string("mean")},
                                  {"ignore_index", c.ignore_index},
                                  {"label_smoothing", c.label_smoothing}}));
    g.outputs().push_back(loss);
  }
  RETURN_IF_ERROR(ir::InferShapes(g));
  ASSIGN_OR_RETURN(TrainingGraphInfo info, BuildGradients(&g, loss, {}));
  RET_CHECK(info.param_grads.size() == 1);
  return std::make_pair(std::move(g), std::vector<ir::Tensor>{
                                          ir::Tensor::FromVector<int64_t>(label_shape, c.labels)});
}

TEST(LossTorchTest, CrossEntropyMatchesPyTorch) {
  const std::vector<CeCase> cases = {
      {{5, 4}, {0, 3, -100, 1, 2}, -100, 0.0, {}},
      {{5, 4}, {0, 3, -100, 1, 2}, -100, 0.1, {}},
      {{6, 7}, {6, 0, 0, 2, 5, 1}, -100, 0.3, {}},
      {{2, 3, 4}, {3, -1, 0, 2, -1, 1}, -1, 0.1, {}},
      {{2, 5, 6}, {5, 0, 1, 2, 3, 4, 0, 0, 5, -100}, -100, 0.0, {}},
      {{5, 4}, {0, 3, -100, 1, 2}, -100, 0.25, {0.5, 1.5, 2.0, 0.75}},
      {{4, 3}, {2, 2, 0, 1}, -100, 0.0, {1.0, 3.0, 0.5}},
      // bf16 logits: per sample and per token, label smoothing, ignore_index, class weights.
      {{5, 4}, {0, 3, -100, 1, 2}, -100, 0.1, {}, true},
      {{2, 5, 6}, {5, 0, 1, 2, 3, 4, 0, 0, 5, -100}, -100, 0.2, {}, true},
      {{5, 4}, {0, 3, -100, 1, 2}, -100, 0.25, {0.5, 1.5, 2.0, 0.75}, true},
      {{3, 37}, {36, 0, 17}, -100, 0.0, {}, true},
  };
  auto ref = TorchReference(cases);
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_EQ(ref->size(), cases.size());
  for (size_t k = 0; k < cases.size(); ++k) {
    SCOPED_TRACE("case " + std::to_string(k));
    auto built = Build(cases[k], static_cast<int>(k));
    ASSERT_TRUE(built.ok()) << built.status();
    auto& [g, feeds] = *built;
    const double want_loss = (*ref)[k]["loss"].get<double>();
    const std::vector<double> want_grad = (*ref)[k]["grad"].get<std::vector<double>>();
    if (cases[k].bf16) {
      auto out = testing::Run(g, feeds);
      ASSERT_TRUE(out.ok()) << out.status();
      ASSERT_EQ((*out)[0].dtype(), ir::DType::kF32);
      const ir::Tensor grad = out->back().CastTo(ir::DType::kF64);
      EXPECT_NEAR((*out)[0].CastTo(ir::DType::kF64).data<double>()[0], want_loss, 1e-5 * std::max(1.0, std::abs(want_loss)));
      ASSERT_EQ(grad.num_elements(), static_cast<int64_t>(want_grad.size()));
      for (size_t i = 0; i < want_grad.size(); ++i) {
        EXPECT_NEAR(grad.data<double>()[i], want_grad[i], std::ldexp(std::abs(want_grad[i]), -8) + 1e-7)
            << "d loss / d logits[" << i << "] bf16";
      }
      continue;
    }
    for (ir::DType dt : {ir::DType::kF64, ir::DType::kF32}) {
      ir::Graph run = g;
      if (dt == ir::DType::kF32) {
        ASSERT_TRUE(ir::ConvertFloatPrecision(run, ir::DType::kF64, dt).ok());
      }
      const double tol = dt == ir::DType::kF64 ? 1e-10 : 1e-5;
      auto out = testing::Run(run, feeds);
      ASSERT_TRUE(out.ok()) << out.status();
      const ir::Tensor loss = (*out)[0].CastTo(ir::DType::kF64);
      const ir::Tensor grad = out->back().CastTo(ir::DType::kF64);
      EXPECT_NEAR(loss.data<double>()[0], want_loss, tol * std::max(1.0, std::abs(want_loss)));
      ASSERT_EQ(grad.num_elements(), static_cast<int64_t>(want_grad.size()));
      for (size_t i = 0; i < want_grad.size(); ++i) {
        EXPECT_NEAR(grad.data<double>()[i], want_grad[i], tol) << "d loss / d logits[" << i << "] "
                                                               << ir::DTypeName(dt);
      }
    }
  }
}

}  // namespace
}  // namespace onnxpipe::autodiff
