// Phase 1: per-node FLOPs and bytes, roofline time, and the measured-times file. The FLOP counts
// follow the usual conventions (2 per multiply-add; a few per element for transcendental
// elementwise ops) so that a transformer layer costs what the literature says it does; the
// constants matter less than getting GEMMs and memory-bound ops on the right side of the ridge.
#include "partitioner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <unordered_map>

#include "frontend/ir/attention_views.h"
#include "frontend/ir/status.h"
#include "frontend/passes/recompute_clones.h"
#include "partitioner/memory_planner.h"

namespace onnxpipe::partitioner {
namespace {

using ir::OpKind;

double Numel(const ir::Value& v) {
  double n = 1;
  for (const ir::Dim& d : v.shape) n *= d.is_concrete() ? static_cast<double>(d.value()) : 1.0;
  return n;
}

double Dim(const ir::Value& v, int i) {
  const int r = static_cast<int>(v.shape.size());
  if (i < 0) i += r;
  if (i < 0 || i >= r || !v.shape[i].is_concrete()) return 1;
  return static_cast<double>(v.shape[i].value());
}

double ElemBytes(const ir::Value& v) { return static_cast<double>(ir::DTypeSize(v.dtype)); }

// Per-element FLOPs of the non-GEMM ops.
double ElementwiseFlops(OpKind op) {
  switch (op) {
    case OpKind::kErf:
    case OpKind::kTanh:
    case OpKind::kExp:
    case OpKind::kLog:
    case OpKind::kSigmoid:
    case OpKind::kPow:
      return 8;
    case OpKind::kGelu:
      return 12;
    case OpKind::kGeluGrad:
      return 16;
    case OpKind::kSoftmax:
    case OpKind::kLogSoftmax:
    case OpKind::kSoftmaxGrad:
    case OpKind::kLogSoftmaxGrad:
      return 5;
    case OpKind::kLayerNorm:
      return 8;
    case OpKind::kLayerNormGrad:
      return 12;
    case OpKind::kRMSNorm:
      return 5;
    case OpKind::kRMSNormGrad:
      return 9;
    case OpKind::kGatedActivation:  // act(gate) * up: Gelu's cost (SiLU's Sigmoid and Mul are about as much)
      return 13;
    case OpKind::kGatedActivationGrad:  // act'(gate) and act(gate), three products, two outputs
      return 24;
    case OpKind::kRotary:  // x * cos + rot(x) * sin on the rotated features
    case OpKind::kRotaryGrad:
      return 3;
    case OpKind::kDropout:
    case OpKind::kDropoutGrad:
      return 3;
    case OpKind::kSoftmaxCrossEntropyLoss:
    case OpKind::kSoftmaxCrossEntropyLossGrad:
      return 6;
    case OpKind::kAdamWUpdate:
      return 12;
    case OpKind::kSGDUpdate:
      return 4;
    case OpKind::kSumSquares:
      return 2;
    default:
      return 1;
  }
}

}  // namespace

OpCost EstimateOpCost(const ir::Graph& g, const ir::Node& n) {
  OpCost c;
  if (IsAliasOp(n.op) || n.op == OpKind::kShape || n.op == OpKind::kConstant) {
    c.free = true;
    return c;
  }
  double out_elems = 0;
  for (ir::ValueId v : n.outputs) {
    if (v == ir::kNoValue) continue;
    out_elems += Numel(g.value(v));
    c.bytes += Numel(g.value(v)) * ElemBytes(g.value(v));
  }
  double in_elems = 0;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const ir::ValueId v = n.inputs[i];
    if (v == ir::kNoValue || IsShapeOnlyOperand(n, static_cast<int>(i))) continue;
    // Attention's views read one packed buffer's parts: the buffer once.
    const bool read_before = std::find(n.inputs.begin(), n.inputs.begin() + i, v) != n.inputs.begin() + i;
    if (ir::HasAttentionViews(n) && read_before) continue;
    in_elems += Numel(g.value(v));
    c.bytes += Numel(g.value(v)) * ElemBytes(g.value(v));
  }
  auto in = [&](int i) -> const ir::Value& { return g.value(n.inputs[i]); };
  c.gemm = ir::HasProp(n.op, ir::kOpGemm);
  switch (n.op) {
    case OpKind::kMatMul: {
      c.flops = 2 * out_elems * Dim(in(0), -1);
      break;
    }
    case OpKind::kFusedMatMul: {  // the product (output 0); KSum's additions ride in its epilogue
      const bool trans_a = n.attrs.Get<int64_t>("trans_a", 0) != 0;
      c.flops = 2 * Numel(g.value(n.outputs[0])) * (trans_a ? Dim(in(0), -2) : Dim(in(0), -1));
      break;
    }
    case OpKind::kGemm: {
      const bool trans_a = n.attrs.Get<int64_t>("transA", 0) != 0;
      c.flops = 2 * out_elems * (trans_a ? Dim(in(0), 0) : Dim(in(0), 1)) + out_elems;
      break;
    }
    case OpKind::kLinear: {
      c.flops = 2 * out_elems * Dim(in(0), -1) + out_elems;
      break;
    }
    case OpKind::kAttention:
    case OpKind::kAttentionGrad: {
      // Q (..., Sq, Dh), K (..., Sk, Dh), V (..., Sk, Dv); the first operand of the gradient is dO.
      // Read through the node's views when it has them (concrete shapes then).
      const int q = n.op == OpKind::kAttention ? 0 : 1;
      std::vector<double> d[3];
      for (int i = 0; i < 3; ++i) {
        const ir::Value& val = in(q + i);
        if (ir::HasAttentionView(n, i) && ir::IsConcrete(val.shape)) {
          const absl::StatusOr<ir::StridedView> v = ir::AttentionOperandView(n, i, ir::ToInts(val.shape));
          if (v.ok()) d[i].assign(v->dims.begin(), v->dims.end());
        }
        if (d[i].empty()) {
          for (int k = 0; k < static_cast<int>(val.shape.size()); ++k) d[i].push_back(Dim(val, k));
        }
        if (d[i].size() < 2) d[i].insert(d[i].begin(), 2 - d[i].size(), 1.0);
      }
      const double sq = d[0][d[0].size() - 2], dh = d[0].back(), sk = d[1][d[1].size() - 2], dv = d[2].back();
      double heads = 1;
      for (size_t k = 0; k + 2 < d[0].size(); ++k) heads *= d[0][k];
      const double scores = heads * sq * sk;
      const double causal = n.attrs.Get<int64_t>("causal", 0) != 0 ? 0.5 : 1.0;
      if (n.op == OpKind::kAttention) {
        c.flops = causal * (2 * scores * dh + 2 * scores * dv) + 5 * scores;
      } else {
        // Recomputes Q K^T, then dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q.
        c.flops = causal * (2 * scores * dh * 3 + 2 * scores * dv * 2) + 8 * scores;
      }
      break;
    }
    case OpKind::kGather:
    case OpKind::kGatherGrad:
      c.flops = 0;
      break;
    default:
      c.flops = ElementwiseFlops(n.op) * std::max(out_elems, in_elems);
      break;
  }
  return c;
}

