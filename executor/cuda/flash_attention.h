// Fused attention in fp32 (and fp64) and bf16 on the GPU, FlashAttention-2 style (Dao, 2023): the
// Sq x Sk scores never exist in global memory. Semantics are exactly the CPU backend's Attention and
// AttentionGrad (executor/cpu/attention.cc, grad_attention.cc, frontend/ir/op.h):
//   O = dropout(softmax(scale * Q K^T + mask [causal: key j visible from query i iff j <= i])) V
// - Q (..., Sq, Dh), K (..., Sk, Dh), V (..., Sk, Dv): dense row-major, batch dims broadcast among
//   them (numpy rules) or K and V have fewer heads (dim -3) than Q, a divisor (grouped-query
//   attention, op.h: query head h reads K/V head h / (Hq / Hkv)); O and dO are (batch..., Sq, Dv)
//   over the broadcast batch. Each of Q, K, V
//   and O (dO with O's) may instead have element strides (FlashAttentionConfig::q_strides, ...):
//   a strided view of a larger buffer (a packed QKV projection), the last stride 1.
// - mask (optional) broadcasts to (batch..., Sq, Sk): additive (the inputs' dtype) or bool (one
//   byte, nonzero = attend). scale defaults to 1/sqrt(Dh). A row whose keys are all masked gives
//   zeros (O, and no gradient), not NaN.
// - dropout on the probabilities: element (b, i, j) is kept iff the CPU's stream keeps counter
//   counter_base + (b * Sq + i) * Sk + j (b the flat batch index), scaled by 1 / (1 - ratio)
//   rounded to the dtype, active only while training with ratio > 0 (dropout.h's DropoutParams).
// - dQ, dK, dV have the shapes of Q, K, V: gradients of broadcast operands are summed over the
//   broadcast dims (the CPU's ReduceToDims), through Reduce (reduce.h) on the device; grouped K and
//   V get dK and dV summed over their group's query heads by the dK/dV kernel itself (each CTA
//   walks the group's heads in order: no atomics, the same bits every run). The gradient
//   of an operand with strides is written with that operand's strides (it may not broadcast).
// Arithmetic: fp32 FMAs with fp32 accumulation (no TF32); online softmax with the running row
// maximum, exponentials through exp2. Deterministic: no atomics, fixed summation order.
// bf16 (flash_attention_bf16_*.cu): Q, K, V, dO, an additive mask, O, dQ, dK, dV in bf16; the
// products on tensor cores (mma.sync, bf16 operands, fp32 accumulation), the probabilities and dS
// rounded to bf16 as operands of the second product, softmax and statistics in fp32; the same
// tiles, passes and dropout stream as the fp32 kernels.
//
// Kernels (flash_attention_fwd.cu, flash_attention_bwd.cu): per 64-query tile, the forward loops
// over 64-key tiles held in shared memory. The backward recomputes, as AttentionGrad gets neither
// O nor softmax statistics: a kernel per 64-query tile computes the row statistics (maximum, 1 /
// sum, D_i = dO_i . O_i with the forward's dropout) in a first pass over the keys and dQ in a
// second; a kernel per 64-key tile computes dK and dV over the query tiles from those statistics,
// which live in the workspace between the two.
// Limits: max(Dh, Dv) <= 128 for fp32 and bf16, <= 64 for fp64 (the tiles live in shared memory); at most
// kFlashMaxBatchRank batch dims; fp64 gradients of broadcast operands are not summed (Reduce is
// fp32/16-bit only): PlanFlashAttention reports all of these.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "executor/cpu/philox.h"
#include "frontend/ir/dtype.h"

#ifndef __CUDACC__
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "executor/cuda/dropout.h"
#endif

