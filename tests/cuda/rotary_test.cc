// Rotary and RotaryGrad on the GPU (rotary.h) against the CPU backend's kernels on the same inputs:
// fp32 within a normalised error of 1e-6 (the GPU may fuse a product into the sum), bf16 against the
// CPU's fp32 result on the widened inputs rounded once to bf16 (within one rounding). Shapes cover
// both forms, full and partial rotary, Llama's (B, 1, S, R) and GPT-J's (B, S, 1, R) tables, tables
// without broadcast, the 16-byte path and the element path (odd widths, a misaligned pointer); and
// the backend's kernel table runs both ops on the device. Skips without a GPU.
#include "executor/cuda/rotary.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "executor/cuda/cuda_backend.h"
#include "executor/cuda/cuda_kernels.h"
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

class RotaryTest : public CudaTest {};

struct Shape {
  std::vector<int64_t> x, table;
  bool interleaved;
};

// Llama (full, rotate-half), GPT-NeoX (partial), GPT-J (interleaved, partial, (B, S, H, D)),
// tables per head, and widths off the 16-byte path.
const std::vector<Shape>& Shapes() {
  static const std::vector<Shape> kShapes = {
      {{2, 4, 7, 64}, {2, 1, 7, 64}, false},
      {{2, 4, 7, 64}, {2, 1, 7, 16}, false},
      {{2, 7, 4, 64}, {2, 7, 1, 32}, true},
      {{2, 3, 5, 32}, {2, 3, 5, 32}, true},
      {{3, 5, 6}, {5, 6}, false},
      {{3, 5, 10}, {1, 5, 6}, true},
      {{2, 3, 5, 12}, {5, 4}, false},
      {{1, 2, 9, 128}, {1, 1, 9, 128}, true},
  };
  return kShapes;
}

ir::Node Node(OpKind op, int64_t rotary_dim, bool interleaved) {
  ir::Attrs a;
  a.Set("rotary_dim", rotary_dim);
  a.Set("interleaved", int64_t{interleaved ? 1 : 0});
  return MakeNode(op, 3, 1, a);
}

// The GPU's result of `op` on (x, cos, sin) in x's dtype; `offset` elements into its buffers (a
// misaligned start when 1).
Tensor OnDevice(OpKind op, const Shape& s, const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t offset) {
  absl::StatusOr<RotaryDims> dims = MakeRotaryDims(s.x, s.table, s.table.back(), s.interleaved);
  EXPECT_TRUE(dims.ok()) << dims.status();
  auto padded = [&](const Tensor& t) {  // t's data `offset` elements into a larger buffer
    Tensor p(t.dtype(), {t.num_elements() + offset});
    std::memcpy(static_cast<char*>(p.raw()) + offset * ir::DTypeSize(t.dtype()), t.raw(), t.num_bytes());
    return p;
  };
  DeviceTensor dx(padded(x)), dc(padded(cos)), ds(padded(sin)), dy(x.dtype(), {x.num_elements() + offset});
  const bool transpose = op == OpKind::kRotaryGrad;
  absl::Status st;
  if (x.dtype() == DType::kF32) {
    st = Rotary(*dims, transpose, dx.as<float>() + offset, dc.as<float>() + offset, ds.as<float>() + offset,
                dy.as<float>() + offset, nullptr);
  } else {
    st = Rotary(*dims, transpose, dx.as<__nv_bfloat16>() + offset, dc.as<__nv_bfloat16>() + offset,
                ds.as<__nv_bfloat16>() + offset, dy.as<__nv_bfloat16>() + offset, nullptr);
  }
  EXPECT_TRUE(st.ok()) << st;
  const Tensor all = dy.ToHost();
  Tensor y(x.dtype(), x.dims());
  std::memcpy(y.raw(), static_cast<const char*>(all.raw()) + offset * ir::DTypeSize(x.dtype()), y.num_bytes());
  return y;
}

TEST_F(RotaryTest, Fp32MatchesTheCpu) {
  uint32_t seed = 1;
  for (const Shape& s : Shapes()) {
    const Tensor x = Rand(DType::kF32, s.x, seed++), cos = Rand(DType::kF32, s.table, seed++),
                 sin = Rand(DType::kF32, s.table, seed++);
    for (OpKind op : {OpKind::kRotary, OpKind::kRotaryGrad}) {
      const Tensor want = Eval1(Node(op, s.table.back(), s.interleaved), {x, cos, sin});
      for (int64_t offset : {0, 1}) {
        const Tensor got = OnDevice(op, s, x, cos, sin, offset);
        EXPECT_LT(NormalisedError(got, want), 1e-6)
            << ir::OpName(op) << " x " << s.x.size() << "-d, last " << s.x.back() << ", R " << s.table.back()
            << (s.interleaved ? " interleaved" : "") << ", offset " << offset;
      }
    }
  }
}

