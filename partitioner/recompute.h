// Phase 4 of the partitioner: which forward nodes a stage recomputes during its backward pass.
//
// Policies (per stage):
// - none: every forward value the backward reads is kept from the forward (per micro-batch).
// - full: keep only the stage's inputs (GPipe / torch Pipe checkpointing): all the stage's forward
//   nodes are recomputed before its backward pass.
// - selective: recompute the cheap ops (everything but GEMM-class ops — MatMul, Gemm, Linear,
//   FusedMatMul, Attention — and the loss): softmax, dropout, GELU, LayerNorm, elementwise and
//   shape ops; keep GEMM outputs. A cheap node whose output a forward node of another unit reads
//   is kept too, so that every unit (the span between two cut candidates, e.g. one transformer
//   layer) recomputes from values it holds when its backward starts.
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

// GEMM-class ops and the loss are kept by selective recompute; everything else is cheap.
bool IsCheapOp(ir::OpKind op);

// The forward nodes (per node id) to recompute for the units [unit_begin, unit_end): with
// `stage_full` every forward node of the range (except those producing graph outputs), else per
// unit as `choice[u - unit_begin]` says. Only nodes the backward needs are marked.
std::vector<bool> RecomputeSet(const GraphAnalysis& a, int32_t unit_begin, int32_t unit_end,
                               bool stage_full, const std::vector<UnitRecompute>& choice);

struct RecomputeRegion {
  std::vector<ir::NodeId> nodes;  // forward nodes, in graph order
  ir::NodeId before = ir::kNoNode;  // the first backward consumer in `backward_order`
};

// Connected components of `recompute` (node ids), each placed before its first consumer among
// `backward_order` (the stage's backward nodes in schedule order).
std::vector<RecomputeRegion> BuildRegions(const GraphAnalysis& a, const std::vector<bool>& recompute,
                                          const std::vector<ir::NodeId>& backward_order);

}  // namespace onnxpipe::partitioner
