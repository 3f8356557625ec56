// Gather, GatherElements, GatherND and their gradients on the GPU against the CPU backend's kernels: bitwise for fp32
// (the CPU also sums each row's contributions in index order), repeated and negative indices, a non-zero axis, i32
// indices, bf16, accumulation, determinism, out-of-range indices and argument errors.
#include "executor/cuda/embedding.h"

#include <cstring>
#include <string>

#include "executor/cuda/gather_elements.h"
#include "tests/cpu/test_util.h"
#include "tests/cuda/device_tensor.h"

namespace onnxpipe::cuda::testing {
namespace {

using cpu::testing::Eval1;
using cpu::testing::MakeNode;
using cpu::testing::Rand;
using cpu::testing::RandInt;
using ir::DType;
using ir::OpKind;
using ir::Tensor;

class EmbeddingTest : public CudaTest {};

std::vector<int64_t> GatherDims(const std::vector<int64_t>& data, int64_t axis, const std::vector<int64_t>& idx) {
  std::vector<int64_t> dims(data.begin(), data.begin() + axis);
  dims.insert(dims.end(), idx.begin(), idx.end());
  dims.insert(dims.end(), data.begin() + axis + 1, data.end());
  return dims;
}

Tensor GpuGather(const Tensor& data, const Tensor& idx, int64_t axis) {
  auto s = MakeGatherShape(data.dims(), axis, idx.num_elements());
  EXPECT_TRUE(s.ok()) << s.status();
  DeviceTensor dd(data), di(idx), out(data.dtype(), GatherDims(data.dims(), axis, idx.dims()));
  const absl::Status st = Gather(*s, data.dtype(), dd.get(), idx.dtype(), di.get(), out.get(), nullptr, nullptr);
  EXPECT_TRUE(st.ok()) << st;
  return out.ToHost();
}

// GatherGrad into a table of `table_dims` and `out_dtype`, starting from `init` when given.
Tensor GpuGatherGrad(const Tensor& dy, const Tensor& idx, const std::vector<int64_t>& table_dims, int64_t axis,
                     DType out_dtype, const Tensor* init = nullptr, uint32_t* bad = nullptr) {
  auto s = MakeGatherShape(table_dims, axis, idx.num_elements());
  EXPECT_TRUE(s.ok()) << s.status();
  DeviceTensor ddy(dy), di(idx), table(out_dtype, table_dims), flag(DType::kI32, {1});
  if (init != nullptr) {
    EXPECT_EQ(cudaMemcpy(table.get(), init->raw(), init->num_bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  const size_t ws_bytes = GatherGradWorkspaceBytes(*s);
  DeviceTensor ws(DType::kU8, {static_cast<int64_t>(ws_bytes)});
  const absl::Status st = GatherGrad(*s, dy.dtype(), ddy.get(), idx.dtype(), di.get(), out_dtype, table.get(),
                                     init != nullptr, ws.get(), ws_bytes, flag.as<uint32_t>(), nullptr);
  EXPECT_TRUE(st.ok()) << st;
  if (bad != nullptr) *bad = static_cast<uint32_t>(flag.ToHost().GetAsInt(0));
  return table.ToHost();
}

Tensor CpuGatherGrad(const Tensor& dy, const Tensor& idx, const std::vector<int64_t>& table_dims, int64_t axis) {
  ir::Attrs a;
  a.Set("axis", axis);
  return Eval1(MakeNode(OpKind::kGatherGrad, 3, 1, a), {dy, idx, Tensor(dy.dtype(), table_dims)});
}

TEST_F(EmbeddingTest, GatherMatchesCpu) {
  const Tensor table = Rand(DType::kF32, {50, 37}, 1);
  Tensor idx = RandInt(DType::kI64, {3, 11}, 2, -50, 49);  // negative indices wrap
  ir::Attrs a0;
  a0.Set("axis", int64_t{0});
  EXPECT_TRUE(GpuGather(table, idx, 0).BitwiseEquals(Eval1(MakeNode(OpKind::kGather, 2, 1, a0), {table, idx})));
  // Axis 1 of a rank-3 tensor, i32 indices, and 16-bit data (copied bit for bit).
  const Tensor data = Rand(DType::kF32, {4, 9, 5}, 3);
  const Tensor idx32 = RandInt(DType::kI32, {6}, 4, -9, 8);
  ir::Attrs a1;
  a1.Set("axis", int64_t{1});
  const Tensor want = Eval1(MakeNode(OpKind::kGather, 2, 1, a1), {data, idx32});
  EXPECT_TRUE(GpuGather(data, idx32, 1).BitwiseEquals(want));
  EXPECT_TRUE(GpuGather(data.CastTo(DType::kBF16), idx32, 1).BitwiseEquals(want.CastTo(DType::kBF16)));
}

TEST_F(EmbeddingTest, GatherGradWithRepeatedIndicesEqualsCpuBitwise) {
  // Few distinct rows (many repeats, many untouched rows), negative indices.
  const Tensor idx = RandInt(DType::kI64, {4, 64}, 5, -6, 5);
  const Tensor dy = Rand(DType::kF32, {4, 64, 48}, 6);
  const Tensor want = CpuGatherGrad(dy, idx, {50, 48}, 0);
  const Tensor got = GpuGatherGrad(dy, idx, {50, 48}, 0, DType::kF32);
  EXPECT_TRUE(got.BitwiseEquals(want)) << "max rel " << MaxRelError(got, want);
  // Deterministic: the same bits again.
  EXPECT_TRUE(GpuGatherGrad(dy, idx, {50, 48}, 0, DType::kF32).BitwiseEquals(got));
  // A vocabulary-sized table with a batch of tokens (i32 indices), more columns than one block.
  const Tensor big_idx = RandInt(DType::kI32, {20000}, 7, 0, 999);
  const Tensor big_dy = Rand(DType::kF32, {20000, 300}, 8);
  EXPECT_TRUE(GpuGatherGrad(big_dy, big_idx, {1000, 300}, 0, DType::kF32)
                  .BitwiseEquals(CpuGatherGrad(big_dy, big_idx, {1000, 300}, 0)));
}

TEST_F(EmbeddingTest, GatherGradAlongAMiddleAxisEqualsCpu) {
  const Tensor idx = RandInt(DType::kI64, {2, 5}, 9, -7, 6);
  const Tensor dy = Rand(DType::kF32, {3, 2, 5, 4}, 10);
  EXPECT_TRUE(GpuGatherGrad(dy, idx, {3, 7, 4}, 1, DType::kF32).BitwiseEquals(CpuGatherGrad(dy, idx, {3, 7, 4}, 1)));
}

// More columns than one launch's grid rows cover (outer x inner > 65535 x 256): the blocks stride over
// the rest. Two rows of 2^24 + 5 columns, and a wide outer with one column per row.
TEST_F(EmbeddingTest, GatherGradBeyondTheGridLimitEqualsCpu) {
  const int64_t wide = (int64_t{1} << 24) + 5;
  const Tensor idx = cpu::testing::I64Vec({1, 0, 1});
  const Tensor dy = Rand(DType::kF32, {3, wide}, 16);
  EXPECT_TRUE(GpuGatherGrad(dy, idx, {2, wide}, 0, DType::kF32).BitwiseEquals(CpuGatherGrad(dy, idx, {2, wide}, 0)));
  const Tensor dy_outer = Rand(DType::kF32, {int64_t{1} << 17, 3, 129}, 17);
  EXPECT_TRUE(GpuGatherGrad(dy_outer, idx, {int64_t{1} << 17, 2, 129}, 1, DType::kF32)
                  .BitwiseEquals(CpuGatherGrad(dy_outer, idx, {int64_t{1} << 17, 2, 129}, 1)));
}

TEST_F(EmbeddingTest, Bf16GradientIntoFp32TableAndAccumulate) {
  const Tensor idx = RandInt(DType::kI64, {300}, 11, 0, 20);
  const Tensor dy = Rand(DType::kF32, {300, 40}, 12).CastTo(DType::kBF16);
  const Tensor want = CpuGatherGrad(dy.CastTo(DType::kF32), idx, {21, 40}, 0);
  EXPECT_TRUE(GpuGatherGrad(dy, idx, {21, 40}, 0, DType::kF32).BitwiseEquals(want));
  // bf16 table gradient: the fp32 sums rounded once.
  EXPECT_TRUE(GpuGatherGrad(dy, idx, {21, 40}, 0, DType::kBF16).BitwiseEquals(want.CastTo(DType::kBF16)));
  // accumulate: the existing gradient plus the scatter-add, as Sum(old, GatherGrad) on the CPU.
  const Tensor old = Rand(DType::kF32, {21, 40}, 13);
  EXPECT_TRUE(GpuGatherGrad(dy, idx, {21, 40}, 0, DType::kF32, &old)
                  .BitwiseEquals(Eval1(MakeNode(OpKind::kAdd, 2), {old, want})));
}

TEST_F(EmbeddingTest, OutOfRangeIndicesAreFlaggedAndSkipped) {
  const Tensor table = Rand(DType::kF32, {10, 3}, 14);
  const Tensor idx = cpu::testing::I64Vec({1, 10, -11, 2});
  auto s = MakeGatherShape(table.dims(), 0, 4);
  ASSERT_TRUE(s.ok());
  DeviceTensor dt(table), di(idx), out(DType::kF32, {4, 3}), flag(DType::kI32, {1});
  ASSERT_TRUE(Gather(*s, DType::kF32, dt.get(), DType::kI64, di.get(), out.get(), flag.as<uint32_t>(), nullptr).ok());
  EXPECT_EQ(flag.ToHost().GetAsInt(0), 1);
  const Tensor got = out.ToHost();
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(got.data<float>()[c], table.data<float>()[3 + c]);
    EXPECT_EQ(got.data<float>()[3 + c], 0.f);
    EXPECT_EQ(got.data<float>()[6 + c], 0.f);
  }
  uint32_t bad = 0;
  const Tensor grad = GpuGatherGrad(Rand(DType::kF32, {4, 3}, 15), idx, {10, 3}, 0, DType::kF32, nullptr, &bad);
  EXPECT_EQ(bad, 1u);
  for (int64_t i = 0; i < grad.num_elements(); ++i) {
    const int64_t row = i / 3;
    if (row != 1 && row != 2) {
      EXPECT_EQ(grad.data<float>()[i], 0.f) << i;
    }
  }
}

TEST_F(EmbeddingTest, BadArgumentsAreErrors) {
  EXPECT_FALSE(MakeGatherShape({}, 0, 3).ok());
  EXPECT_FALSE(MakeGatherShape({4, 5}, 2, 3).ok());
  auto s = MakeGatherShape({10, 4}, 0, 6);
  ASSERT_TRUE(s.ok());
  DeviceTensor a(DType::kF32, {10, 4}), i(DType::kI64, {6}), o(DType::kF32, {6, 4});
  EXPECT_FALSE(Gather(*s, DType::kF32, a.get(), DType::kF32, i.get(), o.get(), nullptr, nullptr).ok());
  EXPECT_FALSE(Gather(*s, DType::kF32, nullptr, DType::kI64, i.get(), o.get(), nullptr, nullptr).ok());
  const size_t need = GatherGradWorkspaceBytes(*s);
  DeviceTensor ws(DType::kU8, {static_cast<int64_t>(need)});
  EXPECT_FALSE(GatherGrad(*s, DType::kF32, o.get(), DType::kI64, i.get(), DType::kF32, a.get(), false, ws.get(),
                          need - 1, nullptr, nullptr)
                   .ok());
  EXPECT_FALSE(GatherGrad(*s, DType::kI64, o.get(), DType::kI64, i.get(), DType::kF32, a.get(), false, ws.get(), need,
                          nullptr, nullptr)
                   .ok());
}

// GatherElements and its gradient along each axis, with repeated and negative indices (i64 and i32),
// indices smaller than data off the axis: the forward moves raw elements (f32 and i64 data, bitwise),
// the fp32 gradient adds in the CPU's order (bitwise), bf16 within its rounding.
TEST_F(EmbeddingTest, GatherElementsAndGradMatchCpu) {
  const std::vector<int64_t> data_dims = {4, 6, 5};
  for (int64_t axis : {0, 1, -1}) {
    const int64_t ax = axis < 0 ? axis + 3 : axis;
    std::vector<int64_t> idx_dims = {3, 5, 4};
    idx_dims[ax] = 9;  // more indices than data along the axis: repeats
    for (DType it : {DType::kI64, DType::kI32}) {
      const Tensor idx = RandInt(it, idx_dims, static_cast<uint32_t>(ax * 7 + 1), -data_dims[ax], data_dims[ax] - 1);
      ir::Attrs a;
      a.Set("axis", axis);
      const std::string what = "axis " + std::to_string(axis) + " " + std::string(ir::DTypeName(it));
      auto s = MakeGatherElementsShape(data_dims, idx_dims, axis);
      ASSERT_TRUE(s.ok()) << s.status();
      for (DType dt : {DType::kF32, DType::kI64}) {
        const Tensor data =
            dt == DType::kF32 ? Rand(DType::kF32, data_dims, 5) : RandInt(DType::kI64, data_dims, 6, -1000, 1000);
        const Tensor want = Eval1(MakeNode(OpKind::kGatherElements, 2, 1, a), {data, idx});
        DeviceTensor dd(data), di(idx), out(dt, idx_dims), flag(DType::kI32, {1});
        ASSERT_TRUE(GatherElements(*s, dt, dd.get(), it, di.get(), out.get(), flag.as<uint32_t>(), nullptr).ok());
        const Tensor got = out.ToHost();
        EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.num_bytes()), 0) << what;
        EXPECT_EQ(flag.ToHost().data<int32_t>()[0], 0) << what;
      }
      const Tensor dy = Rand(DType::kF32, idx_dims, 8);
      for (DType gt : {DType::kF32, DType::kBF16}) {
        const Tensor g = dy.CastTo(gt);
        const Tensor want = Eval1(MakeNode(OpKind::kGatherElementsGrad, 3, 1, a), {g, idx, Tensor(gt, data_dims)});
        DeviceTensor dg(g), di(idx), dx(gt, data_dims), flag(DType::kI32, {1});
        ASSERT_TRUE(GatherElementsGrad(*s, gt, dg.get(), it, di.get(), dx.get(), flag.as<uint32_t>(), nullptr).ok());
        const Tensor got = dx.ToHost();
        if (gt == DType::kF32) {
          EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.num_bytes()), 0) << what;
        } else {
          EXPECT_LT(NormalisedError(got, want), 1e-2) << what;
        }
      }
    }
  }
}

