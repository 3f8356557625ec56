// Stage assignment and recompute marking (program.h). The balanced split is a small exact DP over
// forward positions; it exists so that `--stages K` works without a partition plan and so tests
// can cut anywhere (mid-layer cuts included) — the partitioner's plan is the real answer.
#include <algorithm>
#include <limits>
#include <set>

#include "executor/pipeline/program.h"
#include "frontend/ir/status.h"

namespace onnxpipe::pipeline {
namespace {

bool IsGemmClass(ir::OpKind op) {
  return op == ir::OpKind::kMatMul || op == ir::OpKind::kGemm || op == ir::OpKind::kLinear ||
         op == ir::OpKind::kFusedMatMul || op == ir::OpKind::kAttention;
}

double Elements(const ir::Value& v) {
  if (!v.shape_known || !ir::IsConcrete(v.shape)) return 1;
  double n = 1;
  for (const ir::Dim& d : v.shape) n *= static_cast<double>(d.value());
  return n;
}

// Rough work of a forward node: multiply-adds of GEMM-class ops, else the output size.
double NodeWork(const ir::Graph& g, const ir::Node& n) {
  if (n.outputs.empty() || n.outputs[0] == ir::kNoValue) return 1;
  const double out = Elements(g.value(n.outputs[0]));
  auto last_dim = [&](ir::ValueId v, int from_end) -> double {
    const ir::Value& val = g.value(v);
    if (!val.shape_known || static_cast<int>(val.shape.size()) < from_end) return 1;
    const ir::Dim& d = val.shape[val.shape.size() - from_end];
    return d.is_concrete() ? static_cast<double>(d.value()) : 1;
  };
  switch (n.op) {
    case ir::OpKind::kMatMul:
    case ir::OpKind::kGemm:
    case ir::OpKind::kLinear:
    case ir::OpKind::kFusedMatMul: {
      const bool trans_a = n.op != ir::OpKind::kLinear && n.attrs.Get<int64_t>("trans_a", 0) != 0;
      return 1 + out * last_dim(n.inputs[0], trans_a ? 2 : 1);
    }
    case ir::OpKind::kAttention:  // Q K^T and P V
      return 1 + 2 * Elements(g.value(n.inputs[0])) * last_dim(n.inputs[1], 2);
    default:
      return 1 + out;
  }
}

}  // namespace

const char* RecomputePolicyName(RecomputePolicy p) {
  switch (p) {
    case RecomputePolicy::kNone: return "none";
    case RecomputePolicy::kFull: return "full";
    case RecomputePolicy::kSelective: return "selective";
    case RecomputePolicy::kAuto: return "auto";
  }
  return "?";
}

absl::StatusOr<RecomputePolicy> ParseRecomputePolicy(std::string_view s) {
  if (s == "none") return RecomputePolicy::kNone;
  if (s == "full") return RecomputePolicy::kFull;
  if (s == "selective") return RecomputePolicy::kSelective;
  if (s == "auto") return RecomputePolicy::kAuto;
  return INVALID_ARGUMENT() << "unknown recompute policy '" << s << "'; expected none, full, selective or auto";
}

std::vector<ir::NodeId> ForwardNodes(const ir::Graph& g) {
  std::vector<ir::NodeId> f;
  for (ir::NodeId id : g.LiveNodes())
    if (g.node(id).phase == ir::Phase::kForward) f.push_back(id);
  return f;
}

absl::StatusOr<StageAssignment> AssignContiguous(const ir::Graph& g, int32_t num_stages, std::vector<int32_t> cuts) {
  const std::vector<ir::NodeId> fwd = ForwardNodes(g);
  const int32_t F = static_cast<int32_t>(fwd.size()), K = num_stages;
  if (K < 1) return INVALID_ARGUMENT() << "--stages must be >= 1, got " << K;
  if (K > F) {
    return INVALID_ARGUMENT() << "--stages " << K << " is more than the " << F
                              << " forward nodes of the training graph: some stage would be empty";
  }
  if (cuts.empty() && K > 1) {
    // best[k][j]: the smallest bottleneck splitting positions [0, j) into k stages.
    std::vector<double> prefix(F + 1, 0);
    for (int32_t i = 0; i < F; ++i) prefix[i + 1] = prefix[i] + NodeWork(g, g.node(fwd[i]));
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<std::vector<double>> best(K + 1, std::vector<double>(F + 1, inf));
    std::vector<std::vector<int32_t>> arg(K + 1, std::vector<int32_t>(F + 1, -1));
    best[0][0] = 0;
    for (int32_t k = 1; k <= K; ++k) {
      for (int32_t j = k; j <= F; ++j) {
        for (int32_t i = k - 1; i < j; ++i) {
          const double v = std::max(best[k - 1][i], prefix[j] - prefix[i]);
          if (v < best[k][j]) {
            best[k][j] = v;
            arg[k][j] = i;
          }
        }
      }
    }
    cuts.assign(K - 1, 0);
    int32_t j = F;
    for (int32_t k = K; k > 1; --k) {
      j = arg[k][j];
      cuts[k - 2] = j;
    }
  }
  if (static_cast<int32_t>(cuts.size()) != K - 1) {
    return INVALID_ARGUMENT() << K << " stages need " << K - 1 << " cut positions, got " << cuts.size();
  }
  for (int32_t i = 0; i < K - 1; ++i) {
    if (cuts[i] <= (i ? cuts[i - 1] : 0) || cuts[i] >= F) {
      return INVALID_ARGUMENT() << "cut positions must increase strictly within (0, " << F << "); cut " << i
                                << " is " << cuts[i];
    }
  }
  StageAssignment a;
  a.num_stages = K;
  a.forward_stage.assign(g.num_node_slots(), -1);
  a.recompute.assign(g.num_node_slots(), false);
  int32_t s = 0;
  for (int32_t p = 0; p < F; ++p) {
    while (s < K - 1 && p >= cuts[s]) ++s;
    a.forward_stage[fwd[p]] = s;
  }
  return a;
}

absl::StatusOr<StageAssignment> AssignByName(const ir::Graph& g, int32_t num_stages,
                                             const std::map<std::string, int32_t>& forward_stage) {
  if (num_stages < 1) return INVALID_ARGUMENT() << "--stages must be >= 1, got " << num_stages;
  StageAssignment a;
  a.num_stages = num_stages;
  a.forward_stage.assign(g.num_node_slots(), -1);
  a.recompute.assign(g.num_node_slots(), false);
  std::set<std::string> seen;
  std::vector<int32_t> count(num_stages, 0);
  for (ir::NodeId id : ForwardNodes(g)) {
    const std::string& name = g.node(id).name;
    auto it = forward_stage.find(name);
    if (it == forward_stage.end()) {
      return INVALID_ARGUMENT() << "the plan puts forward node '" << name
                                << "' on no stage (was it made for another model or other options?)";
    }
    if (it->second < 0 || it->second >= num_stages) {
      return INVALID_ARGUMENT() << "the plan puts forward node '" << name << "' on stage " << it->second << " of "
                                << num_stages;
    }
    a.forward_stage[id] = it->second;
    ++count[it->second];
    seen.insert(name);
  }
  for (const auto& [name, s] : forward_stage) {
    if (!seen.count(name)) {
      return INVALID_ARGUMENT() << "the plan names forward node '" << name
                                << "', which is not a forward node of the training graph";
    }
  }
  for (int32_t s = 0; s < num_stages; ++s) {
    if (count[s] == 0) return INVALID_ARGUMENT() << "stage " << s << " of the plan has no forward node";
  }
  return a;
}

absl::Status MarkRecompute(const ir::Graph& g, RecomputePolicy policy, StageAssignment* a) {
  RET_CHECK(a != nullptr);
  a->recompute.assign(g.num_node_slots(), false);
  if (policy == RecomputePolicy::kAuto) {
    return INVALID_ARGUMENT() << "--recompute auto picks regions under a memory budget, which only a partition "
                                 "plan has: run `onnxpipe partition ... --recompute auto` and train with --plan DIR";
  }
  if (policy == RecomputePolicy::kNone) return absl::OkStatus();
  for (ir::NodeId id : ForwardNodes(g)) {
    const ir::OpKind op = g.node(id).op;
    a->recompute[id] = policy == RecomputePolicy::kFull ||
                       (!IsGemmClass(op) && op != ir::OpKind::kSoftmaxCrossEntropyLoss);
  }
  return absl::OkStatus();
}

absl::Status MarkRecomputeByName(const ir::Graph& g, const std::vector<std::string>& nodes, StageAssignment* a) {
  RET_CHECK(a != nullptr);
  if (a->recompute.size() != static_cast<size_t>(g.num_node_slots())) a->recompute.assign(g.num_node_slots(), false);
  std::map<std::string, ir::NodeId> by_name;
  for (ir::NodeId id : ForwardNodes(g)) by_name[g.node(id).name] = id;
  for (const std::string& n : nodes) {
    auto it = by_name.find(n);
    if (it == by_name.end()) {
      return INVALID_ARGUMENT() << "recompute region node '" << n << "' is not a forward node of the training graph";
    }
    a->recompute[it->second] = true;
  }
  return absl::OkStatus();
}

}  // namespace onnxpipe::pipeline
