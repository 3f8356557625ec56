// ReduceSum / ReduceMean / ReduceToShape on the GPU against the CPU backend's kernels (fp32
// within 1e-6 relative: both accumulate in double), 16-bit inputs and outputs, plans (host only,
// run without a GPU) and argument errors.
#include "executor/cuda/reduce.h"

#include <cstring>
#include <string>
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

TEST(ReducePlanTest, GeometryCoversTheReducedRangeOnce) {
  struct Case {
    std::vector<int64_t> in, like;
    int elem;
    bool rows;
  };
  const std::vector<Case> cases = {
      {{8192, 1024}, {1024}, 2, false},                        // bias gradient
      {{8, 4, 4, 1024, 128}, {8, 4, 1, 1024, 128}, 2, false},  // GQA repeat_kv gradient
      {{8192, 2048}, {8192, 1}, 4, true},                      // trailing axis
      {{1 << 22}, {1}, 4, true},                               // everything
      {{100, 24}, {24}, 4, false},
      {{63, 8}, {1, 8}, 2, false},
      {{6, 70, 5}, {1, 70, 1}, 4, false},  // short innermost runs
  };
  for (const Case& c : cases) {
    auto plan = MakeReduceToShapePlan(c.in, c.like);
    ASSERT_TRUE(plan.ok());
    for (bool split : {false, true}) {
      const ReduceGeometry g = GeometryOf(*plan, c.elem, split);
      EXPECT_EQ(g.rows, c.rows) << c.in.size();
      EXPECT_GE(g.splits * g.chunk, plan->num_reduced);
      EXPECT_LT((g.splits - 1) * g.chunk, plan->num_reduced);  // no empty slice
      EXPECT_GE(g.lanes, 1);
      EXPECT_EQ(kReduceBlock % (g.rows ? 32 * g.lanes : g.lanes), 0);
      if (!split) {
        EXPECT_EQ(g.splits, 1);
      }
    }
    const ReduceGeometry g = GeometryOf(*plan, c.elem, true);
    EXPECT_EQ(ReduceWorkspaceBytes(*plan, c.elem == 2 ? DType::kBF16 : DType::kF32),
              g.splits > 1 ? g.splits * plan->num_out * 8 : 0);
  }
  // The GQA gradient needs no split (enough outputs); the bias gradient and the full sum do.
  EXPECT_EQ(ReduceWorkspaceBytes(*MakeReduceToShapePlan({8, 4, 4, 1024, 128}, {8, 4, 1, 1024, 128}), DType::kBF16), 0);
  EXPECT_GT(ReduceWorkspaceBytes(*MakeReduceToShapePlan({8192, 1024}, {1024}), DType::kBF16), 0);
  EXPECT_GT(ReduceWorkspaceBytes(*MakeReduceToShapePlan({1 << 22}, {1}), DType::kF32), 0);
}