TEST_F(EmbeddingTest, GatherElementsFlagsOutOfRangeIndices) {
  const Tensor data = Rand(DType::kF32, {2, 3}, 1);
  const Tensor idx = Tensor::FromVector<int64_t>({2, 2}, {0, 3, -4, 1});  // 3 and -4 are outside [-3, 3)
  auto s = MakeGatherElementsShape({2, 3}, {2, 2}, 1);
  ASSERT_TRUE(s.ok());
  DeviceTensor dd(data), di(idx), out(DType::kF32, {2, 2}), flag(DType::kI32, {1});
  ASSERT_TRUE(
      GatherElements(*s, DType::kF32, dd.get(), DType::kI64, di.get(), out.get(), flag.as<uint32_t>(), nullptr).ok());
  EXPECT_EQ(flag.ToHost().data<int32_t>()[0], 1);
  DeviceTensor dx(DType::kF32, {2, 3}), flag2(DType::kI32, {1});
  ASSERT_TRUE(
      GatherElementsGrad(*s, DType::kF32, out.get(), DType::kI64, di.get(), dx.get(), flag2.as<uint32_t>(), nullptr)
          .ok());
  EXPECT_EQ(flag2.ToHost().data<int32_t>()[0], 1);
  EXPECT_FALSE(MakeGatherElementsShape({2, 3}, {3, 3}, 1).ok());  // indices larger than data off the axis
  EXPECT_FALSE(MakeGatherElementsShape({2, 3}, {2}, 0).ok());
  EXPECT_FALSE(
      GatherElements(*s, DType::kF32, dd.get(), DType::kF32, di.get(), out.get(), flag.as<uint32_t>(), nullptr).ok());
}

