// ONNX activations and logic ops that the importer lowers to primitive ops
// (frontend/onnx/import_activation.cc), on the hand-built models of tests/data/onnx_activations
// (make_models.py: numpy references from the specification's formulas, which onnxruntime equalled
// when they were written): the forward equals the reference, and the gradients of X and of the
// initializers (PRelu's slope, Sum's and Mean's other operands) equal central finite differences
// (in float64), and in float32 the forward and every gradient stay finite at |x| = 100, where exp
// overflows if a lowering takes it of |x| (a Where's discarded branch would give inf * 0 = NaN).
#include <cmath>
#include <string>
#include <vector>

#include "frontend/ir/infer.h"
#include "frontend/onnx/loader.h"
#include "gtest/gtest.h"
#include "tests/autodiff/onnx_grad_check.h"
#include "tests/autodiff/test_graph.h"

namespace onnxpipe::autodiff {
namespace {

const char* const kFloatModels[] = {"softplus",        "softsign",    "mish",      "elu",   "celu", "selu", "leakyrelu",
                                    "thresholdedrelu", "hardsigmoid", "hardswish", "prelu", "sum",  "mean"};

std::string DataPath(const std::string& file) { return testing::TestDataPath("onnx_activations", file); }

ir::Tensor Npy(const std::string& file) { return testing::ReadTestNpy(DataPath(file)); }

TEST(OnnxActivationTest, ForwardEqualsTheSpecification) {
  for (const std::string name : kFloatModels) {
    testing::ExpectOutputMatchesReference("onnx_activations", name, {Npy(name + ".X.npy")}, 1e-6, 2e-6);
  }
}

TEST(OnnxActivationTest, OrAndXorEqualNumpy) {
  for (const std::string name : {"or", "xor"}) {
    testing::ExpectOutputMatchesReference("onnx_activations", name, {Npy(name + ".X.npy"), Npy(name + ".B.npy")});
  }
}

TEST(OnnxActivationTest, GradientsEqualFiniteDifferences) {
  for (const std::string name : kFloatModels) {
    const std::vector<std::string> compared = testing::ExpectGradientsMatchFiniteDifferences(
        DataPath(name + ".onnx"), {{"X", Npy(name + ".X.npy")}}, 1e-6, [](const std::string&) { return true; });
    EXPECT_FALSE(compared.empty()) << name;
  }
}

TEST(OnnxActivationTest, Float32GradientsStayFiniteWhereExpWouldOverflow) {
  for (const std::string name : kFloatModels) {
    onnx_frontend::LoadOptions options;
    const ir::Tensor x = Npy(name + ".X.npy");
    ASSERT_EQ(x.GetAsDouble(1), 100.0) << name;
    options.constant_inputs = {{"X", x}};
    absl::StatusOr<onnx_frontend::LoadedModel> m = onnx_frontend::LoadOnnxModel(DataPath(name + ".onnx"), options);
    ASSERT_TRUE(m.ok()) << name << ": " << m.status();
    testing::TestGraph t;
    t.g() = std::move(*m->graph);
    ASSERT_TRUE(ir::InferShapes(t.g()).ok()) << name;
    const ir::ValueId loss =
        t.Op1(ir::OpKind::kReduceSum, {t.g().FindValue("Y")}, testing::MakeAttrs({{"keepdims", int64_t{0}}}));
    ASSERT_TRUE(ir::InferShapes(t.g()).ok()) << name;
    t.g().outputs() = {loss};
    absl::StatusOr<TrainingGraphInfo> info = BuildGradients(&t.g(), loss, {});
    ASSERT_TRUE(info.ok()) << name << ": " << info.status();
    absl::StatusOr<std::vector<ir::Tensor>> out = testing::Run(t.g());
    ASSERT_TRUE(out.ok()) << name << ": " << out.status();
    for (const ir::Tensor& o : *out) {
      ASSERT_EQ(o.dtype(), ir::DType::kF32) << name;
      for (int64_t i = 0; i < o.num_elements(); ++i) ASSERT_TRUE(std::isfinite(o.GetAsDouble(i))) << name << " " << i;
    }
  }
}

}  // namespace
}  // namespace onnxpipe::autodiff
