// Host side of the reduction family: plans (which dims are kept or reduced, merged where
// contiguous) and the checked Status wrapper.
#include "executor/cuda/reduce.h"

#include <algorithm>

#include "executor/cuda/cuda_status.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {
namespace {

// The plan for `in_dims` given which of its dims are reduced.
absl::StatusOr<ReducePlan> PlanFromFlags(const std::vector<int64_t>& in_dims, const std::vector<bool>& reduced) {
  const int rank = static_cast<int>(in_dims.size());
  std::vector<int64_t> strides(rank, 1);
  for (int d = rank - 2; d >= 0; --d) strides[d] = strides[d + 1] * in_dims[d + 1];
  ReducePlan p;
  int last_class = -1;  // class of the previous non-1 dim: 0 kept, 1 reduced
  for (int d = 0; d < rank; ++d) {
    if (in_dims[d] < 0) return INVALID_ARGUMENT() << "Reduce: negative dim " << in_dims[d] << " at axis " << d;
    if (reduced[d]) {
      p.num_reduced *= in_dims[d];
    } else {
      p.num_out *= in_dims[d];
    }
    if (in_dims[d] == 1) continue;
    const int cls = reduced[d] ? 1 : 0;
    int& n = cls ? p.reduced_rank : p.kept_rank;
    int64_t* dims = cls ? p.reduced_dims : p.kept_dims;
    int64_t* st = cls ? p.reduced_strides : p.kept_strides;
    if (cls == last_class) {  // contiguous with the previous dim of its class: merge
      dims[n - 1] *= in_dims[d];
      st[n - 1] = strides[d];
    } else {
      if (n == kMaxReduceRank) {
        return INVALID_ARGUMENT() << "Reduce: more than " << kMaxReduceRank << " alternating kept/reduced dim groups";
      }
      dims[n] = in_dims[d];
      st[n] = strides[d];
      ++n;
    }
    last_class = cls;
  }
  p.innermost_reduced = last_class == 1;
  return p;
}

}  // namespace

absl::StatusOr<ReducePlan> MakeReducePlan(const std::vector<int64_t>& in_dims, const std::vector<int64_t>& axes) {
  const int64_t rank = static_cast<int64_t>(in_dims.size());
  std::vector<bool> reduced(rank, axes.empty());
  for (int64_t a : axes) {
    if (a < -rank || a >= rank)
      return INVALID_ARGUMENT() << "Reduce: axis " << a << " is out of range for rank " << rank;
    const int64_t d = a < 0 ? a + rank : a;
    if (reduced[d]) return INVALID_ARGUMENT() << "Reduce: axis " << a << " is repeated";
    reduced[d] = true;
  }
  return PlanFromFlags(in_dims, reduced);
}

absl::StatusOr<ReducePlan> MakeReduceToShapePlan(const std::vector<int64_t>& in_dims,
                                                 const std::vector<int64_t>& like_dims) {
  const size_t rank = in_dims.size();
  if (like_dims.size() > rank) {
    return INVALID_ARGUMENT() << "ReduceToShape: target rank " << like_dims.size() << " exceeds the input's " << rank;
  }
  std::vector<bool> reduced(rank, false);
  for (size_t d = 0; d < rank; ++d) {
    const size_t lead = rank - like_dims.size();
    const int64_t like = d < lead ? 1 : like_dims[d - lead];
    if (like == in_dims[d]) continue;
    if (like != 1) {
      return INVALID_ARGUMENT() << "ReduceToShape: target dim " << like << " at axis " << d
                                << " neither equals the input's " << in_dims[d] << " nor is 1";
    }
    reduced[d] = true;
  }
  return PlanFromFlags(in_dims, reduced);
}

namespace {
// Threads that keep every SM of an H100/H200 busy with loads in flight (a constant, not the device's
// count, so that the summation order is the same on every GPU).
constexpr int64_t kTargetThreads = int64_t{1} << 18;
// Least reduced elements a thread sums before a slice is cut finer.
constexpr int64_t kMinPerThread = 16;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int PowerOfTwoAtMost(int64_t n) {
  int p = 1;
  while (int64_t{p} * 2 <= n) p *= 2;
  return p;
}
}  // namespace

