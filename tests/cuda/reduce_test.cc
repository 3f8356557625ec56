// ReduceSum / ReduceMean / ReduceToShape on the GPU against the CPU backend's kernels (fp32
// within 1e-6 relative: both accumulate in double), 16-bit inputs and outputs, plans (host only,
// run without a GPU) and argument errors.
#include "executor/cuda/reduce.h"

#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/cpu/test_util.h"
#include "tests/cuda/device_tensor.h"

namespace onnxpipe::cuda::testing {
namespace {

using cpu::testing::Eval1;
using cpu::testing::MakeNode;
using cpu::testing::Rand;
using ir::DType;
using ir::OpKind;
using ir::Tensor;

class ReduceTest : public CudaTest {};

Tensor GpuReduce(ReduceKind kind, const ReducePlan& plan, const Tensor& x, DType out_dtype,
                 const std::vector<int64_t>& out_dims) {
  DeviceTensor dx(x), dy(out_dtype, out_dims);
  const absl::Status st = Reduce(kind, plan, x.dtype(), dx.get(), out_dtype, dy.get(), nullptr);
  EXPECT_TRUE(st.ok()) << st;
  return dy.ToHost();
}

// As GpuReduce with the workspace ReduceWorkspaceBytes asks for (the split-columns path).
Tensor GpuReduceSplit(ReduceKind kind, const ReducePlan& plan, const Tensor& x, DType out_dtype,
                      const std::vector<int64_t>& out_dims) {
  const int64_t bytes = ReduceWorkspaceBytes(plan, x.dtype());
  EXPECT_GT(bytes, 0) << "no split-columns path for this plan";
  DeviceTensor dx(x), dy(out_dtype, out_dims), ws(DType::kU8, {bytes});
  const absl::Status st = Reduce(kind, plan, x.dtype(), dx.get(), out_dtype, dy.get(), nullptr, ws.get(), bytes);
  EXPECT_TRUE(st.ok()) << st;
  return dy.ToHost();
}

Tensor CpuReduce(ReduceKind kind, const Tensor& x, const std::vector<int64_t>& axes) {
  ir::Attrs a;
  a.Set("axes", axes);
  a.Set("keepdims", int64_t{0});
  return Eval1(MakeNode(kind == ReduceKind::kSum ? OpKind::kReduceSum : OpKind::kReduceMean, 1, 1, a), {x});
}

TEST(ReducePlanTest, MergesContiguousGroupsAndDropsUnitDims) {
  auto p = MakeReducePlan({4, 6, 5, 7}, {2, -1});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->kept_rank, 1);
  EXPECT_EQ(p->kept_dims[0], 24);
  EXPECT_EQ(p->kept_strides[0], 35);
  EXPECT_EQ(p->reduced_rank, 1);
  EXPECT_EQ(p->reduced_dims[0], 35);
  EXPECT_EQ(p->reduced_strides[0], 1);
  EXPECT_TRUE(p->innermost_reduced);
  EXPECT_EQ(p->num_out, 24);
  EXPECT_EQ(p->num_reduced, 35);
  // Middle axis with unit dims around: kept (4), reduced (6), kept (7).
  auto m = MakeReducePlan({4, 1, 6, 1, 7}, {2});
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->kept_rank, 2);
  EXPECT_EQ(m->kept_dims[1], 7);
  EXPECT_EQ(m->kept_strides[0], 42);
  EXPECT_EQ(m->reduced_dims[0], 6);
  EXPECT_EQ(m->reduced_strides[0], 7);
  EXPECT_FALSE(m->innermost_reduced);
  // Bias gradient (B, S, D) -> (D): one reduced group of B*S rows of stride D.
  auto b = MakeReduceToShapePlan({8, 16, 32}, {32});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->reduced_rank, 1);
  EXPECT_EQ(b->reduced_dims[0], 128);
  EXPECT_EQ(b->reduced_strides[0], 32);
  EXPECT_EQ(b->num_out, 32);
}

