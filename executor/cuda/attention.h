// Fused attention forward and backward on the GPU through cuDNN's SDPA graphs (built with the cuDNN
// frontend), with the semantics of the CPU backend's Attention / AttentionGrad ops
// (frontend/ir/op.h, executor/cpu/attention.cc):
//   O = dropout(softmax(scale * Q K^T + mask [causal: key j visible from query i iff j <= i])) V
// The S x S scores never exist in memory: the forward keeps per row only the softmax statistic
//   stats[b, h, i] = log(sum_j exp(s_ij)),  s_ij = scale * q_i . k_j + mask_ij  over the visible j
// (fp32, natural log), and the backward recomputes the probabilities from Q, K and stats.
//
// Layout: Q (B, H, Sq, Dh), K (B, Hkv, Sk, Dh), V (B, Hkv, Sk, Dv), O and dO (B, H, Sq, Dv), contiguous
// or with the config's strides, stats (B, H, Sq); Hkv divides H (Hkv = 1 is the CPU op's head-broadcast K/V; dK and dV come back
// summed over the heads that share them, as the CPU op's ReduceToDims does).
// Element types: bf16 or fp16 for Q, K, V, O and their gradients (fp32 accumulation and statistics).
// cuDNN's SDPA has no fp32 path: fp32 configs are refused, and the backend casts to bf16 around it.
//
// Masks (one of them, plus `causal`, as the CPU op's single mask input):
// - kKeyLengths: int32 (B) device array, key j of batch b visible iff j < len[b] (1 <= len[b] <= Sk).
// - kKeyMask: bool (B, Sk) device array (the CPU op's (B, 1, 1, Sk) key-padding mask, true = attend)
//   that must be a prefix per batch (true for j < len, false after; right padding, as tokenizers
//   pad for training); it is turned into lengths on the stream. A mask with a true after a false is
//   read as its leading run of trues, which differs from the CPU op.
// - kBias: additive, of the input dtype, dims (1|B, 1|H, Sq, Sk) contiguous. A bias broadcast over
//   the queries ((B, 1, 1, Sk), BERT's additive padding mask) is refused: cuDNN 9.19's backward
//   gets it wrong; pass such a 0/-large mask as key lengths, or expand it. When Sk is not a
//   multiple of 8 it is copied into the workspace with 16-byte aligned rows (cuDNN loads rows so).
// Rows whose every key is masked: the CPU op writes zeros; here they cannot come from causal or
// lengths >= 1, but a bias of -inf over a whole row gives NaN. Key-padding backward writes zeros into
// the dK/dV rows of the padded keys, as the CPU op does.
//
// Dropout (ratio in [0, 1)) uses cuDNN's Philox generator with a device int64 seed and offset; the
// backward with the same seed/offset regenerates the forward's mask. The mask is NOT the CPU
// backend's Philox stream (it cannot be: cuDNN draws its own numbers), so GPU and CPU agree in
// distribution, not element by element: compare them with dropout 0.
//
// Graph cache: AttentionGraphs owns a cuDNN handle and the built graphs, one per (direction,
// config); building takes milliseconds to seconds, so it happens at plan time through
// *WorkspaceBytes, and Forward/Backward find the built graph. The caller passes `workspace` (device
// memory, at least the reported bytes, 256-byte aligned) so the memory planner counts it.
// Not thread-safe: one AttentionGraphs per stream (or a lock around it).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#ifndef __CUDACC__
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "frontend/ir/dtype.h"
#endif