ReduceGeometry GeometryOf(const ReducePlan& p, int elem_bytes, bool split) {
  ReduceGeometry g;
  if (p.num_out == 0 || p.num_reduced == 0) return g;
  const int full = 16 / elem_bytes;
  const int64_t run = p.innermost_reduced ? p.reduced_dims[p.reduced_rank - 1] : 0;
  g.rows = p.innermost_reduced && run >= 32;
  int64_t want = 1;  // reduced lanes per output (threads in columns, warps in rows) that fill the GPU
  if (g.rows) {
    g.vec = run % full == 0 ? full : 1;
    const int64_t per_warp = 32 * g.vec * kMinPerThread / 4;
    want =
        std::clamp<int64_t>(CeilDiv(kTargetThreads / 32, p.num_out), 1, std::max<int64_t>(1, p.num_reduced / per_warp));
    g.lanes = PowerOfTwoAtMost(std::min<int64_t>(want, kReduceBlock / 32));
  } else {
    const bool inner_kept = !p.innermost_reduced && p.kept_rank > 0;
    g.vec = inner_kept && p.kept_dims[p.kept_rank - 1] % full == 0 ? full : 1;
    want = std::clamp<int64_t>(CeilDiv(kTargetThreads, p.num_out / g.vec), 1,
                               std::max<int64_t>(1, p.num_reduced / kMinPerThread));
    // Without a workspace the block's lanes are all the split there is: allow narrow blocks.
    g.lanes = PowerOfTwoAtMost(std::min<int64_t>(want, split ? 8 : 64));
  }
  g.splits = split ? std::min<int64_t>(CeilDiv(want, g.lanes), 65535) : 1;
  const int64_t step = g.rows ? int64_t{32} * g.lanes * g.vec : 1;
  g.chunk = CeilDiv(CeilDiv(p.num_reduced, g.splits), step) * step;
  g.splits = CeilDiv(p.num_reduced, g.chunk);  // no empty slice
  return g;
}

int64_t ReduceWorkspaceBytes(const ReducePlan& plan, ir::DType x_dtype) {
  if (!ir::IsFloat(x_dtype)) return 0;  // integer sums never split
  const ReduceGeometry g = GeometryOf(plan, static_cast<int>(ir::DTypeSize(x_dtype)), /*split=*/true);
  return g.splits > 1 ? g.splits * plan.num_out * static_cast<int64_t>(sizeof(double)) : 0;
}

absl::Status Reduce(ReduceKind kind, const ReducePlan& plan, ir::DType x_dtype, const void* x, ir::DType y_dtype,
                    void* y, cudaStream_t stream, void* workspace, int64_t workspace_bytes) {
  const bool integers = x_dtype == ir::DType::kI64 || x_dtype == ir::DType::kI32;
  if (integers && (kind != ReduceKind::kSum || y_dtype != x_dtype)) {
    return INVALID_ARGUMENT() << "Reduce: " << ir::DTypeName(x_dtype) << " input: only a sum into "
                              << ir::DTypeName(x_dtype) << " is supported, got " << ir::DTypeName(y_dtype);
  }
  for (ir::DType t : {x_dtype, y_dtype}) {
    if (!integers && t != ir::DType::kF32 && t != ir::DType::kBF16 && t != ir::DType::kF16) {
      return INVALID_ARGUMENT() << "Reduce: dtype " << ir::DTypeName(t) << " is not f32, bf16 or f16 (or i64/i32 "
                                << "summed into their own dtype)";
    }
  }
  if (plan.num_out > 0 && (y == nullptr || (plan.num_reduced > 0 && x == nullptr))) {
    return INVALID_ARGUMENT() << "Reduce: null device pointer";
  }
  CUDA_RETURN_IF_ERROR(LaunchReduce(kind, plan, x_dtype, x, y_dtype, y, workspace, workspace_bytes, stream));
  return absl::OkStatus();
}

absl::Status CumSum(ir::DType dtype, const void* x, void* y, int64_t outer, int64_t n, int64_t inner, bool exclusive,
                    bool reverse, cudaStream_t stream) {
  if (dtype != ir::DType::kF32 && dtype != ir::DType::kBF16 && dtype != ir::DType::kF16 && dtype != ir::DType::kI64 &&
      dtype != ir::DType::kI32) {
    return INVALID_ARGUMENT() << "CumSum: dtype " << ir::DTypeName(dtype) << " is not f32, bf16, f16, i64 or i32";
  }
  if (outer < 0 || n < 0 || inner < 0) {
    return INVALID_ARGUMENT() << "CumSum: negative extent (" << outer << ", " << n << ", " << inner << ")";
  }
  if (outer * n * inner == 0) return absl::OkStatus();
  if (x == nullptr || y == nullptr) return INVALID_ARGUMENT() << "CumSum: null device pointer";
  CUDA_RETURN_IF_ERROR(LaunchCumSum(dtype, x, y, outer, n, inner, exclusive, reverse, stream));
  return absl::OkStatus();
}

}  // namespace onnxpipe::cuda
