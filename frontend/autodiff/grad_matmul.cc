// Gradient rules of the GEMM family: MatMul (batched, broadcast, 1-D operands), Gemm, Linear and
// FusedMatMul. All of them reduce to one core, the gradient of Y = alpha * op(A) @ op(B):
//   dA = alpha * dY @ op(B)^T   (or its transpose when A is transposed),
//   dB = alpha * op(A)^T @ dY   (or its transpose when B is transposed),
// emitted as FusedMatMul so that no transposed copy is materialised. When B is a 2-D weight and A
// carries batch dims, A and dY are flattened to 2-D first: dB is then one GEMM over all rows
// instead of a batch of GEMMs summed afterwards (ORT's "Gemm for 2-D weights"). Otherwise operands
// that were broadcast over batch dims get their gradient summed back with ReduceToShapeOf. A bias
// over the last dim (Linear, Gemm's C of N values) takes its gradient, dY's column sums, from the
// weight-gradient GEMM's KSum output (a cuBLASLt epilogue) instead of a separate pass over dY.
#include "frontend/autodiff/grad_builder.h"
#include "frontend/ir/status.h"

namespace onnxpipe::autodiff {
namespace {

using ir::OpKind;
using ir::ValueId;

struct MatMulGrads {
  ValueId da = ir::kNoValue, db = ir::kNoValue;
  ValueId dy_col_sums = ir::kNoValue;  // (N): with `col_sums`, from dB's GEMM
};

// Whether `bias` is a row of N = dY's last dim broadcast over dY's other dims (leading 1s only),
// so that its gradient is dY's column sums.
bool IsRowBias(const GradBuilder& b, ValueId bias, ValueId dy) {
  const ir::Shape& s = b.TypeOf(bias).shape;
  const ir::Shape& y = b.TypeOf(dy).shape;
  if (s.empty() || y.empty() || s.size() > y.size() || !s.back().is_concrete() || s.back() != y.back()) return false;
  for (size_t i = 0; i + 1 < s.size(); ++i)
    if (!s[i].is_concrete() || s[i].value() != 1) return false;
  return true;
}

// dA, dB of Y = alpha op(A) op(B), and with `col_sums` (alpha 1, need_b) dY's column sums from dB's GEMM.
absl::StatusOr<MatMulGrads> GradOfProduct(GradBuilder& b, ValueId a, ValueId w, ValueId dy, bool ta, bool tb,
                                          double alpha, bool need_a, bool need_b, bool col_sums = false) {
  const int64_t ra = b.Rank(a), rb = b.Rank(w);
  if (ra < 2 || rb < 2) return b.Error("internal: matrix operand of rank < 2");
  MatMulGrads out;
  if (rb == 2 && ra > 2 && !ta) {
    ValueId a2 = b.Flatten(a, ra - 1);
    ValueId dy2 = b.Flatten(dy, b.Rank(dy) - 1);
    ASSIGN_OR_RETURN(out, GradOfProduct(b, a2, w, dy2, false, tb, alpha, need_a, need_b, col_sums));
    if (need_a) out.da = b.ReshapeLike(out.da, a);
    return out;
  }
  if (need_a) {
    ValueId da;
    if (ta) {
      ASSIGN_OR_RETURN(da, b.FusedMatMul(w, dy, /*trans_a=*/tb, /*trans_b=*/true, alpha));
    } else {
      ASSIGN_OR_RETURN(da, b.FusedMatMul(dy, w, /*trans_a=*/false, /*trans_b=*/!tb, alpha));
    }
    out.da = b.ReduceToShapeOf(da, a);
  }
  if (need_b && col_sums) {
    if (alpha != 1.0 || ra != 2 || rb != 2) return b.Error("internal: bias gradient from a scaled or batched GEMM");
    // dY is op(A) of dB = dY^T A' (k_sum 'a': sums over dY's rows) or op(B) of dB = A'^T dY ('b').
    std::pair<ValueId, ValueId> r;
    if (tb) {
      ASSIGN_OR_RETURN(r, b.FusedMatMulWithKSum(dy, a, /*trans_a=*/true, /*trans_b=*/ta, 'a'));
    } else {
      ASSIGN_OR_RETURN(r, b.FusedMatMulWithKSum(a, dy, /*trans_a=*/!ta, /*trans_b=*/false, 'b'));
    }
    out.db = r.first;
    out.dy_col_sums = r.second;
  } else if (need_b) {
    ValueId db;
    if (tb) {
      ASSIGN_OR_RETURN(db, b.FusedMatMul(dy, a, /*trans_a=*/true, /*trans_b=*/ta, alpha));
    } else {
      ASSIGN_OR_RETURN(db, b.FusedMatMul(a, dy, /*trans_a=*/!ta, /*trans_b=*/false, alpha));
    }
    out.db = b.ReduceToShapeOf(db, w);
  }
  return out;
}

absl::Status MatMulGrad(GradBuilder& b) {
  ValueId a = b.I(0), w = b.I(1), dy = b.GO(0);
  const int64_t ra = b.Rank(a), rb = b.Rank(w);
  if (ra == 0 || rb == 0) return b.Error("MatMul of a scalar");
  // 1-D operands: promote as numpy does (A: (K) -> (1, K); B: (K) -> (K, 1)) and put the removed
  // dims back into dY, then reshape the gradients to the original operands.
  ValueId a2 = a, w2 = w, dy2 = dy;
  const int64_t ry = b.Rank(dy);
  if (ra == 1 && rb == 1) {
    dy2 = b.Unsqueeze(dy, {0, 1});
  } else if (ra == 1) {
    dy2 = b.Unsqueeze(dy, {ry - 1});
  } else if (rb == 1) {
    dy2 = b.Unsqueeze(dy, {ry});
  }
  if (ra == 1) a2 = b.Unsqueeze(a, {0});
  if (rb == 1) w2 = b.Unsqueeze(w, {1});
  ASSIGN_OR_RETURN(MatMulGrads g, GradOfProduct(b, a2, w2, dy2, false, false, 1.0, b.NeedsGI(0), b.NeedsGI(1)));
  if (b.NeedsGI(0)) b.SetGI(0, b.ReshapeLike(g.da, a));
  if (b.NeedsGI(1)) b.SetGI(1, b.ReshapeLike(g.db, w));
  return absl::OkStatus();
}

absl::Status GemmGrad(GradBuilder& b) {
  const ir::Attrs& at = b.node().attrs;
  const double alpha = at.Get<double>("alpha", 1.0), beta = at.Get<double>("beta", 1.0);
  const bool ta = at.Get<int64_t>("transA", 0) != 0, tb = at.Get<int64_t>("transB", 0) != 0;
  ValueId dy = b.GO(0);
  const bool col_sums = b.NeedsGI(1) && b.NeedsGI(2) && alpha == 1.0 && IsRowBias(b, b.I(2), dy);
  ASSIGN_OR_RETURN(MatMulGrads g,
                   GradOfProduct(b, b.I(0), b.I(1), dy, ta, tb, alpha, b.NeedsGI(0), b.NeedsGI(1), col_sums));
  if (b.NeedsGI(0)) b.SetGI(0, g.da);
  if (b.NeedsGI(1)) b.SetGI(1, g.db);
  if (b.NeedsGI(2)) {
    ValueId dc = col_sums ? b.ReshapeLike(g.dy_col_sums, b.I(2)) : b.ReduceToShapeOf(dy, b.I(2));
    if (beta != 1.0) {
      ASSIGN_OR_RETURN(dc, b.Mul(dc, b.Scalar(beta, b.TypeOf(dc).dtype)));
    }
    b.SetGI(2, dc);
  }
  return absl::OkStatus();
}

absl::Status LinearGrad(GradBuilder& b) {
  const bool tb = b.node().attrs.Get<int64_t>("trans_b", 0) != 0;
  ValueId x = b.I(0), dy = b.GO(0);
  ValueId x2 = x, dy2 = dy;
  if (b.Rank(x) == 1) {
    x2 = b.Unsqueeze(x, {0});
    dy2 = b.Unsqueeze(dy, {0});
  }
  const bool col_sums = b.NeedsGI(1) && b.NeedsGI(2) && IsRowBias(b, b.I(2), dy);
  ASSIGN_OR_RETURN(MatMulGrads g,
                   GradOfProduct(b, x2, b.I(1), dy2, false, tb, 1.0, b.NeedsGI(0), b.NeedsGI(1), col_sums));
  if (b.NeedsGI(0)) b.SetGI(0, b.ReshapeLike(g.da, x));
  if (b.NeedsGI(1)) b.SetGI(1, g.db);
  if (b.NeedsGI(2)) {
    b.SetGI(2, col_sums ? b.ReshapeLike(g.dy_col_sums, b.I(2)) : b.ReduceToShapeOf(dy, b.I(2)));
  }
  return absl::OkStatus();
}

absl::Status FusedMatMulGrad(GradBuilder& b) {
  const ir::Attrs& at = b.node().attrs;
  ASSIGN_OR_RETURN(MatMulGrads g, GradOfProduct(b, b.I(0), b.I(1), b.GO(0), at.Get<int64_t>("trans_a", 0) != 0,
                                                at.Get<int64_t>("trans_b", 0) != 0, at.Get<double>("alpha", 1.0),
                                                b.NeedsGI(0), b.NeedsGI(1)));
  if (b.NeedsGI(0)) b.SetGI(0, g.da);
  if (b.NeedsGI(1)) b.SetGI(1, g.db);
  return absl::OkStatus();
}

}  // namespace

void RegisterMatMulGradients(GradRegistry& r) {
  r.Register(OpKind::kMatMul, MatMulGrad);
  r.Register(OpKind::kGemm, GemmGrad);
  r.Register(OpKind::kLinear, LinearGrad);
  r.Register(OpKind::kFusedMatMul, FusedMatMulGrad);
}

}  // namespace onnxpipe::autodiff
