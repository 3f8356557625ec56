// The index and mask kernels of Hugging Face exports (GatherElements, GatherND, CumSum, IsNaN,
// ArgMax)
// against numpy, and their errors on bad indices.
#include <cmath>
#include <limits>

#include "tests/cpu/test_util.h"

namespace onnxpipe::cpu::testing {
namespace {

using ir::DType;
using ir::OpKind;
using ir::Tensor;

ir::Attrs IntAttrs(std::vector<std::pair<std::string, int64_t>> kv) {
  ir::Attrs a;
  for (const auto& [k, v] : kv) a.Set(k, v);
  return a;
}

TEST(IndexMask, GatherElementsMatchesTakeAlongAxis) {
  Tensor x = Rand(DType::kF64, {3, 4, 5}, 1);
  for (int64_t axis : {0, 1, 2, -1}) {
    const int64_t ax = axis < 0 ? axis + 3 : axis;
    std::vector<int64_t> idx_dims = {3, 4, 5};
    idx_dims[ax] = 6;  // longer than the axis: repeated picks
    idx_dims[(ax + 1) % 3] -= 1;  // shorter than data along another axis
    const int64_t n = x.dims()[ax];
    Tensor idx = RandInt(DType::kI64, idx_dims, 2 + ax, -n, n - 1);
    std::string code = "x, i = a['x'], a['i']\nax = " + std::to_string(ax) +
                       "\nsl = tuple(slice(0, d) if k != ax else slice(None) for k, d in enumerate(i.shape))\n"
                       "out['y'] = np.take_along_axis(x[sl], np.where(i < 0, i + x.shape[ax], i), axis=ax)\n";
    auto ref = Numpy({{"x", x}, {"i", idx}}, code);
    Tensor got = Eval1(MakeNode(OpKind::kGatherElements, 2, 1, IntAttrs({{"axis", axis}})), {x, idx});
    EXPECT_TRUE(got.BitwiseEquals(ref["y"])) << "axis " << axis;
  }
  Tensor bad = I64({1, 2}, {0, 5});
  auto r = Eval(MakeNode(OpKind::kGatherElements, 2, 1, IntAttrs({{"axis", 1}}), "/m/ge"),
                {Rand(DType::kF32, {1, 5}, 3), bad});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("index 5"), std::string::npos) << r.status();
  EXPECT_FALSE(Eval(MakeNode(OpKind::kGatherElements, 2), {Rand(DType::kF32, {2, 3}, 3), I64({2}, {0, 1})}).ok());
}

TEST(IndexMask, GatherNDMatchesNumpyIndexing) {
  Tensor x = Rand(DType::kF32, {2, 3, 4, 5}, 4);
  struct Case {
    int64_t batch_dims;
    std::vector<int64_t> idx_dims;
    std::string code;
  };
  const std::vector<Case> cases = {
      // (6, 2): pairs into (2, 3) -> (6, 4, 5)
      {0, {6, 2}, "out['y'] = x[i[..., 0], i[..., 1]]\n"},
      // (2, 2, 4): full coordinates -> scalars
      {0, {2, 2, 4}, "out['y'] = x[i[..., 0], i[..., 1], i[..., 2], i[..., 3]]\n"},
      // batch_dims 1: (2, 3, 1) picks along dim 1 per batch -> (2, 3, 4, 5)
      {1, {2, 3, 1}, "out['y'] = np.stack([x[b][i[b, :, 0]] for b in range(2)])\n"},
      // batch_dims 2: (2, 3, 2) picks (dim 2, dim 3) per (b, s) -> (2, 3)
      {2, {2, 3, 2}, "out['y'] = np.array([[x[b, s, i[b, s, 0], i[b, s, 1]] for s in range(3)] for b in range(2)])\n"},
  };
  int seed = 10;
  for (const Case& c : cases) {
    const int64_t k = c.idx_dims.back();
    // Negative indices too: values in [-dim, dim - 1] of the smallest indexed dim.
    int64_t smallest = 5;
    for (int64_t j = 0; j < k; ++j) smallest = std::min(smallest, x.dims()[c.batch_dims + j]);
    Tensor idx = RandInt(DType::kI64, c.idx_dims, seed++, -smallest, smallest - 1);
    auto ref = Numpy({{"x", x}, {"i", idx}}, "x, i = a['x'], a['i']\n" + c.code);
    Tensor got = Eval1(MakeNode(OpKind::kGatherND, 2, 1, IntAttrs({{"batch_dims", c.batch_dims}})), {x, idx});
    EXPECT_TRUE(got.BitwiseEquals(ref["y"])) << "batch_dims " << c.batch_dims;
  }
  auto out_of_range = Eval(MakeNode(OpKind::kGatherND, 2), {x, I64({1, 2}, {0, 3})});
  ASSERT_FALSE(out_of_range.ok());
  EXPECT_NE(out_of_range.status().message().find("index 3"), std::string::npos) << out_of_range.status();
  EXPECT_FALSE(Eval(MakeNode(OpKind::kGatherND, 2), {x, I64({1, 5}, {0, 0, 0, 0, 0})}).ok());
  EXPECT_FALSE(Eval(MakeNode(OpKind::kGatherND, 2, 1, IntAttrs({{"batch_dims", 1}})), {x, I64({3, 1}, {0, 0, 0})}).ok());
}

TEST(IndexMask, CumSumMatchesNumpyInEveryDirection) {
  for (DType dt : {DType::kF32, DType::kF64, DType::kI64, DType::kI32}) {
    Tensor x = ir::IsInteger(dt) ? RandInt(dt, {3, 4, 5}, 20, -9, 9) : Rand(dt, {3, 4, 5}, 20);
    for (int64_t axis : {0, 1, -1}) {
      for (int64_t exclusive : {0, 1}) {
        for (int64_t reverse : {0, 1}) {
          const int64_t ax = axis < 0 ? axis + 3 : axis;
          std::string code = "x = a['x']\nax = " + std::to_string(ax) + "\nv = np.flip(x, ax) if " +
                             std::to_string(reverse) + " else x\nc = np.cumsum(v.astype(np.float64), axis=ax)\n" +
                             "if " + std::to_string(exclusive) + ": c = c - v\n" + "c = np.flip(c, ax) if " +
                             std::to_string(reverse) + " else c\nout['y'] = c.astype(x.dtype)\n";
          auto ref = Numpy({{"x", x}}, code);
          Tensor got = Eval1(MakeNode(OpKind::kCumSum, 1, 1,
                                      IntAttrs({{"axis", axis}, {"exclusive", exclusive}, {"reverse", reverse}})),
                             {x});
          EXPECT_TRUE(AllClose(got, ref["y"], ir::IsInteger(dt) ? 0 : RelTol(dt), ir::IsInteger(dt) ? 0 : 1e-6))
              << ir::DTypeName(dt) << " axis " << axis << " exclusive " << exclusive << " reverse " << reverse;
        }
      }
    }
  }
  EXPECT_FALSE(Eval(MakeNode(OpKind::kCumSum, 1, 1, IntAttrs({{"axis", 3}})), {Rand(DType::kF32, {2, 3}, 1)}).ok());
}

TEST(IndexMask, IsNaNFlagsOnlyNaN) {
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dt : FloatDTypes()) {
    Tensor x = Tensor::FromVector<double>({2, 3}, {0.0, std::nan(""), -inf, inf, -1.5, -std::nan("")}).CastTo(dt);
    EXPECT_EQ(Eval1(MakeNode(OpKind::kIsNaN, 1), {x}).ToInt64Vector(), (std::vector<int64_t>{0, 1, 0, 0, 0, 1}));
  }
  EXPECT_FALSE(Eval(MakeNode(OpKind::kIsNaN, 1), {I64({1}, {1})}).ok());
}

