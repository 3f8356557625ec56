// The backward kernels split work by index only and keep every reduction inside one task: the
// gradients of a graph are bitwise identical whatever the size of the CPU thread pool. Sizes are
// large enough that every kernel's ParallelFor really splits.
#include "executor/cpu/thread_pool.h"
#include "frontend/autodiff/autodiff.h"
#include "gtest/gtest.h"
#include "tests/autodiff/test_graph.h"

namespace onnxpipe::autodiff {
namespace {

using ir::OpKind;
using ir::ValueId;
using testing::MakeAttrs;

TEST(DeterminismTest, GradientsDoNotDependOnThreadCount) {
  testing::TestGraph t;
  // Embedding with many repeated indices -> GatherGrad.
  std::vector<int64_t> ids(4096);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7919) % 50);
  ValueId emb = t.Op1(OpKind::kGather, {t.Param("table", {50, 96}), t.ConstI("ids", {64, 64}, ids)});
  // LayerNorm, Linear with bias (ReduceToShapeOf over 4096 rows), Gelu, Dropout.
  ValueId ln = t.Op1(OpKind::kLayerNorm, {emb, t.Param("ln.s", {96}, 0.5, 1.5), t.Param("ln.b", {96})},
                     MakeAttrs({{"axis", int64_t{-1}}, {"epsilon", 1e-5}}));
  ValueId lin = t.Op1(OpKind::kLinear, {ln, t.Param("w", {96, 96}), t.Param("b", {96})});
  ValueId act = t.Op1(OpKind::kGelu, {lin}, MakeAttrs({{"approximate", std::string("tanh")}}));
  ValueId drop = t.Op1(OpKind::kDropout, {act}, MakeAttrs({{"ratio", 0.1}}));
  // Attention with dropout over (64 batch, 2 heads, 64 seq, 48 dims).
  ValueId heads = t.Op1(OpKind::kReshape, {drop, t.ConstI("hs", {4}, {64, 64, 2, 48})});
  ValueId q = t.Op1(OpKind::kTranspose, {heads}, MakeAttrs({{"perm", std::vector<int64_t>{0, 2, 1, 3}}}));
  ValueId o = t.Op1(OpKind::kAttention, {q, q, q}, MakeAttrs({{"dropout", 0.1}, {"causal", int64_t{1}}}));
  ValueId pooled = t.Op1(OpKind::kReduceMean, {o}, MakeAttrs({{"axes", std::vector<int64_t>{1, 2}}, {"keepdims", int64_t{0}}}));
  ValueId logits = t.Op1(OpKind::kMatMul, {pooled, t.Param("head", {48, 10})});
  std::vector<int64_t> labels(64);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i % 10);
  ValueId loss = t.Op1(OpKind::kSoftmaxCrossEntropyLoss, {logits, t.ConstI("labels", {64}, labels)},
                       MakeAttrs({{"label_smoothing", 0.1}}));
  ASSERT_TRUE(ir::InferShapes(t.g()).ok());
  t.g().outputs() = {loss};
  auto info = BuildGradients(&t.g(), loss, {});
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->param_grads.size(), 6u);

  std::vector<std::vector<ir::Tensor>> runs;
  for (int threads : {1, 3, 8}) {
    cpu::ThreadPool::SetGlobalNumThreads(threads);
    auto out = testing::Run(t.g());
    ASSERT_TRUE(out.ok()) << out.status();
    runs.push_back(*out);
  }
  cpu::ThreadPool::SetGlobalNumThreads(0);
  for (size_t r = 1; r < runs.size(); ++r) {
    ASSERT_EQ(runs[r].size(), runs[0].size());
    for (size_t k = 0; k < runs[0].size(); ++k) {
      EXPECT_TRUE(runs[r][k].BitwiseEquals(runs[0][k])) << t.g().value(t.g().outputs()[k]).name;
    }
  }
  // Not trivially equal: every gradient has non-zero entries.
  for (size_t k = 1; k < runs[0].size(); ++k) {
    const ir::Tensor& g = runs[0][k];
    double s = 0;
    for (int64_t i = 0; i < g.num_elements(); ++i) s += std::abs(g.data<double>()[i]);
    EXPECT_GT(s, 0) << t.g().value(t.g().outputs()[k]).name;
  }
}

}  // namespace
}  // namespace onnxpipe::autodiff