double RingAllReduceSeconds(int64_t bytes, int64_t ranks, double bandwidth, double latency_s) {
  if (ranks <= 1) return 0;
  const double n = static_cast<double>(ranks);
  return 2 * (n - 1) * latency_s + 2 * (n - 1) / n * static_cast<double>(bytes) / bandwidth;
}

BucketedAllReduce BucketedAllReduceSeconds(const std::vector<int64_t>& tensors, int64_t bucket_bytes,
                                           double backward_s, int64_t ranks, double bandwidth, double latency_s) {
  BucketedAllReduce r;
  double total = 0;
  for (int64_t b : tensors) total += static_cast<double>(b);
  double done = 0, end = 0, pending_s = 0;
  int64_t open = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    done += static_cast<double>(tensors[i]);
    open += tensors[i];
    const double s = RingAllReduceSeconds(tensors[i], ranks, bandwidth, latency_s);
    r.seconds += s;
    pending_s += s;
    if (open < bucket_bytes) continue;
    const double ready = total > 0 ? backward_s * done / total : backward_s;
    end = std::max(end, ready) + pending_s;
    ++r.buckets;
    open = 0;
    pending_s = 0;
  }
  end = std::max(end, backward_s) + pending_s;
  r.exposed_s = std::max(0.0, end - backward_s);
  return r;
}

double RooflineSeconds(const OpCost& c, const DeviceProfile& d, Precision precision) {
  if (c.free) return 0;
  const double peak = (c.gemm ? d.gemm_flops(precision) : d.vector_flops) * d.compute_efficiency;
  const double bw = d.memory_bandwidth * d.memory_efficiency;
  const double compute = peak > 0 ? c.flops / peak : 0;
  const double memory = bw > 0 ? c.bytes / bw : 0;
  return d.op_overhead_s + std::max(compute, memory);
}

