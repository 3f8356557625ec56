// CPU kernel interface and registry.
//
// A kernel evaluates one node on host tensors:
//   absl::StatusOr<std::vector<ir::Tensor>> Fn(const ir::Node& node,
//                                              const std::vector<ir::Tensor>& inputs,
//                                              const EvalContext& ctx);
// inputs[i] is undefined for an absent optional input; it returns one tensor per node output it
// computes (trailing optional outputs may be left out or undefined). Kernels never modify their
// inputs; an output may share an input's storage (Reshape, Identity): storage is copy-on-write by
// convention.
//
// Outputs come from AllocOutput / ViewOutput (kernel_util.h), never from ir::Tensor's
// constructor: under a planned executor (ctx.outputs set) they are the planned slots, so a kernel
// writes its results where the memory plan put them and nothing is allocated or copied.
//
// Kernels register themselves, one line per op kind, in the file that defines them:
//   REGISTER_CPU_KERNEL(kSoftmax, SoftmaxKernel);
// so that new files (e.g. backward kernels in grad_*.cc) add kernels without editing any other
// file. Registering the same op twice aborts at start-up naming both files. The registration
// objects are only reached through their static initialisers, so onnxpipe_cpu is linked as a
// whole archive (see executor/cpu/CMakeLists.txt).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/evaluator.h"
#include "frontend/ir/graph.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cpu {

// Per-evaluation state for random ops. Dropout (and Attention's dropout) draw their keep/drop
// decisions from Philox4x32-10 keyed by (seed, node key) with `offset` in the counter, so the
// same node evaluated with the same context reproduces the same mask (recompute); a trainer
// advances `offset` per step. Inference (training == false): dropout is identity.
// Micro-batches: a pipeline evaluating rows [row_offset, row_offset + rows) of the step's batch
// sets both, and element i of a random op's tensor (batch-major: the batch index is the outermost
// factor of its flat index, as in (B, S, D) and (B*H, S, S)) draws counter
// row_offset * (numel / rows) + i: the micro-batches' masks are exactly the rows of the full
// batch's. rows = 0: the tensor is the whole batch.
using ir::OutputAllocator;
struct EvalContext {
  bool training = false;
  uint64_t seed = 0;
  uint64_t offset = 0;
  int64_t row_offset = 0;
  int64_t rows = 0;
  // Where outputs go: null = fresh tensors; else an executor's planned slots.
  OutputAllocator* outputs = nullptr;
};


using CpuKernelFn = absl::StatusOr<std::vector<ir::Tensor>> (*)(const ir::Node& node,
                                                                const std::vector<ir::Tensor>& inputs,
                                                                const EvalContext& ctx);

// Registers `fn` for `op`; returns true (for use in a static initialiser).
bool RegisterCpuKernel(ir::OpKind op, CpuKernelFn fn, const char* file);
// The kernel registered for `op`, or nullptr.
CpuKernelFn FindCpuKernel(ir::OpKind op);

}  // namespace onnxpipe::cpu

#define REGISTER_CPU_KERNEL(kind, fn)                                                        \
  [[maybe_unused]] static const bool ONNXPIPE_CONCAT(onnxpipe_cpu_kernel_registered_, __LINE__) = \
      ::onnxpipe::cpu::RegisterCpuKernel(::onnxpipe::ir::OpKind::kind, &(fn), __FILE__)
