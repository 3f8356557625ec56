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

#include <algorithm>
#include <array>
#include <cstdint>

#include "absl/status/statusor.h"
#include "executor/cpu/kernel.h"
#include "executor/cpu/kernel_util.h"
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

// The dropout a node applies over `numel` elements on its random stream: a Dropout's or DropoutGrad's
// (attribute `ratio`, default 0.5), or an op's fused one (attribute `dropout`, default 0; op.h).
// Active while training with a ratio over 0.
struct FusedDropout {
  bool active = false;
  DropoutStream stream{};
  int64_t base = 0;    // counter of element 0
  double scale = 1.0;  // 1 / (1 - ratio); 0 when everything drops
};
// An error naming the node for a ratio outside [0, 1] or a micro-batch split the stream cannot take.
absl::StatusOr<FusedDropout> DropoutOf(const ir::Node& node, const EvalContext& ctx, int64_t numel);

// Calls f(i, keep) for every element i in [0, n) in parallel blocks (keep: always, when inactive).
template <typename F>
void ForEachKept(const FusedDropout& d, int64_t n, F&& f) {
  constexpr int64_t kBlock = 1 << 14;
  ParallelFor(n, kBlock, [&](int64_t b, int64_t e) {
    std::array<uint8_t, kBlock> keep;
    for (int64_t lo = b; lo < e; lo += kBlock) {
      const int64_t hi = std::min(e, lo + kBlock);
      if (d.active) FillDropoutKeepMask(d.stream, d.base + lo, d.base + hi, keep.data());
      for (int64_t i = lo; i < hi; ++i) f(i, !d.active || keep[i - lo] != 0);
    }
  });
}

// op.h's KeepBits: one bit per element of a tensor of `dims` (the last a multiple of 8), bit k of
// byte j the decision of element 8 j + k.
absl::StatusOr<ir::Tensor> AllocKeepBits(const ir::Node& node, const EvalContext& ctx, int output,
                                         const std::vector<int64_t>& dims);
// An error naming the node unless `bits` are the keep bits of a tensor of `dims`.
absl::Status CheckKeepBits(const ir::Node& node, const ir::Tensor& bits, const std::vector<int64_t>& dims);
// Writes the decisions of `d` over elements [0, n) (n a multiple of 8) as keep bits (all kept when inactive).
void PackKeepBits(const FusedDropout& d, int64_t n, uint8_t* bits);

// Calls f(i, keep) for every element i in [0, n) in parallel blocks, keep read from keep bits.
template <typename F>
void ForEachKeptBit(const uint8_t* bits, int64_t n, F&& f) {
  ParallelFor(n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) f(i, ((bits[i >> 3] >> (i & 7)) & 1) != 0);
  });
}

}  // namespace onnxpipe::cpu
