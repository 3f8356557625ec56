// Elementwise kernels on the GPU: binary ops and Where with ONNX multidirectional (numpy)
// broadcasting, unary math, Cast, a non-finite detector and gradient accumulation.
//
// Tensors are dense row-major device buffers described by a dtype and dims. Arithmetic on the
// 16-bit floats (bf16, f16) computes in fp32 and rounds the result to nearest even.
//   Binary:  f32 bf16 f16 for the arithmetic ops, ReluGrad and comparisons; i64 i32 also for Add Sub Mul
//            (wrapping), Min Max and comparisons. Comparisons write bool (one byte, 0/1). Min/Max
//            propagate NaN (numpy.minimum). And: bool only.
//   Where:   cond bool; x, y and out of one dtype among f32 bf16 f16 i64 i32.
//   Unary:   f32 bf16 f16; Neg Relu Abs also i64 i32 (wrapping); Not: bool only.
//   Scale:   f32 bf16 f16, by an fp32 factor passed by value.
//   Cast:    between any two of f32 bf16 f16 i64 i32 bool, with the CPU backend's conversions
//            (through double; float -> integer truncates, saturates, NaN -> 0).
// The Status wrappers check dtypes, dims and pointers; the Launch* functions (callable from .cu
// code) only launch and return cudaErrorInvalidValue for a dtype they do not instantiate.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "frontend/ir/dtype.h"

#ifndef __CUDACC__
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#endif

namespace onnxpipe::cuda {

// kReluGrad: out = b > 0 ? a : 0 (ReluGrad(dY, Y)).
enum class BinaryOp {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kPow,
  kMin,
  kMax,
  kEqual,
  kLess,
  kGreater,
  kAnd,
  kReluGrad,
  kGreaterOrEqual,
  kLessOrEqual
};
enum class UnaryOp { kNeg, kExp, kLog, kSqrt, kTanh, kErf, kSigmoid, kRelu, kReciprocal, kAbs, kSin, kCos, kNot };

// Up to three operands indexed over one output shape: element o of the output reads operand k at
// sum_d index_d(o) * strides[k][d] (stride 0 along a broadcast dim). rank 0 with contiguous = true
// means every operand is dense with the output's element count (no index arithmetic).
constexpr int kMaxBroadcastRank = 8;
struct BroadcastIndex {
  int rank = 0;
  bool contiguous = true;
  int64_t dims[kMaxBroadcastRank] = {};
  int64_t strides[3][kMaxBroadcastRank] = {};
};

cudaError_t LaunchBinary(BinaryOp op, ir::DType dtype, const void* a, const void* b, void* out, int64_t n,
                         const BroadcastIndex& index, cudaStream_t stream);
// Operands in index order: cond, x, y.
cudaError_t LaunchWhere(ir::DType dtype, const uint8_t* cond, const void* x, const void* y, void* out, int64_t n,
                        const BroadcastIndex& index, cudaStream_t stream);
cudaError_t LaunchUnary(UnaryOp op, ir::DType dtype, const void* x, void* y, int64_t n, cudaStream_t stream);
cudaError_t LaunchScale(ir::DType dtype, const void* x, float s, void* y, int64_t n, cudaStream_t stream);
cudaError_t LaunchCast(ir::DType from, const void* x, ir::DType to, void* y, int64_t n, cudaStream_t stream);
cudaError_t LaunchFlagNonFinite(ir::DType dtype, const void* x, int64_t n, uint32_t* flag, cudaStream_t stream);
cudaError_t LaunchAccumulate(ir::DType acc_dtype, void* acc, ir::DType x_dtype, const void* x, int64_t n,
                             cudaStream_t stream);
// out = xs[0] + ... + xs[k-1] over n dense elements of one float dtype, added in fp32 from the left
// and rounded once (the chain of Accumulates into an fp32 buffer, then a Cast); 1 <= k <= kMaxDenseSumInputs.
constexpr int kMaxDenseSumInputs = 8;
cudaError_t LaunchDenseSum(ir::DType dtype, const void* const* xs, int k, void* out, int64_t n, cudaStream_t stream);

#ifndef __CUDACC__
// The broadcast of the given shapes (numpy rules), or an error naming the clashing dims.
absl::StatusOr<std::vector<int64_t>> BroadcastShape(const std::vector<std::vector<int64_t>>& shapes);
// The index of operands `shapes` (at most three) read over their broadcast shape, with size-1
// dims dropped and mergeable neighbours merged; an error when more than kMaxBroadcastRank dims
// remain.
absl::StatusOr<BroadcastIndex> MakeBroadcastIndex(const std::vector<std::vector<int64_t>>& shapes);

// out = op(a, b) over BroadcastShape({a_dims, b_dims}); out is dtype's buffer (bool for
// comparisons) of that shape's element count.
absl::Status Binary(BinaryOp op, ir::DType dtype, const void* a, const std::vector<int64_t>& a_dims, const void* b,
                    const std::vector<int64_t>& b_dims, void* out, cudaStream_t stream);
// out = cond ? x : y over the broadcast of the three shapes.
absl::Status Where(ir::DType dtype, const uint8_t* cond, const std::vector<int64_t>& cond_dims, const void* x,
                   const std::vector<int64_t>& x_dims, const void* y, const std::vector<int64_t>& y_dims, void* out,
                   cudaStream_t stream);
// y = op(x), n elements (y may alias x).
absl::Status Unary(UnaryOp op, ir::DType dtype, const void* x, void* y, int64_t n, cudaStream_t stream);
// y = x * s (fp32 product, rounded once to dtype's), n elements of f32 bf16 f16 (y may alias x).
absl::Status Scale(ir::DType dtype, const void* x, float s, void* y, int64_t n, cudaStream_t stream);
// y = x converted from `from` to `to`, n elements.
absl::Status Cast(ir::DType from, const void* x, ir::DType to, void* y, int64_t n, cudaStream_t stream);
// Sets *flag (a device uint32) to 1 when any of the n elements of x (a float dtype) is NaN or
// infinite; leaves it untouched otherwise, so one zeroed flag can cover many tensors.
absl::Status FlagNonFinite(ir::DType dtype, const void* x, int64_t n, uint32_t* flag, cudaStream_t stream);
// acc[i] += x[i] over n elements, computed in fp32 and rounded to acc's dtype (f32 bf16 f16 for
// both; the usual case is an f32 gradient accumulator and a bf16 or f32 micro-batch gradient).
absl::Status Accumulate(ir::DType acc_dtype, void* acc, ir::DType x_dtype, const void* x, int64_t n,
                        cudaStream_t stream);
// out = the sum of the n-element operands xs (one float dtype, 1 to kMaxDenseSumInputs of them), in
// fp32 from the left, rounded once.
absl::Status DenseSum(ir::DType dtype, const std::vector<const void*>& xs, void* out, int64_t n, cudaStream_t stream);
#endif

}  // namespace onnxpipe::cuda