TEST(ReducePlanTest, BadAxesAndShapesAreErrors) {
  EXPECT_FALSE(MakeReducePlan({4, 5}, {2}).ok());
  EXPECT_FALSE(MakeReducePlan({4, 5}, {1, -1}).ok());
  EXPECT_FALSE(MakeReduceToShapePlan({4, 5}, {3}).ok());
  EXPECT_FALSE(MakeReduceToShapePlan({5}, {4, 5}).ok());
  EXPECT_FALSE(
      MakeReducePlan({2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}, {0, 2, 4, 6, 8, 10, 12, 14, 16}).ok());
}

TEST_F(ReduceTest, SumAndMeanMatchCpuOverAxes) {
  const Tensor x = Rand(DType::kF32, {4, 6, 5, 7}, 1);
  const std::vector<std::vector<int64_t>> axes_sets = {{3}, {0}, {1}, {0, 2}, {1, 3}, {}, {0, 1, 2}, {-2, -3}};
  for (const auto& axes : axes_sets) {
    auto plan = MakeReducePlan(x.dims(), axes);
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (ReduceKind kind : {ReduceKind::kSum, ReduceKind::kMean}) {
      const Tensor want = CpuReduce(kind, x, axes);
      const Tensor got = GpuReduce(kind, *plan, x, DType::kF32, want.dims());
      EXPECT_LT(MaxRelError(got, want), 1e-6) << "axes " << axes.size() << " kind " << static_cast<int>(kind);
    }
  }
  // Bias-gradient and row-sum sizes: (4096, 1024) over rows and over columns.
  const Tensor big = Rand(DType::kF32, {4096, 1024}, 2);
  for (int64_t axis : {0, 1}) {
    auto plan = MakeReducePlan(big.dims(), {axis});
    ASSERT_TRUE(plan.ok());
    const Tensor want = CpuReduce(ReduceKind::kSum, big, {axis});
    EXPECT_LT(MaxRelError(GpuReduce(ReduceKind::kSum, *plan, big, DType::kF32, want.dims()), want), 1e-6) << axis;
  }
}

TEST_F(ReduceTest, ReduceToShapeMatchesCpuReduceToShapeOf) {
  const Tensor x = Rand(DType::kF32, {4, 6, 5}, 3);
  const std::vector<std::vector<int64_t>> likes = {{5}, {6, 1}, {1, 6, 5}, {}, {4, 1, 5}, {4, 6, 5}};
  for (const auto& like : likes) {
    auto plan = MakeReduceToShapePlan(x.dims(), like);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const Tensor want = Eval1(MakeNode(OpKind::kReduceToShapeOf, 2), {x, Tensor(DType::kF32, like)});
    const Tensor got = GpuReduce(ReduceKind::kSum, *plan, x, DType::kF32, like);
    EXPECT_LT(MaxRelError(got, want), 1e-6) << like.size();
  }
}

TEST_F(ReduceTest, HalfInputsAndOutputs) {
  const Tensor x = Rand(DType::kF32, {64, 96}, 4).CastTo(DType::kBF16);
  auto plan = MakeReducePlan(x.dims(), {0});
  ASSERT_TRUE(plan.ok());
  // bf16 gradient into an fp32 bias gradient: exact widening, double sums.
  const Tensor want = CpuReduce(ReduceKind::kSum, x.CastTo(DType::kF32), {0});
  EXPECT_LT(MaxRelError(GpuReduce(ReduceKind::kSum, *plan, x, DType::kF32, {96}), want), 1e-6);
  for (DType out : {DType::kBF16, DType::kF16}) {
    const Tensor got = GpuReduce(ReduceKind::kMean, *plan, x, out, {96});
    EXPECT_LT(NormalisedError(got, CpuReduce(ReduceKind::kMean, x.CastTo(DType::kF32), {0})), 4e-3);
  }
}