// Every path (columns with one or several reduced groups, rows, short runs, split or not; 16-byte
// and scalar loads) against the CPU's ReduceToShapeOf, in fp32 and bf16 (fp32 and bf16 outputs).
TEST_F(ReduceTest, ReduceToShapeOverAnyAxesMatchesCpu) {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> cases = {
      {{2, 2, 4, 64, 32}, {2, 2, 1, 64, 32}},  // GQA: a middle axis
      {{3, 5, 7, 9}, {3, 1, 7, 1}},            // short runs, kept middle
      {{4, 3, 8, 40}, {1, 3, 1, 40}},          // two reduced groups, innermost kept
      {{4, 3, 8, 40}, {4, 1, 8, 1}},           // two reduced groups, innermost reduced
      {{2048, 96}, {96}},                      // bias gradient (splits)
      {{2048, 6}, {6}},                        // narrow bias gradient (scalar loads)
      {{96, 2048}, {96, 1}},                   // trailing axis
      {{37, 1000}, {37, 1}},                   // trailing axis, ragged run
      {{300000}, {1}},                         // everything (splits over one run)
      {{5, 6, 7}, {}},                         // to a scalar
  };
  for (const auto& [in, like] : cases) {
    const Tensor x32 = Rand(DType::kF32, in, static_cast<uint64_t>(in.size() * 131 + in.back()));
    auto plan = MakeReduceToShapePlan(in, like);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const Tensor want = Eval1(MakeNode(OpKind::kReduceToShapeOf, 2), {x32, Tensor(DType::kF32, like)});
    const Tensor x16 = x32.CastTo(DType::kBF16);
    const Tensor want16 =
        Eval1(MakeNode(OpKind::kReduceToShapeOf, 2), {x16.CastTo(DType::kF32), Tensor(DType::kF32, like)});
    const int64_t bytes = ReduceWorkspaceBytes(*plan, DType::kF32);
    for (bool split : {false, true}) {
      if (split && bytes == 0) continue;
      DeviceTensor dx(x32), dy(DType::kF32, like), ws(DType::kU8, {split ? bytes : 1});
      ASSERT_TRUE(Reduce(ReduceKind::kSum, *plan, DType::kF32, dx.get(), DType::kF32, dy.get(), nullptr, ws.get(),
                         split ? bytes : 0)
                      .ok());
      EXPECT_LT(MaxRelError(dy.ToHost(), want, 1e-3), 1e-6) << in.size() << " split " << split;
      // bf16 in: fp32 out exact to the double sum, bf16 out within its rounding.
      const int64_t bytes16 = ReduceWorkspaceBytes(*plan, DType::kBF16);
      DeviceTensor dx16(x16), dy32(DType::kF32, like), dy16(DType::kBF16, like), ws16(DType::kU8, {bytes16 + 1});
      const int64_t give = split ? bytes16 : 0;
      ASSERT_TRUE(
          Reduce(ReduceKind::kSum, *plan, DType::kBF16, dx16.get(), DType::kF32, dy32.get(), nullptr, ws16.get(), give)
              .ok());
      ASSERT_TRUE(
          Reduce(ReduceKind::kSum, *plan, DType::kBF16, dx16.get(), DType::kBF16, dy16.get(), nullptr, ws16.get(), give)
              .ok());
      EXPECT_LT(MaxRelError(dy32.ToHost(), want16, 1e-3), 1e-6) << in.size() << " bf16 split " << split;
      EXPECT_LT(NormalisedError(dy16.ToHost(), want16), 4e-3) << in.size() << " bf16 split " << split;
    }
  }
}

TEST_F(ReduceTest, ResultsAreBitwiseRepeatable) {
  const Tensor x = Rand(DType::kF32, {4096, 512}, 21);
  for (const std::vector<int64_t>& like : std::vector<std::vector<int64_t>>{{512}, {4096, 1}, {}}) {
    auto plan = MakeReduceToShapePlan(x.dims(), like);
    ASSERT_TRUE(plan.ok());
    const int64_t bytes = ReduceWorkspaceBytes(*plan, DType::kF32);
    DeviceTensor dx(x), ws(DType::kU8, {bytes + 1});
    std::vector<Tensor> runs;
    for (int i = 0; i < 3; ++i) {
      DeviceTensor dy(DType::kF32, like);
      ASSERT_TRUE(
          Reduce(ReduceKind::kSum, *plan, DType::kF32, dx.get(), DType::kF32, dy.get(), nullptr, ws.get(), bytes).ok());
      runs.push_back(dy.ToHost());
    }
    for (int i = 1; i < 3; ++i) {
      ASSERT_EQ(runs[i].num_elements(), runs[0].num_elements());
      EXPECT_EQ(std::memcmp(runs[i].raw(), runs[0].raw(), runs[0].num_elements() * 4), 0) << like.size();
    }
  }
}

TEST_F(ReduceTest, SplitMeanDividesByTheReducedCount) {
  const Tensor x = Rand(DType::kF32, {4096, 32}, 9);
  auto plan = MakeReducePlan(x.dims(), {0});
  ASSERT_TRUE(plan.ok());
  const int64_t bytes = ReduceWorkspaceBytes(*plan, DType::kF32);
  ASSERT_GT(bytes, 0);
  DeviceTensor dx(x), dy(DType::kF32, {32}), ws(DType::kU8, {bytes});
  ASSERT_TRUE(
      Reduce(ReduceKind::kMean, *plan, DType::kF32, dx.get(), DType::kF32, dy.get(), nullptr, ws.get(), bytes).ok());
  EXPECT_LT(MaxRelError(dy.ToHost(), CpuReduce(ReduceKind::kMean, x, {0}), 1e-3), 1e-6);
}