namespace onnxpipe::cuda {

constexpr int kFlashMaxBatchRank = 8;
enum class FlashMask : int { kNone = 0, kAdditive = 1, kBool = 2 };

// Everything the kernels need besides the buffers (plain data, passed by value).
struct FlashGeometry {
  int64_t sq = 0, sk = 0, dh = 0, dv = 0;
  int64_t nbatch = 1;  // product of batch_dims
  int batch_rank = 0;
  int64_t batch_dims[kFlashMaxBatchRank] = {};
  // Grouped-query attention: query heads per K/V head (ir::AttentionKvGroup; 1 otherwise). The last
  // batch dim's index h reads K, V (and writes dK, dV) at h / kv_group; the batch matrices of one
  // group are kv_group consecutive flat indices.
  int64_t kv_group = 1;
  // Element offset of one step along batch dim d in each operand (0 where it broadcasts), in O and
  // dO, and in the gradients dQ, dK, dV as the kernels write them.
  int64_t q_stride[kFlashMaxBatchRank] = {}, k_stride[kFlashMaxBatchRank] = {}, v_stride[kFlashMaxBatchRank] = {},
          mask_stride[kFlashMaxBatchRank] = {}, o_stride[kFlashMaxBatchRank] = {};
  int64_t dq_stride[kFlashMaxBatchRank] = {}, dk_stride[kFlashMaxBatchRank] = {}, dv_stride[kFlashMaxBatchRank] = {};
  // Row strides (leading dimensions): elements between consecutive rows, along Sq for Q, O, dO and
  // dQ, along Sk for K, V, dK and dV. Dense: Dh or Dv (PlanFlashAttention sets them).
  int64_t q_ld = 0, k_ld = 0, v_ld = 0, o_ld = 0, dq_ld = 0, dk_ld = 0, dv_ld = 0;
  FlashMask mask = FlashMask::kNone;
  int64_t mask_row_stride = 0, mask_col_stride = 0;  // along Sq and Sk (0 where the mask broadcasts)
  bool causal = false;
  double scale = 1.0;
  // Dropout: active, the keep scale 1 / (1 - ratio) (0 when ratio = 1), the node's stream, and the
  // counter of element (0, 0, 0). device_offset: as DropoutParams::device_offset.
  bool dropout = false;
  double drop_scale = 1.0;
  cpu::DropoutStream stream = {};
  const uint64_t* device_offset = nullptr;
  uint64_t counter_base = 0;
  // Head dims padded to the kernels' tile width: 32, 64 or 128 (bf16: 64 or 128).
  int head_tile = 64;
  // The forward's optional Stats output (nbatch, Sq) f32, contiguous: each row's natural-log
  // log-sum-exp of its scaled, masked scores (-inf when every key is masked); null: not written.
  float* lse = nullptr;
};

// Raw launches (callable from .cu code): dtype f32, f64 or bf16, cudaErrorInvalidValue for anything
// the kernels do not cover. Pointers to the buffers laid out as the geometry says; o, d_o
// (batch..., Sq, Dv) with O's strides.
cudaError_t LaunchFlashAttentionForward(ir::DType dtype, const FlashGeometry& g, const void* q, const void* k,
                                        const void* v, const void* mask, void* o, cudaStream_t stream);
// dq, dk, dv over the FULL batch ((batch..., Sq, Dh), (batch..., Sk, Dh), (batch..., Sk, Dv)) with
// the geometry's gradient strides, each null when not wanted. stats: 3 * nbatch * Sq elements of
// the dtype (fp32 for bf16), needed (else null) when dk or dv is wanted.
cudaError_t LaunchFlashAttentionBackward(ir::DType dtype, const FlashGeometry& g, const void* d_o, const void* q,
                                         const void* k, const void* v, const void* mask, void* dq, void* dk, void* dv,
                                         void* stats, cudaStream_t stream);

// The gradient of an additive mask (a learned bias: AttentionGrad's dMask, op.h) added into `dmask`
// (fp32, the mask's elements, zeroed by the caller): each row's dS recomputed from Q, K, V and dO
// (attention_mask_grad.cu), summed over the dims where the mask broadcasts by atomics (the order of
// the sum varies between runs). dtype f32 or bf16.
cudaError_t LaunchAttentionMaskGradient(ir::DType dtype, const FlashGeometry& g, const void* d_o, const void* q,
                                        const void* k, const void* v, const void* mask, float* dmask,
                                        cudaStream_t stream);

#ifndef __CUDACC__

struct FlashAttentionConfig {
  ir::DType dtype = ir::DType::kF32;  // f32, f64 or bf16
  std::vector<int64_t> q_dims, k_dims, v_dims;
  FlashMask mask = FlashMask::kNone;
  std::vector<int64_t> mask_dims;
  std::optional<double> scale;  // default 1/sqrt(Dh) (1 when Dh = 0), as the CPU op
  bool causal = false;
  DropoutParams dropout = {.ratio = 0.0};  // training && ratio > 0: active
  // Element strides of Q, K, V (over q_dims, k_dims, v_dims) and of O and dO (over the plan's
  // out_dims); empty: dense row-major. Non-negative, the last 1.
  std::vector<int64_t> q_strides, k_strides, v_strides, o_strides;
};

// A validated config with its derived shapes.
struct FlashAttentionPlan {
  FlashAttentionConfig config;
  std::vector<int64_t> batch;     // the broadcast batch dims
  std::vector<int64_t> out_dims;  // O: (batch..., Sq, Dv)
  // dQ, dK, dV over the full batch (dK, dV with K's grouped heads); an operand whose dims differ was
  // broadcast.
  std::vector<int64_t> full_grad_dims[3];
  // dQ, dK, dV written with their operand's strides (the config gave them): in place, never summed.
  bool strided_grad[3] = {false, false, false};
  FlashGeometry geometry;
};

// An error naming the problem for shapes that do not fit together (as the CPU op), a mask that does
// not broadcast, dropout ratio outside [0, 1], a dtype other than f32/f64/bf16, strides of the wrong
// rank, negative or with a last stride other than 1, or the limits above.
absl::StatusOr<FlashAttentionPlan> PlanFlashAttention(const FlashAttentionConfig& config);

// Scratch bytes FlashAttentionBackward takes for these wanted gradients: the row statistics (when
// dK or dV is wanted) and full-batch copies of the gradients of broadcast (dense) operands, in
// 256-byte aligned parts.
int64_t FlashAttentionBackwardWorkspaceBytes(const FlashAttentionPlan& plan, bool want_dq, bool want_dk, bool want_dv);

// o: (batch..., Sq, Dv) with o_strides. mask: null iff config.mask is kNone.
absl::Status FlashAttentionForward(const FlashAttentionPlan& plan, const void* q, const void* k, const void* v,
                                   const void* mask, void* o, cudaStream_t stream);

// d_o with o_strides. A wanted gradient of an operand with strides must not be broadcast (an error).
struct FlashBackwardBuffers {
  const void *d_o = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *mask = nullptr;
  // The operands' dims (and strides, where they have them); null: not wanted.
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
  void* workspace = nullptr;  // FlashAttentionBackwardWorkspaceBytes bytes
  int64_t workspace_bytes = 0;
};
absl::Status FlashAttentionBackward(const FlashAttentionPlan& plan, const FlashBackwardBuffers& b, cudaStream_t stream);
// Scratch bytes AttentionMaskGradient takes: an fp32 sum of the mask's elements unless dMask is fp32.
int64_t AttentionMaskGradientWorkspaceBytes(const FlashAttentionPlan& plan);
// dMask of the plan's additive mask (f32 or bf16, else an error) into `dmask` (the mask's dims and
// dtype), from b's d_o, q, k, v and mask.
absl::Status AttentionMaskGradient(const FlashAttentionPlan& plan, const FlashBackwardBuffers& b, void* dmask,
                                   void* workspace, int64_t workspace_bytes, cudaStream_t stream);

#endif

}  // namespace onnxpipe::cuda