TEST(IndexMask, ArgMaxMatchesNumpyWithTiesAndNaN) {
  // Values from a small set so that ties are common; a NaN in one row.
  Tensor x = RandInt(DType::kI64, {3, 4, 5}, 30, 0, 2).CastTo(DType::kF64);
  x.mutable_data<double>()[7] = std::nan("");
  for (DType dt : {DType::kF64, DType::kI64}) {
    Tensor xd = dt == DType::kF64 ? x : RandInt(DType::kI64, {3, 4, 5}, 31, 0, 2);
    for (int64_t axis : {0, 1, -1}) {
      for (int64_t last : {0, 1}) {
        for (int64_t keep : {0, 1}) {
          const std::string code = "x = a['x']\nax = " + std::to_string(axis) + "\nn = x.shape[ax]\n" +
                                   (last ? "y = n - 1 - np.argmax(np.flip(x, ax), axis=ax)\n"
                                         : "y = np.argmax(x, axis=ax)\n") +
                                   (keep ? "y = np.expand_dims(y, ax)\n" : "") + "out['y'] = y.astype(np.int64)\n";
          auto ref = Numpy({{"x", xd}}, code);
          ir::Attrs attrs = IntAttrs({{"axis", axis}, {"keepdims", keep}, {"select_last_index", last}});
          EXPECT_TRUE(Eval1(MakeNode(OpKind::kArgMax, 1, 1, attrs), {xd}).BitwiseEquals(ref["y"]))
              << ir::DTypeName(dt) << " axis " << axis << " last " << last << " keepdims " << keep;
        }
      }
    }
  }
  EXPECT_FALSE(Eval(MakeNode(OpKind::kArgMax, 1, 1, IntAttrs({{"axis", 1}})), {Rand(DType::kF32, {2, 0}, 1)}).ok());
}

}  // namespace
}  // namespace onnxpipe::cpu::testing
