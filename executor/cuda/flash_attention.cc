// Host side of the fused attention: shape checks and the operands' batch and row strides (broadcast
// by the same rules and messages as the CPU kernels, or given as views' strides), the backward's
// workspace layout, and the summing of broadcast operands' gradients (Reduce over the full-batch
// gradient the kernels write into the workspace).
#include "executor/cuda/flash_attention.h"

#include <cmath>

#include "executor/cuda/cuda_status.h"
#include "executor/cuda/elementwise.h"
#include "executor/cuda/reduce.h"
#include "frontend/ir/attention_views.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {
namespace {

std::string Dims(const std::vector<int64_t>& d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + ")";
}

// Element strides of a dense tensor of `dims` read as broadcast to `rank` dims (right-aligned):
// 0 along dims it does not have or has as 1.
std::vector<int64_t> BroadcastStrides(const std::vector<int64_t>& dims, size_t rank) {
  std::vector<int64_t> strides(rank, 0);
  int64_t s = 1;
  for (size_t k = 0; k < dims.size(); ++k) {
    const size_t od = dims.size() - 1 - k, d = rank - 1 - k;
    strides[d] = dims[od] == 1 ? 0 : s;
    s *= dims[od];
  }
  return strides;
}

// Where an operand's batch matrices and their rows lie in its buffer: the element step along each
// of the `br` broadcast batch dims (0 where the operand broadcasts) and between rows.
struct MatrixLayout {
  std::vector<int64_t> batch;
  int64_t ld = 0;
};

// A tensor of `dims` (rank >= 2), dense row-major when `strides` is empty, else read with them.
MatrixLayout MatrixLayoutOf(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides, size_t br) {
  const size_t r = dims.size();
  MatrixLayout m;
  if (strides.empty()) {
    m.batch = BroadcastStrides(std::vector<int64_t>(dims.begin(), dims.end() - 2), br);
    for (int64_t& s : m.batch) s *= dims[r - 2] * dims[r - 1];
    m.ld = dims[r - 1];
    return m;
  }
  m.batch.assign(br, 0);
  for (size_t d = 0; d + 2 < r; ++d) {
    if (dims[d] != 1) m.batch[br - (r - 2) + d] = strides[d];
  }
  m.ld = strides[r - 2];
  return m;
}

// Stores `m` into a geometry's batch strides (kFlashMaxBatchRank entries) and row stride.
void SetLayout(const MatrixLayout& m, int64_t* batch, int64_t& ld) {
  for (size_t d = 0; d < m.batch.size(); ++d) batch[d] = m.batch[d];
  ld = m.ld;
}

// Strides of `what` (empty: dense) fit `dims`: one per dim, none negative, the last 1.
absl::Status CheckStrides(const char* what, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides) {
  if (strides.empty()) return absl::OkStatus();
  if (strides.size() != dims.size()) {
    return INVALID_ARGUMENT() << "flash attention: " << what << " strides " << Dims(strides) << " for dims "
                              << Dims(dims) << ", expected one per dim";
  }
  if (strides.back() != 1) {
    return INVALID_ARGUMENT() << "flash attention: " << what << " strides " << Dims(strides)
                              << ": the last stride must be 1";
  }
  for (int64_t s : strides) {
    if (s < 0) {
      return INVALID_ARGUMENT() << "flash attention: " << what << " strides " << Dims(strides) << " are negative";
    }
  }
  return absl::OkStatus();
}

// A null pointer for a buffer that has elements.
bool Missing(const void* p, const std::vector<int64_t>& dims) { return p == nullptr && ir::ElementCount(dims) > 0; }

std::vector<int64_t> BatchOf(const std::vector<int64_t>& d) { return std::vector<int64_t>(d.begin(), d.end() - 2); }

constexpr int64_t kPartAlign = 256;
int64_t Part(int64_t bytes) { return (bytes + kPartAlign - 1) / kPartAlign * kPartAlign; }

// Where the backward's scratch lives: row statistics, then the full-batch gradients that need a
// reduction (offset -1: the kernel writes the output directly, or it is not wanted).
struct BackwardLayout {
  int64_t stats = -1;
  int64_t full[3] = {-1, -1, -1};
  int64_t total = 0;
};

BackwardLayout LayoutOf(const FlashAttentionPlan& p, const bool (&want)[3]) {
  const int64_t esize = ir::DTypeSize(p.config.dtype);
  const int64_t stat_size = p.config.dtype == ir::DType::kBF16 ? 4 : esize;  // bf16 kernels: fp32 statistics
  const std::vector<int64_t>* dims[3] = {&p.config.q_dims, &p.config.k_dims, &p.config.v_dims};
  BackwardLayout l;
  if (want[1] || want[2]) {
    l.stats = l.total;
    l.total += Part(3 * p.geometry.nbatch * p.geometry.sq * stat_size);
  }
  for (int i = 0; i < 3; ++i) {
    const int64_t n = ir::ElementCount(p.full_grad_dims[i]);
    // Same elements, or strides (never summed): the kernel writes the output.
    if (!want[i] || p.strided_grad[i] || n == ir::ElementCount(*dims[i])) continue;
    l.full[i] = l.total;
    l.total += Part(n * esize);
  }
  return l;
}

}  // namespace

