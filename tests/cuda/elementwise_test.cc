// Elementwise CUDA kernels against the CPU backend evaluating the same IR op: fp32 bitwise for the
// correctly rounded ops, within 2e-6 relative for libm functions; bf16 by normalised error against
// the fp32 CPU result; broadcasting shapes; non-finite detection; argument errors.
#include "executor/cuda/elementwise.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

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

class ElementwiseTest : public CudaTest {};

OpKind KindOf(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd:
      return OpKind::kAdd;
    case BinaryOp::kSub:
      return OpKind::kSub;
    case BinaryOp::kMul:
      return OpKind::kMul;
    case BinaryOp::kDiv:
      return OpKind::kDiv;
    case BinaryOp::kPow:
      return OpKind::kPow;
    case BinaryOp::kMin:
      return OpKind::kMin;
    case BinaryOp::kMax:
      return OpKind::kMax;
    case BinaryOp::kEqual:
      return OpKind::kEqual;
    case BinaryOp::kLess:
      return OpKind::kLess;
    case BinaryOp::kGreater:
      return OpKind::kGreater;
    case BinaryOp::kAnd:
      return OpKind::kAnd;
    case BinaryOp::kReluGrad:
      return OpKind::kReluGrad;
    case BinaryOp::kGreaterOrEqual:
      return OpKind::kGreaterOrEqual;
    case BinaryOp::kLessOrEqual:
      return OpKind::kLessOrEqual;
  }
  return OpKind::kAdd;
}

// Runs `op` on the GPU over a and b and returns the result (dtype of a, bool for comparisons).
Tensor RunBinary(BinaryOp op, const Tensor& a, const Tensor& b) {
  auto dims = BroadcastShape({a.dims(), b.dims()});
  EXPECT_TRUE(dims.ok()) << dims.status();
  const bool compare = op == BinaryOp::kEqual || op == BinaryOp::kLess || op == BinaryOp::kGreater ||
                       op == BinaryOp::kGreaterOrEqual || op == BinaryOp::kLessOrEqual || op == BinaryOp::kAnd;
  DeviceTensor da(a), db(b), out(compare ? DType::kBool : a.dtype(), *dims);
  const absl::Status st = Binary(op, a.dtype(), da.get(), a.dims(), db.get(), b.dims(), out.get(), nullptr);
  EXPECT_TRUE(st.ok()) << st;
  return out.ToHost();
}

// The broadcasting layouts of a transformer graph: same shape, scalar, row (bias), column,
// middle axis, both sides broadcast, and a leading-rank difference.
const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>& Shapes() {
  static const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> kShapes = {
      {{4, 7, 33}, {4, 7, 33}}, {{4, 7, 33}, {}},  {{4, 7, 33}, {33}}, {{4, 7, 33}, {4, 7, 1}},
      {{4, 7, 33}, {4, 1, 33}}, {{7, 1}, {1, 33}}, {{1}, {4, 7, 33}},  {{2, 3, 1, 5, 1, 4}, {3, 5, 1, 1}},
  };
  return kShapes;
}

// Host-only: the index's offsets (decoded as the kernels decode them) equal numpy's broadcast
// indexing for every layout above and for three operands.
TEST(BroadcastIndexTest, OffsetsEqualNumpyIndexing) {
  auto check = [](const std::vector<std::vector<int64_t>>& shapes) {
    auto out = BroadcastShape(shapes);
    auto idx = MakeBroadcastIndex(shapes);
    ASSERT_TRUE(out.ok() && idx.ok()) << out.status() << idx.status();
    int64_t n = 1;
    for (int64_t d : *out) n *= d;
    for (int64_t o = 0; o < n; ++o) {
      // Numpy: the output coordinate, clamped to 0 along an operand's size-1 or missing dims.
      std::vector<int64_t> coord(out->size());
      for (int64_t r = o, d = static_cast<int64_t>(out->size()) - 1; d >= 0; --d) {
        coord[d] = r % (*out)[d];
        r /= (*out)[d];
      }
      for (size_t k = 0; k < shapes.size(); ++k) {
        const auto& s = shapes[k];
        int64_t want = 0;
        for (size_t d = 0; d < s.size(); ++d) want = want * s[d] + (s[d] == 1 ? 0 : coord[out->size() - s.size() + d]);
        int64_t got = 0;
        if (idx->contiguous) {
          got = o;
        } else {
          for (int64_t r = o, d = idx->rank - 1; d >= 0; --d) {
            got += (r % idx->dims[d]) * idx->strides[k][d];
            r /= idx->dims[d];
          }
        }
        ASSERT_EQ(got, want) << "operand " << k << " output " << o;
      }
    }
  };
  for (const auto& [a, b] : Shapes()) check({a, b});
  check({{4, 1, 33}, {4, 7, 33}, {7, 1}});
  check({{1}, {2, 1, 3}, {5, 1}});
}