TEST_F(RotaryTest, Bf16IsTheFp32ResultRoundedOnce) {
  uint32_t seed = 100;
  for (const Shape& s : Shapes()) {
    const Tensor x = Rand(DType::kF32, s.x, seed++).CastTo(DType::kBF16),
                 cos = Rand(DType::kF32, s.table, seed++).CastTo(DType::kBF16),
                 sin = Rand(DType::kF32, s.table, seed++).CastTo(DType::kBF16);
    for (OpKind op : {OpKind::kRotary, OpKind::kRotaryGrad}) {
      const Tensor want = Eval1(Node(op, s.table.back(), s.interleaved),
                                {x.CastTo(DType::kF32), cos.CastTo(DType::kF32), sin.CastTo(DType::kF32)});
      for (int64_t offset : {0, 1}) {
        const Tensor got = OnDevice(op, s, x, cos, sin, offset);
        ASSERT_EQ(got.dtype(), DType::kBF16);
        EXPECT_LT(NormalisedError(got.CastTo(DType::kF32), want), 4e-3)
            << ir::OpName(op) << " R " << s.table.back() << ", offset " << offset;
      }
    }
  }
}

// Host-only: runs without a GPU.
TEST(RotaryGeometryTest, MergesLeadingDimsAndRefusesMisfits) {
  // (B, H, S) against (B, 1, S): B and S keep their strides, H broadcasts.
  absl::StatusOr<RotaryDims> d = MakeRotaryDims({2, 4, 7, 64}, {2, 1, 7, 64}, 64, false);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->rows, 56);
  ASSERT_EQ(d->lead_rank, 3);
  EXPECT_EQ((std::vector<int64_t>(d->table_strides, d->table_strides + 3)), (std::vector<int64_t>{7, 0, 1}));
  // Tables per row: one merged dim.
  d = MakeRotaryDims({2, 3, 5, 32}, {2, 3, 5, 32}, 32, true);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->lead_rank, 1);
  EXPECT_FALSE(MakeRotaryDims({2, 8}, {2, 6}, 4, false).ok());
  EXPECT_FALSE(MakeRotaryDims({2, 8}, {3, 4}, 4, false).ok());
  EXPECT_FALSE(MakeRotaryDims({2, 8}, {5}, 5, false).ok());
}

TEST_F(RotaryTest, KernelTableRunsBothOpsOnTheDevice) {
  absl::StatusOr<std::shared_ptr<CudaBackend>> be = CudaBackend::Create(0, {});
  ASSERT_TRUE(be.ok()) << be.status();
  const KernelTable table = RegisterAllKernels();
  KernelContext ctx;
  ctx.backend = be->get();
  const Shape s = Shapes()[1];
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::vector<Tensor> host = {Rand(DType::kF32, s.x, 7).CastTo(dt), Rand(DType::kF32, s.table, 8).CastTo(dt),
                                      Rand(DType::kF32, s.table, 9).CastTo(dt)};
    std::vector<Tensor> dev;
    for (const Tensor& t : host) {
      absl::StatusOr<Tensor> d = (*be)->Upload(t);
      ASSERT_TRUE(d.ok()) << d.status();
      dev.push_back(*d);
    }
    for (OpKind op : {OpKind::kRotary, OpKind::kRotaryGrad}) {
      ir::Graph g;
      std::vector<ir::ValueId> ins;
      for (size_t i = 0; i < host.size(); ++i)
        ins.push_back(
            g.AddValue("in" + std::to_string(i), dt, ir::Shape(host[i].dims().begin(), host[i].dims().end())));
      ir::Attrs a;
      a.Set("rotary_dim", s.table.back());
      const ir::NodeId n = g.AddNode(op, "rotary", ins, {g.AddValue("y", dt, ir::Shape(s.x.begin(), s.x.end()))}, a);
      KernelResult r = table.at(op).run(ctx, g.node(n), dev);
      ASSERT_TRUE(r.has_value()) << ir::OpName(op) << " " << ir::DTypeName(dt) << " fell back to the host";
      ASSERT_TRUE(r->ok()) << r->status();
      absl::StatusOr<Tensor> y = (*be)->ToHost((**r)[0]);
      ASSERT_TRUE(y.ok()) << y.status();
      std::vector<Tensor> wide;
      for (const Tensor& t : host) wide.push_back(t.CastTo(DType::kF32));
      const Tensor want = Eval1(Node(op, s.table.back(), false), wide);
      EXPECT_LT(NormalisedError(y->CastTo(DType::kF32), want), dt == DType::kF32 ? 1e-6 : 4e-3) << ir::OpName(op);
    }
  }
}

}  // namespace
}  // namespace onnxpipe::cuda::testing