// CumSum along the first, a middle and the last axis, every exclusive/reverse combination, against
// the CPU backend's kernel: fp32 (double sums on both sides), bf16 (each output rounded once) and
// int64 (exact; RoBERTa's position ids are a cumulative sum of the attention mask).
TEST_F(ReduceTest, CumSumMatchesCpu) {
  const std::vector<int64_t> dims = {3, 37, 5};
  for (DType t : {DType::kF32, DType::kBF16, DType::kI64}) {
    const Tensor f = Rand(DType::kF32, dims, 31);
    Tensor x = t == DType::kI64 ? Tensor(DType::kI64, dims) : f.CastTo(t);
    if (t == DType::kI64) {
      for (int64_t i = 0; i < x.num_elements(); ++i) x.mutable_data<int64_t>()[i] = (i * 7919) % 13 - 6;
    }
    for (int64_t axis : {0, 1, -1}) {
      for (int64_t exclusive : {0, 1}) {
        for (int64_t reverse : {0, 1}) {
          ir::Attrs a;
          a.Set("axis", axis);
          a.Set("exclusive", exclusive);
          a.Set("reverse", reverse);
          const Tensor want = Eval1(MakeNode(OpKind::kCumSum, 1, 1, a), {x});
          const int64_t ax = axis < 0 ? axis + 3 : axis;
          int64_t outer = 1, inner = 1;
          for (int64_t d = 0; d < ax; ++d) outer *= dims[d];
          for (int64_t d = ax + 1; d < 3; ++d) inner *= dims[d];
          DeviceTensor dx(x), dy(t, dims);
          ASSERT_TRUE(
              CumSum(t, dx.get(), dy.get(), outer, dims[ax], inner, exclusive != 0, reverse != 0, nullptr).ok());
          const Tensor got = dy.ToHost();
          const std::string what = std::string(ir::DTypeName(t)) + " axis " + std::to_string(axis) + " exclusive " +
                                   std::to_string(exclusive) + " reverse " + std::to_string(reverse);
          if (t == DType::kI64) {
            EXPECT_EQ(std::memcmp(got.raw(), want.raw(), got.num_bytes()), 0) << what;
          } else if (t == DType::kF32) {
            EXPECT_LT(MaxRelError(got, want, 1e-3), 1e-6) << what;
          } else {
            EXPECT_LT(NormalisedError(got, want), 4e-3) << what;
          }
        }
      }
    }
  }
  DeviceTensor x(DType::kF32, {4}), y(DType::kF32, {4});
  EXPECT_FALSE(CumSum(DType::kU8, x.get(), y.get(), 1, 4, 1, false, false, nullptr).ok());
  EXPECT_FALSE(CumSum(DType::kF32, nullptr, y.get(), 1, 4, 1, false, false, nullptr).ok());
}

// Integer ReduceSum (a mask's token count, ModernBERT's mean pooling): i64 and i32 over leading, middle,
// trailing and all axes, equal to the CPU backend's sums, with values far beyond float's exact range.
TEST_F(ReduceTest, IntegerSumsEqualCpu) {
  const std::vector<int64_t> dims = {3, 37, 5};
  for (DType t : {DType::kI64, DType::kI32}) {
    Tensor x64(DType::kI64, dims);
    for (int64_t i = 0; i < x64.num_elements(); ++i) x64.mutable_data<int64_t>()[i] = (i * 7919) % 13 - 6;
    for (int64_t i : {5, 10, 15}) x64.mutable_data<int64_t>()[i] = (int64_t{1} << 60) + i;  // not exact in double
    const Tensor x = t == DType::kI64 ? x64 : x64.CastTo(DType::kI32);
    for (const std::vector<int64_t>& axes : std::vector<std::vector<int64_t>>{{0}, {1}, {2}, {0, 2}, {}}) {
      auto plan = MakeReducePlan(x.dims(), axes);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const Tensor want = CpuReduce(ReduceKind::kSum, x, axes);
      const Tensor got = GpuReduce(ReduceKind::kSum, *plan, x, t, want.dims());
      ASSERT_EQ(got.dtype(), want.dtype());
      EXPECT_EQ(std::memcmp(got.raw(), want.raw(), got.num_bytes()), 0)
          << ir::DTypeName(t) << " over " << axes.size() << " axes";
    }
  }
}

TEST_F(ReduceTest, BadArgumentsAreErrors) {
  auto plan = MakeReducePlan({4, 5}, {0});
  ASSERT_TRUE(plan.ok());
  DeviceTensor x(DType::kF32, {4, 5}), y(DType::kF32, {5});
  EXPECT_FALSE(Reduce(ReduceKind::kSum, *plan, DType::kI64, x.get(), DType::kF32, y.get(), nullptr).ok());
  EXPECT_FALSE(Reduce(ReduceKind::kMean, *plan, DType::kI64, x.get(), DType::kI64, y.get(), nullptr).ok());
  EXPECT_FALSE(Reduce(ReduceKind::kSum, *plan, DType::kF32, nullptr, DType::kF32, y.get(), nullptr).ok());
  EXPECT_FALSE(Reduce(ReduceKind::kSum, *plan, DType::kF32, x.get(), DType::kF32, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace onnxpipe::cuda::testing