absl::StatusOr<FlashAttentionPlan> PlanFlashAttention(const FlashAttentionConfig& c) {
  if (c.dtype != ir::DType::kF32 && c.dtype != ir::DType::kF64 && c.dtype != ir::DType::kBF16) {
    return INVALID_ARGUMENT() << "flash attention: dtype " << ir::DTypeName(c.dtype) << " is not f32, f64 or bf16";
  }
  const std::vector<int64_t>* in[3] = {&c.q_dims, &c.k_dims, &c.v_dims};
  const std::vector<int64_t>* in_strides[3] = {&c.q_strides, &c.k_strides, &c.v_strides};
  const char* const names[3] = {"Q", "K", "V"};
  for (int i = 0; i < 3; ++i) {
    if (in[i]->size() < 2) {
      return INVALID_ARGUMENT() << "flash attention: input " << i << " must have rank >= 2, got " << Dims(*in[i]);
    }
    RETURN_IF_ERROR(CheckStrides(names[i], *in[i], *in_strides[i]));
  }
  const int64_t sq = c.q_dims.end()[-2], dh = c.q_dims.back();
  const int64_t sk = c.k_dims.end()[-2], dv = c.v_dims.back();
  if (c.k_dims.back() != dh || c.v_dims.end()[-2] != sk) {
    return INVALID_ARGUMENT() << "flash attention: expected Q (..., Sq, Dh), K (..., Sk, Dh), V (..., Sk, Dv), got "
                              << Dims(c.q_dims) << ", " << Dims(c.k_dims) << ", " << Dims(c.v_dims);
  }
  FlashAttentionPlan p;
  p.config = c;
  const int64_t group = ir::AttentionKvGroup(c.q_dims, c.k_dims, c.v_dims);
  ASSIGN_OR_RETURN(p.batch, BroadcastShape({BatchOf(c.q_dims), ir::UngroupedBatch(BatchOf(c.k_dims), group),
                                            ir::UngroupedBatch(BatchOf(c.v_dims), group)}));
  const size_t br = p.batch.size();
  if (br > kFlashMaxBatchRank) {
    return UNIMPLEMENTED() << "flash attention: " << br << " batch dims, at most " << kFlashMaxBatchRank;
  }
  auto with_batch = [&](int64_t a, int64_t b, int64_t heads_over = 1) {
    std::vector<int64_t> d = p.batch;
    if (heads_over > 1) d.back() /= heads_over;  // grouped K, V: their own heads
    d.push_back(a);
    d.push_back(b);
    return d;
  };
  p.out_dims = with_batch(sq, dv);
  p.full_grad_dims[0] = with_batch(sq, dh);
  p.full_grad_dims[1] = with_batch(sk, dh, group);
  p.full_grad_dims[2] = with_batch(sk, dv, group);
  RETURN_IF_ERROR(CheckStrides("O", p.out_dims, c.o_strides));

  const int64_t head = std::max(dh, dv);
  const int64_t max_head = c.dtype == ir::DType::kF64 ? 64 : 128;
  if (head > max_head) {
    return UNIMPLEMENTED() << "flash attention: head dims " << dh << " and " << dv << " exceed the " << max_head
                           << " the " << ir::DTypeName(c.dtype) << " kernels hold in shared memory";
  }
  const double ratio = c.dropout.ratio;
  if (!(ratio >= 0.0 && ratio <= 1.0)) {
    return INVALID_ARGUMENT() << "flash attention: dropout is " << ratio << ", expected [0, 1]";
  }

  FlashGeometry& g = p.geometry;
  g.sq = sq, g.sk = sk, g.dh = dh, g.dv = dv;
  g.nbatch = ir::ElementCount(p.batch);
  g.batch_rank = static_cast<int>(br);
  g.kv_group = group;
  for (size_t d = 0; d < br; ++d) g.batch_dims[d] = p.batch[d];
  int64_t* operand_strides[3] = {g.q_stride, g.k_stride, g.v_stride};
  int64_t* grad_strides[3] = {g.dq_stride, g.dk_stride, g.dv_stride};
  int64_t* operand_ld[3] = {&g.q_ld, &g.k_ld, &g.v_ld};
  int64_t* grad_ld[3] = {&g.dq_ld, &g.dk_ld, &g.dv_ld};
  for (int i = 0; i < 3; ++i) {
    const MatrixLayout m = MatrixLayoutOf(*in[i], *in_strides[i], br);
    SetLayout(m, operand_strides[i], *operand_ld[i]);
    // A strided operand's gradient goes where the operand came from; a dense one's over the full
    // batch (summed afterwards where the operand broadcasts).
    p.strided_grad[i] = !in_strides[i]->empty();
    SetLayout(p.strided_grad[i] ? m : MatrixLayoutOf(p.full_grad_dims[i], {}, br), grad_strides[i], *grad_ld[i]);
  }
  SetLayout(MatrixLayoutOf(p.out_dims, c.o_strides, br), g.o_stride, g.o_ld);
  g.mask = c.mask;
  if (c.mask != FlashMask::kNone) {
    const std::vector<int64_t> full = with_batch(sq, sk);
    absl::StatusOr<std::vector<int64_t>> md = BroadcastShape({c.mask_dims, full});
    if (!md.ok() || *md != full) {
      return INVALID_ARGUMENT() << "flash attention: mask of shape " << Dims(c.mask_dims) << " does not broadcast to "
                                << Dims(full);
    }
    const std::vector<int64_t> ms = BroadcastStrides(c.mask_dims, full.size());
    for (size_t d = 0; d < br; ++d) g.mask_stride[d] = ms[d];
    g.mask_row_stride = ms[br];
    g.mask_col_stride = ms[br + 1];
  }
  g.causal = c.causal;
  g.scale = c.scale.value_or(dh > 0 ? 1.0 / std::sqrt(static_cast<double>(dh)) : 1.0);
  g.dropout = c.dropout.training && ratio > 0.0;
  g.drop_scale = g.dropout ? (ratio >= 1.0 ? 0.0 : 1.0 / (1.0 - ratio)) : 1.0;
  g.stream = cpu::DropoutStream::Make(c.dropout.seed, c.dropout.node_key, c.dropout.offset, ratio);
  g.device_offset = c.dropout.device_offset;
  g.counter_base = c.dropout.counter_base;
  g.head_tile = head <= 32 && c.dtype != ir::DType::kBF16 ? 32 : head <= 64 ? 64 : 128;
  return p;
}

