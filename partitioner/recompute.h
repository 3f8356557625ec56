// Phase 4 of the partitioner: which forward nodes a stage recomputes during its backward pass.
//
// Policies (per stage):
// - none: every forward value the backward reads is kept from the forward (per micro-batch).
// - full: keep only the stage's inputs (GPipe / torch Pipe checkpointing): all the stage's forward
//   nodes are recomputed before its backward pass.
// - selective: recompute the cheap ops (everything but GEMM-class ops — MatMul, Gemm, Linear,
//   FusedMatMul, Attention — and the loss): softmax, dropout, GELU, LayerNorm, elementwise and
//   shape ops; keep GEMM outputs (Korthikanti et al., arXiv 2205.05198). A cheap node whose output
//   a forward node of another unit reads is kept too, so that every unit (the span between two cut
//   candidates, e.g. one transformer layer) recomputes from values it holds when its backward
//   starts. This is the one selective rule (`train --stages K` runs the partitioner, so it
//   recomputes what `train --plan` does). Why keep the cross-unit values: a unit's saved bytes
//   and recompute time then do not depend on its neighbours, which is what lets the search add
//   them up per unit (unit_table.h) and price a stage exactly; a value read by the next unit (the
//   residual stream between layers) may be the value sent across a cut, which must exist after
//   the forward anyway; and recomputing it would run the region in the next unit's backward,
//   keeping the recomputed value alive across the whole backward of that unit.
// - auto: per unit, the cheapest of none | selective | unit (recompute the whole unit from its
//   inputs) such that the stage fits its memory budget (chosen by the search, phase 3).
// Only nodes whose outputs the backward actually reads (directly or through other recomputed
// nodes) are recomputed. A region is a connected set of recomputed nodes; it runs just before the
// first backward node (in the stage's schedule) that reads one of its outputs. Dropout nodes in a
// region replay their forward's random stream, so recompute is bit-identical.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "partitioner/analysis.h"

namespace onnxpipe::partitioner {

enum class RecomputePolicy { kNone, kFull, kSelective, kAuto };
const char* RecomputePolicyName(RecomputePolicy p);
absl::StatusOr<RecomputePolicy> ParseRecomputePolicy(std::string_view s);

// What one unit recomputes (auto mixes them per unit; none/selective use one for every unit).
// kStage marks every unit of a stage whose whole forward auto recomputes (as `full` does).
enum class UnitRecompute : uint8_t { kNone = 0, kSelective = 1, kUnit = 2, kStage = 3 };
const char* UnitRecomputeName(UnitRecompute r);

// Ops without op.h's kOpCostly (GEMM-class ops and the loss have it): selective recompute redoes them.
bool IsCheapOp(ir::OpKind op);

// The forward nodes (per node id) to recompute for the units [unit_begin, unit_end): with
// `stage_full` every forward node of the range (except those producing graph outputs), else per
// unit as `choice[u - unit_begin]` says. Only nodes the backward needs are marked.
std::vector<bool> RecomputeSet(const GraphAnalysis& a, int32_t unit_begin, int32_t unit_end, bool stage_full,
                               const std::vector<UnitRecompute>& choice);

struct RecomputeRegion {
  std::vector<ir::NodeId> nodes;    // forward nodes, in graph order
  ir::NodeId before = ir::kNoNode;  // the first backward consumer in `backward_order`
};

// Connected components of the nodes `recompute` marks at forward positions [p0, p1), each placed
// before its first consumer among `backward_order` (the stage's backward nodes in schedule order);
// components no backward node reads are dropped.
std::vector<RecomputeRegion> BuildRegions(const GraphAnalysis& a, const std::vector<bool>& recompute, int32_t p0,
                                          int32_t p1, const std::vector<ir::NodeId>& backward_order);

}  // namespace onnxpipe::partitioner
