// bf16 on the CPU backend: nodes reading bf16 compute in f32 and round their float outputs to bf16
// (normalisation statistics stay f32), under a planned executor too; Cast converts to and from bf16
// with round-to-nearest-even. References: numpy in float64 on the (exactly widened) bf16 inputs,
// compared within bf16's rounding, and values worked out by hand.
#include <cmath>
#include <limits>

#include "tests/cpu/test_util.h"

namespace onnxpipe::cpu::testing {
namespace {

using ir::DType;
using ir::OpKind;
using ir::Tensor;

// |got - want| <= bf16's unit roundoff (2^-8: 8 significant bits) times |want|, plus `atol`: one
// rounding of an (almost) exact result.
::testing::AssertionResult WithinBf16Rounding(const Tensor& got, const Tensor& want, double atol) {
  if (got.dtype() != DType::kBF16) return ::testing::AssertionFailure() << "dtype " << ir::DTypeName(got.dtype());
  if (got.dims() != want.dims()) return ::testing::AssertionFailure() << "dims differ";
  for (int64_t i = 0; i < want.num_elements(); ++i) {
    const double g = got.GetAsDouble(i), w = want.GetAsDouble(i);
    if (std::abs(g - w) > std::ldexp(std::abs(w), -8) + atol) {
      return ::testing::AssertionFailure() << "element " << i << ": " << g << " vs " << w;
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(HalfCompute, MatMulAndSoftmaxRoundTheirF32Result) {
  const Tensor a = Rand(DType::kF32, {3, 5}, 1).CastTo(DType::kBF16);
  const Tensor b = Rand(DType::kF32, {5, 4}, 2).CastTo(DType::kBF16);
  const Tensor c = Eval1(MakeNode(OpKind::kMatMul, 2), {a, b});
  const Tensor s = Eval1(MakeNode(OpKind::kSoftmax, 1), {c});
  auto ref = Numpy({{"a", a.CastTo(DType::kF32)}, {"b", b.CastTo(DType::kF32)}, {"c", c.CastTo(DType::kF32)}},
                   "c = a['a'].astype(np.float64) @ a['b'].astype(np.float64)\n"
                   "e = np.exp(a['c'] - a['c'].max(axis=-1, keepdims=True))\n"
                   "out['c'] = c\nout['s'] = e / e.sum(axis=-1, keepdims=True)\n");
  EXPECT_TRUE(WithinBf16Rounding(c, ref["c"], 1e-6));
  EXPECT_TRUE(WithinBf16Rounding(s, ref["s"], 1e-7));
}

// Records what a kernel asks the planned memory for, as an executor's slots.
class RecordingSlots : public ir::OutputAllocator {
 public:
  absl::StatusOr<Tensor> Allocate(const ir::Node&, int index, DType dtype, const std::vector<int64_t>& dims) override {
    asked[index] = dtype;
    return Tensor(dtype, dims);
  }
  bool SharesInputBuffer(const ir::Node&, int) const override { return false; }
  absl::StatusOr<void*> Workspace(const ir::Node&, int64_t bytes) override {
    workspace.resize(static_cast<size_t>(bytes));
    return static_cast<void*>(workspace.data());
  }
  std::map<int, DType> asked;
  std::vector<uint8_t> workspace;
};

TEST(HalfCompute, LayerNormStatisticsStayF32InPlannedSlots) {
  const Tensor x = Rand(DType::kF32, {4, 8}, 3, -3, 3).CastTo(DType::kBF16);
  const Tensor scale = Rand(DType::kF32, {8}, 4).CastTo(DType::kBF16);
  const Tensor bias = Rand(DType::kF32, {8}, 5).CastTo(DType::kBF16);
  ir::Attrs attrs;
  attrs.Set("epsilon", 1e-5);
  RecordingSlots slots;
  EvalContext ctx;
  ctx.outputs = &slots;
  absl::StatusOr<std::vector<Tensor>> r = Eval(MakeNode(OpKind::kLayerNorm, 3, 3, attrs), {x, scale, bias}, ctx);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(slots.asked, (std::map<int, DType>{{0, DType::kBF16}, {1, DType::kF32}, {2, DType::kF32}}));
  auto ref = Numpy({{"x", x.CastTo(DType::kF32)}, {"s", scale.CastTo(DType::kF32)}, {"b", bias.CastTo(DType::kF32)}},
                   "x = a['x'].astype(np.float64)\nm = x.mean(axis=-1, keepdims=True)\n"
                   "r = 1 / np.sqrt(((x - m) ** 2).mean(axis=-1, keepdims=True) + 1e-5)\n"
                   "out['y'] = (x - m) * r * a['s'] + a['b']\nout['m'] = m.astype(np.float32)\n"
                   "out['r'] = r.astype(np.float32)\n");
  EXPECT_TRUE(WithinBf16Rounding((*r)[0], ref["y"], 1e-5));
  EXPECT_TRUE(AllClose((*r)[1], ref["m"], 1e-5, 1e-6));
  EXPECT_TRUE(AllClose((*r)[2], ref["r"], 1e-5, 1e-6));
}

TEST(HalfCompute, DropoutKeepsItsBoolMask) {
  const Tensor x = Rand(DType::kF32, {64}, 6).CastTo(DType::kBF16);
  ir::Attrs attrs;
  attrs.Set("ratio", 0.5);
  EvalContext ctx;
  ctx.training = true;
  absl::StatusOr<std::vector<Tensor>> r = Eval(MakeNode(OpKind::kDropout, 1, 2, attrs), {x}, ctx);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ((*r)[0].dtype(), DType::kBF16);
  ASSERT_EQ((*r)[1].dtype(), DType::kBool);
  for (int64_t i = 0; i < 64; ++i) {
    // Kept elements are doubled (exact in bf16), dropped ones are 0.
    const double want = (*r)[1].data<bool>()[i] ? 2 * x.GetAsDouble(i) : 0.0;
    EXPECT_EQ((*r)[0].GetAsDouble(i), want) << i;
  }
}

Tensor CastNode(const Tensor& x, DType to) {
  ir::Attrs attrs;
  attrs.Set("to", std::string(ir::DTypeName(to)));
  return Eval1(MakeNode(OpKind::kCast, 1, 1, attrs), {x});
}

TEST(HalfCast, RoundsToNearestEvenAndOverflowsToInfinity) {
  const float fmax = std::numeric_limits<float>::max();
  // bf16 keeps 7 fraction bits: next to 1 are 1 +- 2^-7.
  const Tensor x = Tensor::FromVector<float>(
      {6}, {1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8), -1.0f - std::ldexp(1.0f, -9), fmax,
            -INFINITY, std::nanf("")});
  const Tensor h = CastNode(x, DType::kBF16);
  ASSERT_EQ(h.dtype(), DType::kBF16);
  EXPECT_EQ(h.GetAsDouble(0), 1.0);                       // a tie: to the even neighbour
  EXPECT_EQ(h.GetAsDouble(1), 1.0 + std::ldexp(1.0, -6));  // a tie: to the even neighbour, up
  EXPECT_EQ(h.GetAsDouble(2), -1.0);                      // below half an ulp: down
  EXPECT_EQ(h.GetAsDouble(3), INFINITY);                  // out of range at run time: inf, as on a GPU
  EXPECT_EQ(h.GetAsDouble(4), -INFINITY);
  EXPECT_TRUE(std::isnan(h.GetAsDouble(5)));
  // Back to f32 exactly; to f64 and to integers through the float value.
  const Tensor back = CastNode(h, DType::kF32);
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(back.GetAsDouble(i), h.GetAsDouble(i)) << i;
  const Tensor ints = CastNode(Tensor::FromVector<float>({2}, {-2.5f, 7.75f}).CastTo(DType::kBF16), DType::kI64);
  EXPECT_EQ(ints.data<int64_t>()[0], -2);
  EXPECT_EQ(ints.data<int64_t>()[1], 7);
  // 257 lies halfway between bf16's 256 and 258: the even one.
  EXPECT_EQ(CastNode(I64Vec({257, 259}), DType::kBF16).GetAsDouble(0), 256.0);
  EXPECT_EQ(CastNode(I64Vec({257, 259}), DType::kBF16).GetAsDouble(1), 260.0);
}

}  // namespace
}  // namespace onnxpipe::cpu::testing