absl::StatusOr<OpTimes> OpTimesFromJson(const nlohmann::json& j, const std::string& what) {
  if (!j.is_object()) return INVALID_ARGUMENT() << what << ": a profile must be a JSON object";
  if (!j.contains("format") || !j.at("format").is_string() || j.at("format").get<std::string>() != kOpTimesFormat) {
    return INVALID_ARGUMENT() << what << ": \"format\" must be \"" << kOpTimesFormat
                              << "\" (write profiles with `onnxpipe profile`)";
  }
  OpTimes t;
  auto str = [&](const char* key, std::string* out) -> absl::Status {
    if (!j.contains(key)) return absl::OkStatus();
    if (!j.at(key).is_string()) return INVALID_ARGUMENT() << what << ": \"" << key << "\" must be a string";
    *out = j.at(key).get<std::string>();
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(str("model", &t.model));
  RETURN_IF_ERROR(str("backend", &t.backend));
  RETURN_IF_ERROR(str("device", &t.device));
  RETURN_IF_ERROR(str("dtype", &t.dtype));
  RETURN_IF_ERROR(str("optimizer", &t.optimizer));
  RETURN_IF_ERROR(str("created", &t.created));
  auto integer = [&](const char* key, int64_t* out, bool required, int64_t min) -> absl::Status {
    if (!j.contains(key)) {
      if (required) return INVALID_ARGUMENT() << what << ": missing \"" << key << "\"";
      return absl::OkStatus();
    }
    if (!j.at(key).is_number_integer() || j.at(key).get<int64_t>() < min) {
      return INVALID_ARGUMENT() << what << ": \"" << key << "\" must be an integer >= " << min;
    }
    *out = j.at(key).get<int64_t>();
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(integer("microbatch", &t.microbatch, /*required=*/true, 1));
  RETURN_IF_ERROR(integer("seq", &t.seq, /*required=*/false, 0));
  RETURN_IF_ERROR(integer("repeats", &t.repeats, /*required=*/false, 0));
  if (!j.contains("ops") || !j.at("ops").is_array()) {
    return INVALID_ARGUMENT() << what << ": missing \"ops\" (an array of {node, ms} objects)";
  }
  std::set<std::string> seen;
  int64_t index = 0;
  for (const nlohmann::json& e : j.at("ops")) {
    const std::string where = what + ": ops[" + std::to_string(index++) + "]";
    if (!e.is_object()) return INVALID_ARGUMENT() << where << " must be an object";
    if (!e.contains("node") || !e.at("node").is_string() || e.at("node").get<std::string>().empty()) {
      return INVALID_ARGUMENT() << where << ": \"node\" must be a non-empty string";
    }
    if (!e.contains("ms") || !e.at("ms").is_number() || !(e.at("ms").get<double>() >= 0) ||
        !std::isfinite(e.at("ms").get<double>())) {
      return INVALID_ARGUMENT() << where << " (node '" << e.at("node").get<std::string>()
                                << "'): \"ms\" must be a finite number >= 0";
    }
    OpTimes::Entry entry;
    entry.node = e.at("node").get<std::string>();
    entry.ms = e.at("ms").get<double>();
    if (e.contains("scratch_bytes")) {
      const nlohmann::json& b = e.at("scratch_bytes");
      if (!b.is_number_integer() || b.get<int64_t>() < 0) {
        return INVALID_ARGUMENT() << where << " (node '" << entry.node
                                  << "'): \"scratch_bytes\" must be an integer >= 0 (bytes), got " << b.dump();
      }
      entry.scratch_bytes = b.get<int64_t>();
    }
    if (e.contains("op") && e.at("op").is_string()) entry.op = e.at("op").get<std::string>();
    if (e.contains("phase") && e.at("phase").is_string()) entry.phase = e.at("phase").get<std::string>();
    if (!seen.insert(entry.node).second) {
      return INVALID_ARGUMENT() << where << ": node '" << entry.node << "' appears twice";
    }
    t.ops.push_back(std::move(entry));
  }
  return t;
}

absl::StatusOr<OpTimes> LoadOpTimes(const std::string& path) {
  ASSIGN_OR_RETURN(const nlohmann::json j,
                   ReadJsonFile(path, "profile file not found", "malformed profile: not valid JSON"));
  absl::StatusOr<OpTimes> t = OpTimesFromJson(j, path);
  if (!t.ok()) return Annotate(t.status(), "malformed profile");
  return t;
}

nlohmann::ordered_json OpTimesToJson(const OpTimes& t) {
  nlohmann::ordered_json j;
  j["format"] = kOpTimesFormat;
  j["model"] = t.model;
  j["backend"] = t.backend;
  j["device"] = t.device;
  j["dtype"] = t.dtype;
  j["optimizer"] = t.optimizer;
  j["microbatch"] = t.microbatch;
  j["seq"] = t.seq;
  j["repeats"] = t.repeats;
  j["created"] = t.created;
  nlohmann::ordered_json ops = nlohmann::ordered_json::array();
  for (const OpTimes::Entry& e : t.ops) {
    nlohmann::ordered_json op = {{"node", e.node}, {"op", e.op}, {"phase", e.phase}, {"ms", e.ms}};
    if (e.scratch_bytes) op["scratch_bytes"] = *e.scratch_bytes;
    ops.push_back(std::move(op));
  }
  j["ops"] = std::move(ops);
  return j;
}

bool OpTimes::has_scratch() const {
  return std::any_of(ops.begin(), ops.end(), [](const Entry& e) { return e.scratch_bytes.has_value(); });
}

namespace {

using ScratchByName = std::unordered_map<std::string, int64_t>;

// The profile's scratch for `n`, or null: by name, a recompute clone by the node it clones (the
// clone runs the same kernel on the same shapes).
const int64_t* FindScratch(const ScratchByName& bytes, const ir::Node& n) {
  auto it = bytes.find(n.name);
  if (it == bytes.end() && !n.origin.empty() && n.name == passes::RecomputeCloneName(n.origin))
    it = bytes.find(n.origin);
  return it == bytes.end() ? nullptr : &it->second;
}

ScratchByName ScratchOf(const OpTimes& t) {
  ScratchByName bytes;
  for (const OpTimes::Entry& e : t.ops)
    if (e.scratch_bytes) bytes[e.node] = *e.scratch_bytes;
  return bytes;
}

}  // namespace

std::function<int64_t(const ir::Graph&, const ir::Node&)> ProfileScratch(std::shared_ptr<const OpTimes> t) {
  auto bytes = std::make_shared<const ScratchByName>(t ? ScratchOf(*t) : ScratchByName{});
  return [bytes](const ir::Graph&, const ir::Node& n) -> int64_t {
    const int64_t* b = FindScratch(*bytes, n);
    return b ? *b : 0;
  };
}

int64_t NodesWithoutScratch(const ir::Graph& g, const OpTimes& t) {
  const ScratchByName bytes = ScratchOf(t);
  int64_t n = 0;
  for (ir::NodeId id : g.LiveNodes()) n += FindScratch(bytes, g.node(id)) == nullptr;
  return n;
}

std::vector<double> NodeSeconds(const ir::Graph& g, const DeviceProfile& device, Precision precision,
                                const OpTimes* measured, int64_t microbatch, CostSummary* summary) {
  std::unordered_map<std::string, double> ms;
  if (measured) {
    for (const OpTimes::Entry& e : measured->ops) ms[e.node] = e.ms;
  }
  const double scale = measured && measured->microbatch > 0 && microbatch > 0
                           ? static_cast<double>(microbatch) / static_cast<double>(measured->microbatch)
                           : 1.0;
  CostSummary s;
  s.source = measured ? "profile" : "roofline";
  std::vector<double> seconds(g.num_node_slots(), 0.0);
  int64_t matched = 0;
  for (ir::NodeId id : g.LiveNodes()) {
    const ir::Node& n = g.node(id);
    auto it = measured ? ms.find(n.name) : ms.end();
    if (it != ms.end()) {
      ++matched;
      ++s.measured_nodes;
      seconds[id] = it->second * 1e-3 * (n.phase == ir::Phase::kOptimizer ? 1.0 : scale);
    } else {
      ++s.roofline_nodes;
      seconds[id] = RooflineSeconds(EstimateOpCost(g, n), device, precision);
    }
  }
  if (measured) s.profile_nodes_unmatched = static_cast<int64_t>(ms.size()) - matched;
  if (summary) *summary = s;
  return seconds;
}

}  // namespace onnxpipe::partitioner