TEST_F(ElementwiseTest, BinaryF32MatchesCpuOverBroadcastShapes) {
  for (const auto& [sa, sb] : Shapes()) {
    // Small integers make the comparisons hit equality; Pow gets a positive base.
    const Tensor a = RandInt(DType::kI64, sa, 1, -3, 3).CastTo(DType::kF32);
    const Tensor b = RandInt(DType::kI64, sb, 2, -3, 3).CastTo(DType::kF32);
    const Tensor a_real = Rand(DType::kF32, sa, 3, -2, 2), b_real = Rand(DType::kF32, sb, 4, 0.5, 2);
    const Tensor base = Rand(DType::kF32, sa, 5, 0.1, 3);
    for (BinaryOp op : {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv, BinaryOp::kPow, BinaryOp::kMin,
                        BinaryOp::kMax, BinaryOp::kEqual, BinaryOp::kLess, BinaryOp::kGreater,
                        BinaryOp::kGreaterOrEqual, BinaryOp::kLessOrEqual}) {
      const bool compare = op == BinaryOp::kEqual || op == BinaryOp::kLess || op == BinaryOp::kGreater ||
                           op == BinaryOp::kGreaterOrEqual || op == BinaryOp::kLessOrEqual;
      const Tensor& x = op == BinaryOp::kPow ? base : compare ? a : a_real;
      const Tensor& y = compare ? b : b_real;
      const Tensor want = Eval1(MakeNode(KindOf(op), 2), {x, y});
      const Tensor got = RunBinary(op, x, y);
      ASSERT_EQ(got.dims(), want.dims());
      if (op == BinaryOp::kPow) {
        EXPECT_LT(MaxRelError(got, want), 2e-6) << "Pow " << want.DebugString();
      } else {
        EXPECT_TRUE(got.BitwiseEquals(want))
            << static_cast<int>(op) << " on " << a.DebugString() << " vs " << b.DebugString() << ": got "
            << got.DebugString() << " want " << want.DebugString();
      }
    }
  }
}

TEST_F(ElementwiseTest, BinaryIntegersMatchCpu) {
  for (DType dt : {DType::kI64, DType::kI32}) {
    const Tensor a = RandInt(dt, {5, 6}, 7, -1000, 1000), b = RandInt(dt, {6}, 8, -1000, 1000);
    for (BinaryOp op : {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kMin, BinaryOp::kMax, BinaryOp::kLess,
                        BinaryOp::kGreater}) {
      EXPECT_TRUE(RunBinary(op, a, b).BitwiseEquals(Eval1(MakeNode(KindOf(op), 2), {a, b}))) << ir::DTypeName(dt);
    }
    const Tensor small = RandInt(dt, {5, 6}, 9, 0, 2), col = RandInt(dt, {5, 1}, 10, 0, 2);
    EXPECT_TRUE(
        RunBinary(BinaryOp::kEqual, small, col).BitwiseEquals(Eval1(MakeNode(OpKind::kEqual, 2), {small, col})));
  }
}