namespace onnxpipe::cuda {

// Mask helpers on the stream (attention_mask.cu); the Status API below calls them.
// len[b] = number of leading trues of key_mask[b, :] (B, Sk).
cudaError_t LaunchKeyMaskToLengths(const bool* key_mask, int32_t* lengths, int64_t batch, int64_t seq_kv,
                                   cudaStream_t stream);
// lengths[b] = value for every b < batch.
cudaError_t LaunchFillLengths(int32_t* lengths, int64_t batch, int32_t value, cudaStream_t stream);
// Zeros rows j >= len[b] of x (B, H, S, D), element size `elem_bytes` (2 or 4).
cudaError_t LaunchZeroPaddedRows(void* x, const int32_t* lengths, int64_t batch, int64_t heads, int64_t seq,
                                 int64_t dim, int elem_bytes, cudaStream_t stream);

// splitmix64's finaliser (what mixes the cuDNN dropout seed).
__host__ __device__ inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// The cuDNN dropout seed and offset (device int64s, 16-byte aligned): out[0] =
// Mix64(Mix64(keyed ^ step) ^ row_offset), out[1] = 0, with the step read from `device_step` when
// the kernel runs if set (a graph replay's step), else `step`.
cudaError_t LaunchWriteDropoutSeed(int64_t* out, uint64_t keyed, uint64_t step, const uint64_t* device_step,
                                   uint64_t row_offset, cudaStream_t stream);

#ifndef __CUDACC__

enum class AttentionMask { kNone, kKeyLengths, kKeyMask, kBias };

struct AttentionConfig {
  int64_t batch = 0, heads = 0, kv_heads = 0;                  // kv_heads 0 = heads
  int64_t seq_q = 0, seq_kv = 0, head_dim = 0, value_dim = 0;  // value_dim 0 = head_dim
  ir::DType dtype = ir::DType::kBF16;
  std::optional<double> scale;  // default 1/sqrt(head_dim), as the CPU op
  bool causal = false;
  AttentionMask mask = AttentionMask::kNone;
  // kBias: dims (bias_batch, bias_heads, bias_rows, Sk); bias_rows Sq (0 = Sq); 1 is refused (above).
  int64_t bias_batch = 1, bias_heads = 1, bias_rows = 0;
  double dropout = 0.0;  // ratio; the caller passes 0 outside training
  // Element strides of Q, K, V and O (O's also dO's; Q's, K's, V's also their gradients') over
  // (B, H, S, D), the last 1; empty = contiguous. Strided operands are views into a packed buffer
  // (frontend/ir/attention_views.h): the caller offsets the pointers.
  std::vector<int64_t> q_strides, k_strides, v_strides, o_strides;

  // Checks the config and fills the defaults; errors name the field and what was expected.
  absl::StatusOr<AttentionConfig> Resolved() const;
  std::string ToString() const;
};

// Device pointers. `mask`: int32 (B) | bool (B, Sk) | bias (bias_batch, bias_heads, bias_rows, Sk), per
// config.mask. `dropout_seed`/`dropout_offset`: one int64 each, required when dropout > 0.
struct AttentionForwardArgs {
  const void* q = nullptr;  // (B, H, Sq, Dh)
  const void* k = nullptr;  // (B, Hkv, Sk, Dh)
  const void* v = nullptr;  // (B, Hkv, Sk, Dv)
  const void* mask = nullptr;
  const int64_t* dropout_seed = nullptr;
  const int64_t* dropout_offset = nullptr;
  void* o = nullptr;       // (B, H, Sq, Dv)
  float* stats = nullptr;  // (B, H, Sq): log-sum-exp of each row's scores
};

struct AttentionBackwardArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* o = nullptr;       // the forward's output
  const float* stats = nullptr;  // the forward's stats
  const void* d_o = nullptr;     // (B, H, Sq, Dv)
  const void* mask = nullptr;
  const int64_t* dropout_seed = nullptr;  // the forward's
  const int64_t* dropout_offset = nullptr;
  void* dq = nullptr;  // (B, H, Sq, Dh)
  void* dk = nullptr;  // (B, Hkv, Sk, Dh)
  void* dv = nullptr;  // (B, Hkv, Sk, Dv)
};

class AttentionGraphs {
 public:
  // Creates the cuDNN handle on the current device. Fails (no crash) without a GPU or cuDNN.
  static absl::StatusOr<std::unique_ptr<AttentionGraphs>> Create();
  ~AttentionGraphs();
  AttentionGraphs(const AttentionGraphs&) = delete;
  AttentionGraphs& operator=(const AttentionGraphs&) = delete;

  // Builds the graph for `config` once; returns the workspace bytes Forward/Backward need with it.
  // A config cuDNN cannot run is an Unimplemented error carrying cuDNN's reason.
  absl::StatusOr<int64_t> ForwardWorkspaceBytes(const AttentionConfig& config);
  absl::StatusOr<int64_t> BackwardWorkspaceBytes(const AttentionConfig& config);

  // Enqueue on `stream` (building the graph first if *WorkspaceBytes was not called).
  absl::Status Forward(const AttentionConfig& config, const AttentionForwardArgs& args, void* workspace,
                       int64_t workspace_bytes, cudaStream_t stream);
  absl::Status Backward(const AttentionConfig& config, const AttentionBackwardArgs& args, void* workspace,
                        int64_t workspace_bytes, cudaStream_t stream);

  // Number of graphs built so far (forward and backward).
  int64_t num_graphs() const { return static_cast<int64_t>(graphs_.size()); }

 private:
  struct Built;
  AttentionGraphs() = default;
  absl::StatusOr<Built*> Get(bool backward, const AttentionConfig& config);

  void* handle_ = nullptr;  // cudnnHandle_t
  std::map<std::string, std::unique_ptr<Built>> graphs_;
};

#endif  // __CUDACC__

}  // namespace onnxpipe::cuda