// GatherND and its gradient with batch_dims 0 and 1, whole-row and single-element tuples, repeated and
// negative indices: the forward bitwise, the fp32 gradient bitwise (the CPU's order), bf16 within rounding.
TEST_F(EmbeddingTest, GatherNDAndGradMatchCpu) {
  struct Case {
    std::vector<int64_t> data, idx;
    int64_t batch_dims;
  };
  const std::vector<Case> cases = {
      {{4, 6, 5}, {7, 1}, 0},     // rows of (6, 5)
      {{4, 6, 5}, {3, 4, 2}, 0},  // rows of 5
      {{4, 6, 5}, {9, 3}, 0},     // elements
      {{4, 6, 5}, {4, 8, 1}, 1},  // per batch: rows of 5
      {{4, 6, 5}, {4, 3, 2}, 1},  // per batch: elements
  };
  uint32_t seed = 40;
  for (const Case& c : cases) {
    const int64_t k = c.idx.back();
    Tensor idx(DType::kI64, c.idx);
    std::vector<int64_t> ext(c.data.begin() + c.batch_dims, c.data.begin() + c.batch_dims + k);
    const Tensor r = RandInt(DType::kI64, c.idx, seed++, 0, 1 << 20);
    for (int64_t i = 0; i < idx.num_elements(); ++i) {
      const int64_t n = ext[i % k];
      idx.mutable_data<int64_t>()[i] = r.data<int64_t>()[i] % (2 * n) - n;  // in [-n, n)
    }
    ir::Attrs a;
    a.Set("batch_dims", c.batch_dims);
    const std::string what = std::to_string(c.idx.size()) + "-d indices, k " + std::to_string(k) + ", batch_dims " +
                             std::to_string(c.batch_dims);
    std::vector<int64_t> out_dims;
    auto s = MakeGatherNDShape(c.data, c.idx, c.batch_dims, &out_dims);
    ASSERT_TRUE(s.ok()) << s.status();
    for (DType it : {DType::kI64, DType::kI32}) {
      const Tensor ix = idx.CastTo(it);
      const Tensor data = Rand(DType::kF32, c.data, seed++);
      const Tensor want = Eval1(MakeNode(OpKind::kGatherND, 2, 1, a), {data, ix});
      ASSERT_EQ(want.dims(), out_dims) << what;
      DeviceTensor dd(data), di(ix), out(DType::kF32, out_dims), flag(DType::kI32, {1});
      ASSERT_TRUE(GatherND(*s, DType::kF32, dd.get(), it, di.get(), out.get(), flag.as<uint32_t>(), nullptr).ok());
      const Tensor got = out.ToHost();
      EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.num_bytes()), 0) << what;
      EXPECT_EQ(flag.ToHost().data<int32_t>()[0], 0) << what;
      for (DType gt : {DType::kF32, DType::kBF16}) {
        const Tensor g = Rand(DType::kF32, out_dims, seed++).CastTo(gt);
        const Tensor want_dx = Eval1(MakeNode(OpKind::kGatherNDGrad, 3, 1, a), {g, ix, Tensor(gt, c.data)});
        DeviceTensor dg(g), dx(gt, c.data);
        ASSERT_TRUE(
            GatherNDGrad(*s, want_dx.num_elements(), gt, dg.get(), it, di.get(), dx.get(), flag.as<uint32_t>(), nullptr)
                .ok());
        const Tensor got_dx = dx.ToHost();
        if (gt == DType::kF32) {
          EXPECT_EQ(std::memcmp(got_dx.raw(), want_dx.raw(), want_dx.num_bytes()), 0) << what;
        } else {
          EXPECT_LT(NormalisedError(got_dx, want_dx), 1e-2) << what;
        }
      }
    }
  }
  // Out of range: flagged; shapes that do not fit: errors.
  const Tensor data = Rand(DType::kF32, {2, 3}, 3);
  const Tensor bad = Tensor::FromVector<int64_t>({2, 2}, {0, 1, 2, 0});  // 2 is outside [-2, 2) on axis 0
  std::vector<int64_t> od;
  auto s = MakeGatherNDShape({2, 3}, {2, 2}, 0, &od);
  ASSERT_TRUE(s.ok());
  DeviceTensor dd(data), di(bad), out(DType::kF32, od), flag(DType::kI32, {1});
  ASSERT_TRUE(GatherND(*s, DType::kF32, dd.get(), DType::kI64, di.get(), out.get(), flag.as<uint32_t>(), nullptr).ok());
  EXPECT_EQ(flag.ToHost().data<int32_t>()[0], 1);
  EXPECT_FALSE(MakeGatherNDShape({2, 3}, {2, 3}, 0, nullptr).ok());  // tuples longer than data's rank
  EXPECT_FALSE(MakeGatherNDShape({2, 3}, {3, 1}, 1, nullptr).ok());  // batch dims differ
}

}  // namespace
}  // namespace onnxpipe::cuda::testing
