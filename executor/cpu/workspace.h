// Kernel scratch memory (workspace) and how much of it each op needs.
//
// A kernel that needs temporaries beyond its outputs (Attention's probability matrix, LayerNorm's
// row statistics in its backward) takes them from Workspace::Get with exactly the size
// CpuWorkspaceBytes reports for the node, so a memory plan made with CpuWorkspaceBytes
// (partitioner::MemoryPlanOptions::workspace_bytes) reserves what the kernels use: under a planned
// executor the workspace is the plan's, elsewhere it is a heap buffer owned by the Workspace.
// Ops not listed use no workspace (their kernels keep small fixed-size buffers on the stack).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/cpu/kernel.h"
#include "frontend/ir/align.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::cpu {

class Workspace {
 public:
  // `bytes` of scratch for `node`: the planned workspace under a planned executor.
  static absl::StatusOr<Workspace> Get(const ir::Node& node, const EvalContext& ctx, int64_t bytes);
  // The byte at `offset` as a T*. Offsets come from the op's layout (64-byte aligned parts).
  template <typename T>
  T* at(int64_t offset) const {
    return reinterpret_cast<T*>(data_ + offset);
  }

 private:
  std::unique_ptr<uint8_t[]> owned_;
  uint8_t* data_ = nullptr;
};

// Layout of an op's workspace: part sizes rounded up to 64 bytes, back to back.
inline int64_t WorkspacePart(int64_t bytes) { return ir::AlignUp(bytes); }

// Attention forward: the (Sq, Sk) probabilities of one batch matrix, then (with dropout) its keep
// mask. Backward: probabilities, their gradient, then (with dropout) the keep mask and, when dV is
// wanted, the dropped probabilities.
struct AttentionWorkspace {
  int64_t probs = 0, grad = 0, keep = 0, dropped = 0, total = 0;
  static AttentionWorkspace Forward(int64_t sq, int64_t sk, int64_t elem_size, bool dropout);
  static AttentionWorkspace Backward(int64_t sq, int64_t sk, int64_t elem_size, bool dropout,
                                     bool wants_dv);
};
// LayerNormGrad: per-row mean and 1/std in double.
inline int64_t LayerNormGradWorkspace(int64_t rows) { return 2 * WorkspacePart(rows * 8); }
// RMSNormGrad: per-row 1/rms in double.
inline int64_t RMSNormGradWorkspace(int64_t rows) { return WorkspacePart(rows * 8); }

// The workspace `node` needs, from the shapes of its operands in `g` (concrete after binding);
// 0 for ops without one or operands of unknown shape.
int64_t CpuWorkspaceBytes(const ir::Graph& g, const ir::Node& node);

}  // namespace onnxpipe::cpu