int64_t FlashAttentionBackwardWorkspaceBytes(const FlashAttentionPlan& plan, bool want_dq, bool want_dk,
                                             bool want_dv) {
  const bool want[3] = {want_dq, want_dk, want_dv};
  return LayoutOf(plan, want).total;
}

absl::Status FlashAttentionForward(const FlashAttentionPlan& plan, const void* q, const void* k, const void* v,
                                   const void* mask, void* o, cudaStream_t stream) {
  const FlashGeometry& g = plan.geometry;
  const FlashAttentionConfig& c = plan.config;
  if (ir::ElementCount(plan.out_dims) == 0) return absl::OkStatus();
  if (Missing(q, c.q_dims) || Missing(k, c.k_dims) || Missing(v, c.v_dims) || o == nullptr ||
      (g.mask != FlashMask::kNone && Missing(mask, c.mask_dims))) {
    return INVALID_ARGUMENT() << "FlashAttentionForward: null device pointer";
  }
  CUDA_RETURN_IF_ERROR(LaunchFlashAttentionForward(plan.config.dtype, g, q, k, v, mask, o, stream));
  return absl::OkStatus();
}

absl::Status FlashAttentionBackward(const FlashAttentionPlan& plan, const FlashBackwardBuffers& b,
                                    cudaStream_t stream) {
  const FlashGeometry& g = plan.geometry;
  const bool want[3] = {b.dq != nullptr, b.dk != nullptr, b.dv != nullptr};
  const BackwardLayout layout = LayoutOf(plan, want);
  if (b.workspace_bytes < layout.total || (layout.total > 0 && b.workspace == nullptr)) {
    return INVALID_ARGUMENT() << "FlashAttentionBackward: workspace of " << b.workspace_bytes << " bytes"
                              << (b.workspace == nullptr ? " (null)" : "") << ", expected " << layout.total;
  }
  const FlashAttentionConfig& c = plan.config;
  if (Missing(b.d_o, plan.out_dims) || Missing(b.q, c.q_dims) || Missing(b.k, c.k_dims) || Missing(b.v, c.v_dims) ||
      (g.mask != FlashMask::kNone && Missing(b.mask, c.mask_dims))) {
    return INVALID_ARGUMENT() << "FlashAttentionBackward: null device pointer";
  }
  const std::vector<int64_t>* dims[3] = {&c.q_dims, &c.k_dims, &c.v_dims};
  for (int i = 0; i < 3; ++i) {
    // Written through the operand's strides, a broadcast operand's matrices would overwrite each other.
    if (want[i] && plan.strided_grad[i] && ir::ElementCount(plan.full_grad_dims[i]) != ir::ElementCount(*dims[i])) {
      return INVALID_ARGUMENT() << "FlashAttentionBackward: input " << i << " of dims " << Dims(*dims[i])
                                << " has strides and is broadcast to " << Dims(plan.full_grad_dims[i])
                                << ": its gradient cannot be written in place";
    }
  }
  uint8_t* ws = static_cast<uint8_t*>(b.workspace);
  void* out[3] = {b.dq, b.dk, b.dv};
  void* full[3];
  for (int i = 0; i < 3; ++i) full[i] = layout.full[i] >= 0 ? ws + layout.full[i] : out[i];
  if (plan.config.dtype == ir::DType::kF64 && (layout.full[0] >= 0 || layout.full[1] >= 0 || layout.full[2] >= 0)) {
    return UNIMPLEMENTED() << "FlashAttentionBackward: summing the gradient of a broadcast operand in "
                           << ir::DTypeName(plan.config.dtype);
  }
  // A gradient with no elements needs no kernel (its pointer may be null).
  for (int i = 0; i < 3; ++i) {
    if (ir::ElementCount(plan.full_grad_dims[i]) == 0) full[i] = nullptr;
  }
  void* stats = layout.stats >= 0 ? ws + layout.stats : nullptr;
  CUDA_RETURN_IF_ERROR(LaunchFlashAttentionBackward(plan.config.dtype, g, b.d_o, b.q, b.k, b.v, b.mask, full[0],
                                                    full[1], full[2], stats, stream));
  for (int i = 0; i < 3; ++i) {
    const int64_t n = ir::ElementCount(*dims[i]);
    if (layout.full[i] < 0 || n == 0) continue;
    if (ir::ElementCount(plan.full_grad_dims[i]) == 0) {  // broadcast against an empty batch: nothing to sum
      CUDA_RETURN_IF_ERROR(cudaMemsetAsync(out[i], 0, n * ir::DTypeSize(plan.config.dtype), stream));
      continue;
    }
    ASSIGN_OR_RETURN(const ReducePlan rp, MakeReduceToShapePlan(plan.full_grad_dims[i], *dims[i]));
    RETURN_IF_ERROR(Reduce(ReduceKind::kSum, rp, plan.config.dtype, full[i], plan.config.dtype, out[i], stream));
  }
  return absl::OkStatus();
}