// ReluGrad(dY, Y) = Y > 0 ? dY : 0: a selection, bit for bit the CPU's (bf16: the same bits).
TEST_F(ElementwiseTest, ReluGradSelectsLikeTheCpu) {
  Tensor y = Rand(DType::kF32, {5, 40}, 23, -1, 1);
  y.mutable_data<float>()[0] = 0.f;
  y.mutable_data<float>()[1] = -0.f;
  y.mutable_data<float>()[2] = NAN;
  const Tensor dy = Rand(DType::kF32, {5, 40}, 24, -3, 3);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Tensor want = Eval1(MakeNode(OpKind::kReluGrad, 2), {dy.CastTo(dt).CastTo(DType::kF32), y}).CastTo(dt);
    EXPECT_TRUE(RunBinary(BinaryOp::kReluGrad, dy.CastTo(dt), y.CastTo(dt)).BitwiseEquals(want)) << ir::DTypeName(dt);
  }
}

TEST_F(ElementwiseTest, MinMaxPropagateNanAndBoolOpsMatchCpu) {
  const Tensor a = Tensor::FromVector<float>({4}, {1.f, NAN, 3.f, -0.f});
  const Tensor b = Tensor::FromVector<float>({4}, {NAN, 2.f, 1.f, 0.f});
  for (BinaryOp op : {BinaryOp::kMin, BinaryOp::kMax}) {
    EXPECT_TRUE(RunBinary(op, a, b).BitwiseEquals(Eval1(MakeNode(KindOf(op), 2), {a, b})));
  }
  const Tensor p = RandInt(DType::kI64, {3, 8}, 21, 0, 1).CastTo(DType::kBool);
  const Tensor q = RandInt(DType::kI64, {8}, 22, 0, 1).CastTo(DType::kBool);
  EXPECT_TRUE(RunBinary(BinaryOp::kAnd, p, q).BitwiseEquals(Eval1(MakeNode(OpKind::kAnd, 2), {p, q})));
  DeviceTensor dp(p), dn(DType::kBool, p.dims());
  ASSERT_TRUE(Unary(UnaryOp::kNot, DType::kBool, dp.get(), dn.get(), p.num_elements(), nullptr).ok());
  EXPECT_TRUE(dn.ToHost().BitwiseEquals(Eval1(MakeNode(OpKind::kNot, 1), {p})));
  // Integer Neg/Abs wrap at the most negative value, as on the CPU.
  const Tensor ints = Tensor::FromVector<int32_t>({4}, {-5, 7, std::numeric_limits<int32_t>::min(), 0});
  for (auto [op, kind] : {std::pair{UnaryOp::kAbs, OpKind::kAbs}, std::pair{UnaryOp::kNeg, OpKind::kNeg}}) {
    DeviceTensor di(ints), dout(DType::kI32, {4});
    ASSERT_TRUE(Unary(op, DType::kI32, di.get(), dout.get(), 4, nullptr).ok());
    EXPECT_TRUE(dout.ToHost().BitwiseEquals(Eval1(MakeNode(kind, 1), {ints}))) << ir::OpName(kind);
  }
}

TEST_F(ElementwiseTest, BinaryHalfTypesWithinNormalisedError) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (const auto& [sa, sb] : Shapes()) {
      const Tensor a = Rand(DType::kF32, sa, 11, -2, 2).CastTo(dt), b = Rand(DType::kF32, sb, 12, 0.5, 2).CastTo(dt);
      for (BinaryOp op : {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv}) {
        const Tensor want = Eval1(MakeNode(KindOf(op), 2), {a.CastTo(DType::kF32), b.CastTo(DType::kF32)});
        const Tensor got = RunBinary(op, a, b);
        EXPECT_EQ(got.dtype(), dt);
        // One rounding to 8 (bf16) or 11 (f16) significant bits; bf16 bit for bit the fp32 result rounded.
        EXPECT_LT(NormalisedError(got, want), dt == DType::kBF16 ? 4e-3 : 5e-4) << ir::DTypeName(dt);
        if (dt == DType::kBF16) {
          EXPECT_TRUE(got.BitwiseEquals(want.CastTo(dt))) << "bf16 " << ir::OpName(KindOf(op));
        }
      }
    }
  }
}

