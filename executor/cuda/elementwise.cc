// Host side of the elementwise family: broadcast indexing and the checked Status wrappers.
#include "executor/cuda/elementwise.h"

#include <algorithm>
#include <sstream>
#include <string>

#include "executor/cuda/cuda_status.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {
namespace {

std::string DimsString(const std::vector<int64_t>& dims) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < dims.size(); ++i) os << (i ? ", " : "") << dims[i];
  os << ")";
  return os.str();
}

int64_t NumElements(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

bool IsFloat16Or32(ir::DType t) { return t == ir::DType::kF32 || t == ir::DType::kBF16 || t == ir::DType::kF16; }
bool IsArith(ir::DType t) { return IsFloat16Or32(t) || t == ir::DType::kI64 || t == ir::DType::kI32; }

const char* BinaryName(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd:
      return "Add";
    case BinaryOp::kSub:
      return "Sub";
    case BinaryOp::kMul:
      return "Mul";
    case BinaryOp::kDiv:
      return "Div";
    case BinaryOp::kPow:
      return "Pow";
    case BinaryOp::kMin:
      return "Min";
    case BinaryOp::kMax:
      return "Max";
    case BinaryOp::kEqual:
      return "Equal";
    case BinaryOp::kLess:
      return "Less";
    case BinaryOp::kGreater:
      return "Greater";
    case BinaryOp::kAnd:
      return "And";
    case BinaryOp::kReluGrad:
      return "ReluGrad";
    case BinaryOp::kGreaterOrEqual:
      return "GreaterOrEqual";
    case BinaryOp::kLessOrEqual:
      return "LessOrEqual";
  }
  return "?";
}

const char* UnaryName(UnaryOp op) {
  static constexpr const char* kNames[] = {"Neg",  "Exp",        "Log", "Sqrt", "Tanh", "Erf", "Sigmoid",
                                           "Relu", "Reciprocal", "Abs", "Sin",  "Cos",  "Not"};
  return kNames[static_cast<int>(op)];
}