TEST(ReducePlanTest, SplitColumnsCoverEveryRowOnce) {
  // (B, S, D) -> (D) bias gradients of the benchmark sizes and ragged ones.
  for (const auto& [rows, cols, elem] : std::vector<std::tuple<int64_t, int64_t, int>>{
           {8192, 1024, 2}, {8192, 4096, 2}, {8192, 1024, 4}, {100, 24, 4}, {63, 8, 2}, {2, 16, 2}, {70000, 8, 2}}) {
    auto plan = MakeReduceToShapePlan({rows, cols}, {cols});
    ASSERT_TRUE(plan.ok());
    const std::optional<ColumnSplit> cs = ColumnSplitOf(*plan, elem);
    ASSERT_TRUE(cs.has_value()) << rows << "x" << cols;
    EXPECT_EQ(cs->rows, rows);
    EXPECT_EQ(cs->cols, cols);
    EXPECT_GE(cs->splits * cs->rows_per_split, rows);
    EXPECT_LT((cs->splits - 1) * cs->rows_per_split, rows);  // no empty slice
    EXPECT_EQ(ReduceWorkspaceBytes(*plan, elem == 2 ? DType::kBF16 : DType::kF32), cs->splits * cols * 8);
  }
  // Not a whole number of 16-byte vectors per row, reduced innermost, or nothing to reduce: no split path.
  EXPECT_FALSE(ColumnSplitOf(*MakeReduceToShapePlan({64, 12}, {12}), 2).has_value());
  EXPECT_FALSE(ColumnSplitOf(*MakeReducePlan({64, 16}, {1}), 2).has_value());
  EXPECT_FALSE(ColumnSplitOf(*MakeReduceToShapePlan({0, 16}, {16}), 2).has_value());
  EXPECT_EQ(ReduceWorkspaceBytes(*MakeReducePlan({4, 6, 5, 7}, {1}), DType::kF32), 0);
}

TEST_F(ReduceTest, SplitColumnsMatchCpu) {
  for (const auto& [rows, cols] :
       std::vector<std::pair<int64_t, int64_t>>{{8192, 1024}, {4096, 4096}, {100, 24}, {63, 8}}) {
    const Tensor x32 = Rand(DType::kF32, {rows, cols}, static_cast<uint64_t>(rows + cols));
    auto plan = MakeReduceToShapePlan(x32.dims(), {cols});
    ASSERT_TRUE(plan.ok());
    const Tensor want = Eval1(MakeNode(OpKind::kReduceToShapeOf, 2), {x32, Tensor(DType::kF32, {cols})});
    EXPECT_LT(MaxRelError(GpuReduceSplit(ReduceKind::kSum, *plan, x32, DType::kF32, {cols}), want), 1e-6)
        << rows << "x" << cols;
    const Tensor x16 = x32.CastTo(DType::kBF16);
    const Tensor want16 =
        Eval1(MakeNode(OpKind::kReduceToShapeOf, 2), {x16.CastTo(DType::kF32), Tensor(DType::kF32, {cols})});
    EXPECT_LT(MaxRelError(GpuReduceSplit(ReduceKind::kSum, *plan, x16, DType::kF32, {cols}), want16), 1e-6);
    EXPECT_LT(NormalisedError(GpuReduceSplit(ReduceKind::kSum, *plan, x16, DType::kBF16, {cols}), want16), 4e-3);
  }
  // Mean through the split path divides by the rows.
  const Tensor x = Rand(DType::kF32, {256, 32}, 9);
  auto plan = MakeReducePlan(x.dims(), {0});
  ASSERT_TRUE(plan.ok());
  EXPECT_LT(
      MaxRelError(GpuReduceSplit(ReduceKind::kMean, *plan, x, DType::kF32, {32}), CpuReduce(ReduceKind::kMean, x, {0})),
      1e-6);
}

TEST_F(ReduceTest, BadArgumentsAreErrors) {
  auto plan = MakeReducePlan({4, 5}, {0});
  ASSERT_TRUE(plan.ok());
  DeviceTensor x(DType::kF32, {4, 5}), y(DType::kF32, {5});
  EXPECT_FALSE(Reduce(ReduceKind::kSum, *plan, DType::kI64, x.get(), DType::kF32, y.get(), nullptr).ok());
  EXPECT_FALSE(Reduce(ReduceKind::kSum, *plan, DType::kF32, nullptr, DType::kF32, y.get(), nullptr).ok());
  EXPECT_FALSE(Reduce(ReduceKind::kSum, *plan, DType::kF32, x.get(), DType::kF32, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace onnxpipe::cuda::testing