TEST_F(ElementwiseTest, WhereMatchesCpuWithBroadcasting) {
  const Tensor cond = RandInt(DType::kI64, {4, 1, 33}, 13, 0, 1).CastTo(DType::kBool);
  for (DType dt : {DType::kF32, DType::kI64}) {
    const Tensor x = Rand(dt, {4, 7, 33}, 14, -5, 5), y = Rand(dt, {7, 1}, 15, -5, 5);
    const Tensor want = Eval1(MakeNode(OpKind::kWhere, 3), {cond, x, y});
    DeviceTensor dc(cond), dx(x), dy(y), out(dt, want.dims());
    ASSERT_TRUE(
        Where(dt, dc.as<uint8_t>(), cond.dims(), dx.get(), x.dims(), dy.get(), y.dims(), out.get(), nullptr).ok());
    EXPECT_TRUE(out.ToHost().BitwiseEquals(want)) << ir::DTypeName(dt);
  }
}

struct UnaryCase {
  UnaryOp op;
  OpKind kind;
  double lo, hi;
};

TEST_F(ElementwiseTest, UnaryMatchesCpu) {
  const UnaryCase cases[] = {
      {UnaryOp::kNeg, OpKind::kNeg, -3, 3},
      {UnaryOp::kExp, OpKind::kExp, -10, 10},
      {UnaryOp::kLog, OpKind::kLog, 1e-3, 50},
      {UnaryOp::kSqrt, OpKind::kSqrt, 0, 50},
      {UnaryOp::kTanh, OpKind::kTanh, -6, 6},
      {UnaryOp::kErf, OpKind::kErf, -4, 4},
      {UnaryOp::kSigmoid, OpKind::kSigmoid, -30, 30},
      {UnaryOp::kRelu, OpKind::kRelu, -3, 3},
      {UnaryOp::kReciprocal, OpKind::kReciprocal, 0.1, 9},
      {UnaryOp::kAbs, OpKind::kAbs, -3, 3},
      {UnaryOp::kSin, OpKind::kSin, -6, 6},
      {UnaryOp::kCos, OpKind::kCos, -6, 6},
  };
  for (const UnaryCase& c : cases) {
    const Tensor x = Rand(DType::kF32, {3, 1000}, 16, c.lo, c.hi);
    const Tensor want = Eval1(MakeNode(c.kind, 1), {x});
    DeviceTensor dx(x), dy(DType::kF32, x.dims());
    ASSERT_TRUE(Unary(c.op, DType::kF32, dx.get(), dy.get(), x.num_elements(), nullptr).ok());
    const Tensor got = dy.ToHost();
    EXPECT_LT(MaxRelError(got, want, /*floor=*/1e-6), 2e-6) << ir::OpName(c.kind);
    // bf16: the fp32 result rounded once.
    const Tensor xb = x.CastTo(DType::kBF16);
    DeviceTensor dxb(xb), dyb(DType::kBF16, x.dims());
    ASSERT_TRUE(Unary(c.op, DType::kBF16, dxb.get(), dyb.get(), x.num_elements(), nullptr).ok());
    EXPECT_LT(NormalisedError(dyb.ToHost(), Eval1(MakeNode(c.kind, 1), {xb.CastTo(DType::kF32)})), 4e-3)
        << ir::OpName(c.kind);
  }
  // NaN passes through Relu, as on the CPU.
  const Tensor x = Tensor::FromVector<float>({3}, {-1.f, NAN, 2.f});
  DeviceTensor dx(x), dy(DType::kF32, {3});
  ASSERT_TRUE(Unary(UnaryOp::kRelu, DType::kF32, dx.get(), dy.get(), 3, nullptr).ok());
  EXPECT_TRUE(dy.ToHost().BitwiseEquals(Eval1(MakeNode(OpKind::kRelu, 1), {x})));
}