absl::Status CheckPointers(const char* what, int64_t n, const std::vector<const void*>& ptrs) {
  if (n < 0) return INVALID_ARGUMENT() << what << ": negative element count " << n;
  if (n == 0) return absl::OkStatus();
  for (const void* p : ptrs) {
    if (p == nullptr) return INVALID_ARGUMENT() << what << ": null device pointer for " << n << " elements";
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> BroadcastShape(const std::vector<std::vector<int64_t>>& shapes) {
  size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  std::vector<int64_t> out(rank, 1);
  for (const auto& s : shapes) {
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[rank - s.size() + i];
      if (s[i] < 0) return INVALID_ARGUMENT() << "broadcast: negative dim in " << DimsString(s);
      if (s[i] == o || s[i] == 1) continue;
      if (o != 1) {
        return INVALID_ARGUMENT() << "broadcast: dims " << DimsString(s) << " do not broadcast with " << DimsString(out)
                                  << " (numpy rules: equal or 1, right-aligned)";
      }
      o = s[i];
    }
  }
  return out;
}

absl::StatusOr<BroadcastIndex> MakeBroadcastIndex(const std::vector<std::vector<int64_t>>& shapes) {
  if (shapes.empty() || shapes.size() > 3) {
    return INVALID_ARGUMENT() << "broadcast: 1 to 3 operands, got " << shapes.size();
  }
  ASSIGN_OR_RETURN(const std::vector<int64_t> out, BroadcastShape(shapes));
  BroadcastIndex idx;
  idx.contiguous =
      std::all_of(shapes.begin(), shapes.end(), [&](const auto& s) { return NumElements(s) == NumElements(out); });
  if (idx.contiguous) return idx;
  // Per output dim (size-1 dims dropped): its extent and each operand's element stride.
  const size_t rank = out.size();
  std::vector<int64_t> dims;
  std::vector<std::vector<int64_t>> strides(shapes.size());
  std::vector<int64_t> running(shapes.size(), 1);
  for (size_t d = rank; d-- > 0;) {
    if (out[d] == 1) continue;
    dims.insert(dims.begin(), out[d]);
    for (size_t k = 0; k < shapes.size(); ++k) {
      const auto& s = shapes[k];
      const int64_t pos = static_cast<int64_t>(d) - static_cast<int64_t>(rank - s.size());
      const int64_t extent = pos >= 0 ? s[pos] : 1;
      strides[k].insert(strides[k].begin(), extent == 1 ? 0 : running[k]);
      running[k] *= extent;
    }
  }
  // Merge neighbours d, d+1 when every operand steps through them as one dim.
  std::vector<int64_t> mdims;
  std::vector<std::vector<int64_t>> mstrides(shapes.size());
  for (size_t d = 0; d < dims.size(); ++d) {
    bool merge = !mdims.empty();
    for (size_t k = 0; merge && k < shapes.size(); ++k) merge = mstrides[k].back() == strides[k][d] * dims[d];
    if (merge) {
      mdims.back() *= dims[d];
      for (size_t k = 0; k < shapes.size(); ++k) mstrides[k].back() = strides[k][d];
    } else {
      mdims.push_back(dims[d]);
      for (size_t k = 0; k < shapes.size(); ++k) mstrides[k].push_back(strides[k][d]);
    }
  }
  if (mdims.size() > kMaxBroadcastRank) {
    return INVALID_ARGUMENT() << "broadcast: output " << DimsString(out) << " needs " << mdims.size()
                              << " index dims after merging, at most " << kMaxBroadcastRank << " supported";
  }
  idx.rank = static_cast<int>(mdims.size());
  for (int d = 0; d < idx.rank; ++d) {
    idx.dims[d] = mdims[d];
    for (size_t k = 0; k < shapes.size(); ++k) idx.strides[k][d] = mstrides[k][d];
  }
  return idx;
}

absl::Status Binary(BinaryOp op, ir::DType dtype, const void* a, const std::vector<int64_t>& a_dims, const void* b,
                    const std::vector<int64_t>& b_dims, void* out, cudaStream_t stream) {
  const bool float_only = op == BinaryOp::kDiv || op == BinaryOp::kPow || op == BinaryOp::kReluGrad;
  const bool supported = op == BinaryOp::kAnd ? dtype == ir::DType::kBool
                         : float_only         ? IsFloat16Or32(dtype)
                                              : IsArith(dtype);
  if (!supported) {
    return INVALID_ARGUMENT() << BinaryName(op) << ": dtype " << ir::DTypeName(dtype) << " is not supported, expected "
                              << (op == BinaryOp::kAnd ? "bool"
                                  : float_only         ? "f32, bf16 or f16"
                                                       : "f32, bf16, f16, i64 or i32");
  }
  ASSIGN_OR_RETURN(const std::vector<int64_t> out_dims, BroadcastShape({a_dims, b_dims}));
  const int64_t n = NumElements(out_dims);
  RETURN_IF_ERROR(CheckPointers(BinaryName(op), n, {a, b, out}));
  ASSIGN_OR_RETURN(const BroadcastIndex idx, MakeBroadcastIndex({a_dims, b_dims}));
  CUDA_RETURN_IF_ERROR(LaunchBinary(op, dtype, a, b, out, n, idx, stream));
  return absl::OkStatus();
}

absl::Status Where(ir::DType dtype, const uint8_t* cond, const std::vector<int64_t>& cond_dims, const void* x,
                   const std::vector<int64_t>& x_dims, const void* y, const std::vector<int64_t>& y_dims, void* out,
                   cudaStream_t stream) {
  if (!IsArith(dtype)) {
    return INVALID_ARGUMENT() << "Where: dtype " << ir::DTypeName(dtype)
                              << " is not supported, expected f32, bf16, f16, i64 or i32";
  }
  ASSIGN_OR_RETURN(const std::vector<int64_t> out_dims, BroadcastShape({cond_dims, x_dims, y_dims}));
  const int64_t n = NumElements(out_dims);
  RETURN_IF_ERROR(CheckPointers("Where", n, {cond, x, y, out}));
  ASSIGN_OR_RETURN(const BroadcastIndex idx, MakeBroadcastIndex({cond_dims, x_dims, y_dims}));
  CUDA_RETURN_IF_ERROR(LaunchWhere(dtype, cond, x, y, out, n, idx, stream));
  return absl::OkStatus();
}

absl::Status Unary(UnaryOp op, ir::DType dtype, const void* x, void* y, int64_t n, cudaStream_t stream) {
  const bool integer_ok = op == UnaryOp::kNeg || op == UnaryOp::kRelu || op == UnaryOp::kAbs;
  const bool supported = op == UnaryOp::kNot ? dtype == ir::DType::kBool
                         : integer_ok        ? IsArith(dtype)
                                             : IsFloat16Or32(dtype);
  if (!supported) {
    return INVALID_ARGUMENT() << UnaryName(op) << ": dtype " << ir::DTypeName(dtype) << " is not supported, expected "
                              << (op == UnaryOp::kNot ? "bool"
                                  : integer_ok        ? "f32, bf16, f16, i64 or i32"
                                                      : "f32, bf16 or f16");
  }
  RETURN_IF_ERROR(CheckPointers(UnaryName(op), n, {x, y}));
  CUDA_RETURN_IF_ERROR(LaunchUnary(op, dtype, x, y, n, stream));
  return absl::OkStatus();
}

absl::Status Scale(ir::DType dtype, const void* x, float s, void* y, int64_t n, cudaStream_t stream) {
  if (!IsFloat16Or32(dtype)) {
    return INVALID_ARGUMENT() << "Scale: dtype " << ir::DTypeName(dtype)
                              << " is not supported, expected f32, bf16 or f16";
  }
  RETURN_IF_ERROR(CheckPointers("Scale", n, {x, y}));
  CUDA_RETURN_IF_ERROR(LaunchScale(dtype, x, s, y, n, stream));
  return absl::OkStatus();
}

absl::Status Cast(ir::DType from, const void* x, ir::DType to, void* y, int64_t n, cudaStream_t stream) {
  for (ir::DType t : {from, to}) {
    if (!IsArith(t) && t != ir::DType::kBool) {
      return INVALID_ARGUMENT() << "Cast: dtype " << ir::DTypeName(t)
                                << " is not supported, expected f32, bf16, f16, i64, i32 or bool";
    }
  }
  RETURN_IF_ERROR(CheckPointers("Cast", n, {x, y}));
  CUDA_RETURN_IF_ERROR(LaunchCast(from, x, to, y, n, stream));
  return absl::OkStatus();
}

absl::Status FlagNonFinite(ir::DType dtype, const void* x, int64_t n, uint32_t* flag, cudaStream_t stream) {
  if (!IsFloat16Or32(dtype)) {
    return INVALID_ARGUMENT() << "FlagNonFinite: dtype " << ir::DTypeName(dtype) << " is not f32, bf16 or f16";
  }
  if (flag == nullptr) return INVALID_ARGUMENT() << "FlagNonFinite: null flag pointer";
  RETURN_IF_ERROR(CheckPointers("FlagNonFinite", n, {x}));
  CUDA_RETURN_IF_ERROR(LaunchFlagNonFinite(dtype, x, n, flag, stream));
  return absl::OkStatus();
}

absl::Status Accumulate(ir::DType acc_dtype, void* acc, ir::DType x_dtype, const void* x, int64_t n,
                        cudaStream_t stream) {
  if (!IsFloat16Or32(acc_dtype) || !IsFloat16Or32(x_dtype)) {
    return INVALID_ARGUMENT() << "Accumulate: dtypes " << ir::DTypeName(acc_dtype) << " += " << ir::DTypeName(x_dtype)
                              << " not supported, expected f32, bf16 or f16 for both";
  }
  RETURN_IF_ERROR(CheckPointers("Accumulate", n, {acc, x}));
  CUDA_RETURN_IF_ERROR(LaunchAccumulate(acc_dtype, acc, x_dtype, x, n, stream));
  return absl::OkStatus();
}

absl::Status DenseSum(ir::DType dtype, const std::vector<const void*>& xs, void* out, int64_t n, cudaStream_t stream) {
  if (!IsFloat16Or32(dtype)) {
    return INVALID_ARGUMENT() << "Sum: dtype " << ir::DTypeName(dtype) << " not supported, expected f32, bf16 or f16";
  }
  const int k = static_cast<int>(xs.size());
  if (k < 1 || k > kMaxDenseSumInputs) {
    return INVALID_ARGUMENT() << "Sum: " << k << " operands, expected 1 to " << kMaxDenseSumInputs;
  }
  std::vector<const void*> all = xs;
  all.push_back(out);
  RETURN_IF_ERROR(CheckPointers("Sum", n, all));
  CUDA_RETURN_IF_ERROR(LaunchDenseSum(dtype, xs.data(), k, out, n, stream));
  return absl::OkStatus();
}

}  // namespace onnxpipe::cuda
