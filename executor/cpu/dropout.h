// Dropout masks shared by the Dropout and Attention kernels (and by backward kernels that must
// replay a forward node's mask).
//
// A node's random stream is keyed by (EvalContext::seed, NodeRngKey(node)) with
// EvalContext::offset in the Philox counter (see philox.h), so evaluating the same node with the
// same context reproduces its mask bit for bit (recompute), and a new offset gives a fresh mask.
// NodeRngKey hashes the node's string attribute `rng_key` when present, else its name: a clone
// (recompute copy, backward node) that must replay a node's mask carries that node's name in
// `rng_key`. ONNX's `seed` attribute is ignored; the run's seed governs.
#pragma once

#include <cstdint>

#include "executor/cpu/kernel.h"
#include "absl/status/statusor.h"
#include "executor/cpu/philox.h"

namespace onnxpipe::cpu {

uint64_t NodeRngKey(const ir::Node& node);

// Writes keep[i - begin] (1 = keep) for elements [begin, end) of `node`'s stream, in parallel.
void FillDropoutKeepMask(const DropoutStream& stream, int64_t begin, int64_t end, uint8_t* keep);

// The counter of element 0 of a random op's tensor of `numel` elements (see EvalContext): an error
// naming the node when the tensor does not split into ctx.rows batch rows.
absl::StatusOr<int64_t> RandomCounterBase(const ir::Node& node, const EvalContext& ctx, int64_t numel);

inline DropoutStream MakeDropoutStream(const ir::Node& node, const EvalContext& ctx, double ratio) {
  return DropoutStream::Make(ctx.seed, NodeRngKey(node), ctx.offset, ratio);
}

}  // namespace onnxpipe::cpu