TEST_F(ElementwiseTest, CastMatchesCpuBitwise) {
  Tensor x = Rand(DType::kF32, {2000}, 17, -70000, 70000);
  // Values around the 16-bit types' rounding boundaries and limits.
  const float specials[] = {0.f,     -0.f,  1.f + 1.f / 256, 1.f + 3.f / 512, 65504.f,
                            65520.f, 1e-8f, 6e-5f,           -3.5f,           -65519.f};
  for (size_t i = 0; i < std::size(specials); ++i) x.mutable_data<float>()[i] = specials[i];
  const std::pair<DType, DType> pairs[] = {
      {DType::kF32, DType::kBF16}, {DType::kF32, DType::kF16},  {DType::kBF16, DType::kF32},
      {DType::kF16, DType::kF32},  {DType::kBF16, DType::kF16}, {DType::kF16, DType::kBF16},
      {DType::kF32, DType::kI64},  {DType::kI64, DType::kF32},  {DType::kF32, DType::kBool},
      {DType::kBool, DType::kF32}, {DType::kI64, DType::kI32},  {DType::kBF16, DType::kI32},
  };
  for (const auto& [from, to] : pairs) {
    const Tensor src = x.CastTo(from);
    ir::Attrs attrs;
    attrs.Set("to", std::string(ir::DTypeName(to)));
    const Tensor want = Eval1(MakeNode(OpKind::kCast, 1, 1, attrs), {src});
    DeviceTensor ds(src), dd(to, src.dims());
    ASSERT_TRUE(Cast(from, ds.get(), to, dd.get(), src.num_elements(), nullptr).ok());
    EXPECT_TRUE(dd.ToHost().BitwiseEquals(want)) << ir::DTypeName(from) << " -> " << ir::DTypeName(to);
  }
}