int64_t AttentionMaskGradientWorkspaceBytes(const FlashAttentionPlan& plan) {
  if (plan.config.dtype == ir::DType::kF32) return 0;
  return ir::ElementCount(plan.config.mask_dims) * static_cast<int64_t>(sizeof(float));
}

absl::Status AttentionMaskGradient(const FlashAttentionPlan& plan, const FlashBackwardBuffers& b, void* dmask,
                                   void* workspace, int64_t workspace_bytes, cudaStream_t stream) {
  const FlashAttentionConfig& c = plan.config;
  if (c.mask != FlashMask::kAdditive || (c.dtype != ir::DType::kF32 && c.dtype != ir::DType::kBF16)) {
    return UNIMPLEMENTED() << "AttentionMaskGradient: the gradient of a mask that is not additive f32 or bf16";
  }
  const int64_t n = ir::ElementCount(c.mask_dims);
  if (workspace_bytes < AttentionMaskGradientWorkspaceBytes(plan) || (n > 0 && dmask == nullptr)) {
    return INVALID_ARGUMENT() << "AttentionMaskGradient: workspace of " << workspace_bytes << " bytes, expected "
                              << AttentionMaskGradientWorkspaceBytes(plan) << (dmask == nullptr ? ", null dMask" : "");
  }
  if (n == 0) return absl::OkStatus();
  float* sum = c.dtype == ir::DType::kF32 ? static_cast<float*>(dmask) : static_cast<float*>(workspace);
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(sum, 0, n * sizeof(float), stream));
  CUDA_RETURN_IF_ERROR(
      LaunchAttentionMaskGradient(c.dtype, plan.geometry, b.d_o, b.q, b.k, b.v, b.mask, sum, stream));
  if (c.dtype != ir::DType::kF32) CUDA_RETURN_IF_ERROR(LaunchCast(ir::DType::kF32, sum, c.dtype, dmask, n, stream));
  return absl::OkStatus();
}

}  // namespace onnxpipe::cuda