TEST_F(ElementwiseTest, FlagNonFiniteFindsNanAndInf) {
  const int64_t n = 100003;
  Tensor clean = Rand(DType::kF32, {n}, 18, -1e30, 1e30);
  DeviceTensor flag(DType::kI32, {1});
  auto check = [&](const Tensor& t) {
    DeviceTensor d(t);
    EXPECT_EQ(cudaMemset(flag.get(), 0, 4), cudaSuccess);
    EXPECT_TRUE(FlagNonFinite(t.dtype(), d.get(), t.num_elements(), flag.as<uint32_t>(), nullptr).ok());
    return flag.ToHost().GetAsInt(0);
  };
  EXPECT_EQ(check(clean), 0);
  EXPECT_EQ(check(clean.CastTo(DType::kBF16)), 0);
  Tensor nan = clean.Clone();
  nan.mutable_data<float>()[n / 2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(check(nan), 1);
  Tensor inf = clean.Clone();
  inf.mutable_data<float>()[n - 1] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(check(inf), 1);
  EXPECT_EQ(check(inf.CastTo(DType::kBF16)), 1);
  // 1e30 overflows f16: the cast tensor is non-finite.
  EXPECT_EQ(check(clean.CastTo(DType::kF16)), 1);
  // The flag is sticky across tensors: a clean tensor after a bad one leaves it set.
  DeviceTensor dn(nan), dc(clean);
  ASSERT_EQ(cudaMemset(flag.get(), 0, 4), cudaSuccess);
  ASSERT_TRUE(FlagNonFinite(DType::kF32, dn.get(), n, flag.as<uint32_t>(), nullptr).ok());
  ASSERT_TRUE(FlagNonFinite(DType::kF32, dc.get(), n, flag.as<uint32_t>(), nullptr).ok());
  EXPECT_EQ(flag.ToHost().GetAsInt(0), 1);
}

TEST_F(ElementwiseTest, AccumulateAddsInFp32) {
  const Tensor acc = Rand(DType::kF32, {5000}, 19), x = Rand(DType::kF32, {5000}, 20);
  DeviceTensor dacc(acc), dx(x);
  ASSERT_TRUE(Accumulate(DType::kF32, dacc.get(), DType::kF32, dx.get(), 5000, nullptr).ok());
  EXPECT_TRUE(dacc.ToHost().BitwiseEquals(Eval1(MakeNode(OpKind::kAdd, 2), {acc, x})));
  // A bf16 micro-batch gradient into the fp32 accumulator: the bf16 value widened exactly.
  const Tensor xb = x.CastTo(DType::kBF16);
  DeviceTensor dacc2(acc), dxb(xb);
  ASSERT_TRUE(Accumulate(DType::kF32, dacc2.get(), DType::kBF16, dxb.get(), 5000, nullptr).ok());
  EXPECT_TRUE(dacc2.ToHost().BitwiseEquals(Eval1(MakeNode(OpKind::kAdd, 2), {acc, xb.CastTo(DType::kF32)})));
}

// The dense maps load 16-byte runs only from aligned pointers and finish with a scalar tail: every
// length and alignment gives the CPU's bits (Add, Cast, and Sum of k operands added in fp32 from the
// left, rounded once).
TEST_F(ElementwiseTest, DenseMapsMatchCpuAtEveryAlignmentAndLength) {
  for (int64_t n : {1, 7, 9, 4099}) {
    for (int64_t shift : {0, 1, 3}) {
      const std::vector<int64_t> padded = {n + shift};
      const Tensor a = Rand(DType::kF32, padded, 40 + n), b = Rand(DType::kF32, padded, 41 + n),
                   c = Rand(DType::kF32, padded, 42 + n);
      for (DType dt : {DType::kF32, DType::kBF16}) {
        const size_t es = ir::DTypeSize(dt);
        const Tensor at = a.CastTo(dt), bt = b.CastTo(dt), ct = c.CastTo(dt);
        DeviceTensor da(at), db(bt), dc(ct), out(dt, padded), cast_out(DType::kBF16, padded);
        auto at_shift = [&](const DeviceTensor& t, size_t elem) { return static_cast<char*>(t.get()) + shift * elem; };
        auto tail = [&](const Tensor& t) {  // elements [shift, shift + n)
          Tensor r(t.dtype(), {n});
          std::memcpy(r.raw(), static_cast<const char*>(t.raw()) + shift * ir::DTypeSize(t.dtype()),
                      n * ir::DTypeSize(t.dtype()));
          return r;
        };
        const std::string where =
            "n " + std::to_string(n) + " shift " + std::to_string(shift) + " " + std::string(ir::DTypeName(dt));
        ASSERT_TRUE(
            Binary(BinaryOp::kAdd, dt, at_shift(da, es), {n}, at_shift(db, es), {n}, at_shift(out, es), nullptr).ok());
        EXPECT_TRUE(tail(out.ToHost()).BitwiseEquals(Eval1(MakeNode(OpKind::kAdd, 2), {tail(at), tail(bt)}))) << where;
        ASSERT_TRUE(Cast(dt, at_shift(da, es), DType::kBF16, at_shift(cast_out, 2), n, nullptr).ok());
        EXPECT_TRUE(tail(cast_out.ToHost()).BitwiseEquals(tail(at).CastTo(DType::kBF16))) << where;
        const Tensor wide_sum =
            Eval1(MakeNode(OpKind::kSum, 3),
                  {tail(at).CastTo(DType::kF32), tail(bt).CastTo(DType::kF32), tail(ct).CastTo(DType::kF32)});
        ASSERT_TRUE(
            DenseSum(dt, {at_shift(da, es), at_shift(db, es), at_shift(dc, es)}, at_shift(out, es), n, nullptr).ok());
        EXPECT_TRUE(tail(out.ToHost()).BitwiseEquals(wide_sum.CastTo(dt))) << where << " sum";
        ASSERT_TRUE(DenseSum(dt, {at_shift(db, es)}, at_shift(out, es), n, nullptr).ok());
        EXPECT_TRUE(tail(out.ToHost()).BitwiseEquals(tail(bt))) << where << " sum of one";
      }
    }
  }
  DeviceTensor x(DType::kF32, {4});
  EXPECT_FALSE(DenseSum(DType::kF32, {}, x.get(), 4, nullptr).ok());
  EXPECT_FALSE(DenseSum(DType::kI64, {x.get()}, x.get(), 4, nullptr).ok());
  EXPECT_FALSE(
      DenseSum(DType::kF32, std::vector<const void*>(kMaxDenseSumInputs + 1, x.get()), x.get(), 4, nullptr).ok());
}

// Scale: the fp32 product x * s (the CPU's Mul by an fp32 scalar), rounded once to bf16.
TEST_F(ElementwiseTest, ScaleIsTheFp32ProductRoundedOnce) {
  const Tensor x = Rand(DType::kF32, {3, 777}, 21, -4, 4);
  const float s = 1.f / 3.f;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const Tensor xt = x.CastTo(dt);
    const Tensor want =
        Eval1(MakeNode(OpKind::kMul, 2), {xt.CastTo(DType::kF32), Tensor::FromVector<float>({}, {s})}).CastTo(dt);
    DeviceTensor dx(xt), dy(dt, x.dims());
    ASSERT_TRUE(Scale(dt, dx.get(), s, dy.get(), x.num_elements(), nullptr).ok());
    EXPECT_TRUE(dy.ToHost().BitwiseEquals(want)) << ir::DTypeName(dt);
    ASSERT_TRUE(Scale(dt, dx.get(), s, dx.get(), x.num_elements(), nullptr).ok());  // in place
    EXPECT_TRUE(dx.ToHost().BitwiseEquals(want)) << ir::DTypeName(dt) << " in place";
  }
}

TEST_F(ElementwiseTest, BadArgumentsAreErrors) {
  DeviceTensor a(DType::kF32, {4, 3}), b(DType::kF32, {4, 3});
  EXPECT_FALSE(Binary(BinaryOp::kAdd, DType::kF32, a.get(), {4, 3}, b.get(), {2, 3}, a.get(), nullptr).ok());
  EXPECT_FALSE(Binary(BinaryOp::kDiv, DType::kI64, a.get(), {3}, b.get(), {3}, a.get(), nullptr).ok());
  EXPECT_FALSE(Binary(BinaryOp::kAdd, DType::kF64, a.get(), {3}, b.get(), {3}, a.get(), nullptr).ok());
  EXPECT_FALSE(Binary(BinaryOp::kAdd, DType::kF32, nullptr, {3}, b.get(), {3}, a.get(), nullptr).ok());
  EXPECT_FALSE(Unary(UnaryOp::kExp, DType::kI64, a.get(), b.get(), 3, nullptr).ok());
  EXPECT_FALSE(Unary(UnaryOp::kNot, DType::kF32, a.get(), b.get(), 3, nullptr).ok());
  EXPECT_FALSE(Binary(BinaryOp::kAnd, DType::kF32, a.get(), {3}, b.get(), {3}, a.get(), nullptr).ok());
  EXPECT_FALSE(Unary(UnaryOp::kExp, DType::kF32, a.get(), b.get(), -1, nullptr).ok());
  EXPECT_FALSE(Cast(DType::kF32, a.get(), DType::kF64, b.get(), 3, nullptr).ok());
  EXPECT_FALSE(FlagNonFinite(DType::kF32, a.get(), 3, nullptr, nullptr).ok());
  EXPECT_FALSE(Accumulate(DType::kI32, a.get(), DType::kF32, b.get(), 3, nullptr).ok());
  EXPECT_FALSE(Scale(DType::kI64, a.get(), 2.f, b.get(), 3, nullptr).ok());
  EXPECT_FALSE(Scale(DType::kF32, nullptr, 2.f, b.get(), 3, nullptr).ok());
  EXPECT_FALSE(MakeBroadcastIndex({{2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1},
                                   {1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2}})
                   .ok());
  // Empty tensors are no work, not an error.
  EXPECT_TRUE(Binary(BinaryOp::kAdd, DType::kF32, nullptr, {0, 3}, nullptr, {3}, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace onnxpipe::cuda::testing
