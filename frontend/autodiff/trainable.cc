// The trainable-parameter rule (contract in trainable.h). Three sweeps over the live nodes in their
// (topological) order:
//   1. backward from the outputs: which values the outputs depend on at all, and which through
//      gradient-carrying edges (the autodiff's registry), for kUnused / kNoGradient;
//   2. forward: the "source" of every float value (no parameter, exactly one candidate, or several
//      / graph data) and whether a float without a source counts positions: made by a Cast of
//      integers or a Range, or a constant tensor of several elements (a fixed-size export's arange
//      or distance matrix);
//   3. per remaining candidate, a walk over the values derived from it alone, in order, until they
//      meet a value with another source (an activation): whether they were first multiplied by
//      positions (kPositional).
// What is left trained after that goes through the exporter's record (kExportedBuffer,
// kExporterMade) and the zero-row check (kZeroRow), which look at the initializer's uses only.
#include "frontend/autodiff/trainable.h"

#include <cfloat>
#include <cmath>
#include <map>
#include <optional>
#include <regex>
#include <set>

#include "frontend/autodiff/grad_builder.h"
#include "frontend/ir/status.h"

namespace onnxpipe::autodiff {
namespace {

using ir::ValueId;

constexpr ValueId kNoSource = -1;
constexpr ValueId kManySources = -2;  // graph data or more than one candidate

bool IsInitializer(const ir::Value& v) {
  return v.is_initializer && v.constant.has_value() && v.producer == ir::kNoNode;
}

// The largest finite magnitude that can still be a trained value of `dtype`: anything at or above
// it (finfo.min/max of the dtype, or of float32 in a float64 model) is a mask fill value.
double SentinelMagnitude(ir::DType dtype) {
  switch (dtype) {
    case ir::DType::kF16:
      return 65504.0;
    case ir::DType::kBF16:
      return 3.3895313892515355e38;
    default:
      return static_cast<double>(FLT_MAX);
  }
}

bool HoldsSentinel(const ir::Tensor& t) {
  if (!t.has_data()) return false;
  const double limit = SentinelMagnitude(t.dtype());
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    const double x = t.GetAsDouble(i);
    if (!std::isfinite(x) || std::fabs(x) >= limit) return true;
  }
  return false;
}

// True for the fixed sinusoidal encoding (Vaswani et al.) of rows p = 0..P-1: every column is
// sin(w p) or cos(w p) for some frequency w (any layout: interleaved or in halves), at least one is a
// cosine and at least one varies. Checked through the recurrence c(p+1) + c(p-1) = 2 cos(w) c(p) of
// a sinusoid, the phase (c(0) is 0 or 1) and the amplitude (c(1) is cos(w) or sin(w)). The table may carry size-1
// axes besides the position axis and the last (feature) axis, e.g. (1, P, D) or (P, 1, D).
bool IsSinusoidalTable(const ir::Tensor& t) {
  if (!t.has_data() || t.rank() < 2) return false;
  const std::vector<int64_t>& dims = t.dims();
  const int64_t d = dims.back();
  int64_t p_len = 1;
  for (int64_t a = 0; a + 1 < t.rank(); ++a) {
    if (dims[a] == 1) continue;
    if (p_len != 1) return false;  // two position-like axes
    p_len = dims[a];
  }
  if (p_len < 3 || d < 2) return false;
  constexpr double kTol = 1e-4, kExact = 1e-6;
  auto at = [&](int64_t p, int64_t j) { return t.GetAsDouble(p * d + j); };
  bool any_cos = false, any_varying = false;
  for (int64_t j = 0; j < d; ++j) {
    const double c0 = at(0, j);
    if (std::fabs(c0 - 1.0) <= kExact) {
      any_cos = true;
    } else if (std::fabs(c0) > kExact) {
      return false;
    }
    int64_t pivot = 1;
    for (int64_t p = 0; p < p_len; ++p) {
      const double v = at(p, j);
      if (!(std::fabs(v) <= 1.0 + kTol)) return false;
      if (std::fabs(v - c0) > kExact) any_varying = true;
      if (p >= 1 && p + 1 < p_len && std::fabs(v) > std::fabs(at(pivot, j))) pivot = p;
    }
    if (std::fabs(at(pivot, j)) <= kExact) {
      // c(1..P-2) all 0: only sin(0 p) (a zero column) is a sinusoid here.
      for (int64_t p = 0; p < p_len; ++p)
        if (std::fabs(at(p, j)) > kExact) return false;
      continue;
    }
    const double k = (at(pivot + 1, j) + at(pivot - 1, j)) / at(pivot, j);  // 2 cos(w)
    if (std::fabs(k) > 2.0 + kTol) return false;
    // Unit amplitude and zero phase: c(1) = cos(w) for a cosine, sin(w) for a sine.
    const double c1 = at(1, j);
    const bool unit = c0 > 0.5 ? std::fabs(k - 2.0 * c1) <= kTol : std::fabs(k * k / 4.0 + c1 * c1 - 1.0) <= kTol;
    if (!unit) return false;
    for (int64_t p = 1; p + 1 < p_len; ++p) {
      if (std::fabs(at(p + 1, j) + at(p - 1, j) - k * at(p, j)) > kTol) return false;
    }
  }
  return any_cos && any_varying;
}

bool IsConcreteOne(const ir::Dim& d) { return d.is_concrete() && d.value() == 1; }

// True when `out` spreads `operand` over positions it does not have: more (non-unit) leading dims,
// or a size-1 dim of the operand (right-aligned) that is not 1 in the output.
bool Broadcasts(const ir::Value& operand, const ir::Value& out) {
  if (!operand.shape_known || !out.shape_known) return false;
  const ir::Shape& a = operand.shape;
  const ir::Shape& o = out.shape;
  if (o.size() > a.size()) {
    for (size_t i = 0; i < o.size() - a.size(); ++i)
      if (!IsConcreteOne(o[i])) return true;
  }
  const size_t common = std::min(a.size(), o.size());
  for (size_t k = 1; k <= common; ++k) {
    if (IsConcreteOne(a[a.size() - k]) && !IsConcreteOne(o[o.size() - k])) return true;
  }
  return false;
}

// Ops whose product of a candidate with positions makes a function of the positions.
bool IsProduct(const ir::Node& n, int input) {
  switch (n.op) {
    case ir::OpKind::kMul:
    case ir::OpKind::kDiv:
    case ir::OpKind::kMatMul:
      return true;
    case ir::OpKind::kGemm:
      return input < 2;
    default:
      return false;
  }
}

// True for a zero row: all zeros, shape (1, ..., 1, N) with rank >= 2 and N > 1.
bool IsZeroRow(const ir::Tensor& t) {
  if (!t.has_data() || t.rank() < 2 || t.dims().back() <= 1) return false;
  for (int64_t a = 0; a + 1 < t.rank(); ++a)
    if (t.dims()[a] != 1) return false;
  for (int64_t i = 0; i < t.num_elements(); ++i)
    if (t.GetAsDouble(i) != 0.0) return false;
  return true;
}

class Analysis {
 public:
  Analysis(const ir::Graph& g, const GradRegistry& reg) : g_(g), reg_(reg), order_(g.LiveNodes()) {}

  absl::StatusOr<TrainableReport> Run(const TrainableOptions& options);

 private:
  void MarkReachable(const std::vector<ValueId>& targets);
  void ComputeSources(const std::vector<bool>& is_source);
  // kPositional when the candidate's own values are multiplied by positions before they meet an
  // activation, else kNone.
  FreezeReason PositionalCheck(ValueId w);
  // kExportedBuffer, kExporterMade or kZeroRow for a candidate the graph rules left trained, else
  // kNone.
  FreezeReason ExporterCheck(ValueId w);
  // The nodes that consume `v`'s values, seen through Casts and Identities, with the input index;
  // false when one of those Casts or Identities makes a graph output or loss target.
  bool EndUses(ValueId v, std::vector<std::pair<const ir::Node*, int>>* out) const;

  const ir::Graph& g_;
  const GradRegistry& reg_;
  std::vector<ir::NodeId> order_;
  std::vector<bool> is_target_, reaches_any_, reaches_grad_;
  std::vector<ValueId> source_;
  std::vector<bool> positions_;
  std::vector<std::vector<ir::NodeId>> uses_;
  std::vector<int> position_;  // node id -> index in order_
};

void Analysis::MarkReachable(const std::vector<ValueId>& targets) {
  const int32_t nv = g_.num_values();
  is_target_.assign(nv, false);
  reaches_any_.assign(nv, false);
  reaches_grad_.assign(nv, false);
  for (ValueId t : targets) {
    if (t == ir::kNoValue) continue;
    is_target_[t] = true;
    reaches_any_[t] = true;
    reaches_grad_[t] = ir::IsFloat(g_.value(t).dtype);
  }
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
    const ir::Node& n = g_.node(*it);
    bool any = false, grad = false;
    for (ValueId o : n.outputs) {
      if (o == ir::kNoValue) continue;
      any = any || reaches_any_[o];
      grad = grad || reaches_grad_[o];
    }
    for (int i = 0; i < static_cast<int>(n.inputs.size()); ++i) {
      const ValueId in = n.inputs[i];
      if (in == ir::kNoValue) continue;
      if (any) reaches_any_[in] = true;
      if (grad && CarriesGradient(reg_, g_, n, i)) reaches_grad_[in] = true;
    }
  }
}

void Analysis::ComputeSources(const std::vector<bool>& is_source) {
  const int32_t nv = g_.num_values();
  source_.assign(nv, kNoSource);
  positions_.assign(nv, false);
  auto constant_tensor = [](const ir::Value& val) {
    return val.constant.has_value() && !val.is_initializer && val.constant->num_elements() > 1;
  };
  for (ValueId v = 0; v < nv; ++v) {
    const ir::Value& val = g_.value(v);
    if (is_source[v]) source_[v] = v;
    if (ir::IsFloat(val.dtype) && constant_tensor(val)) positions_[v] = true;
  }
  for (ValueId v : g_.inputs())
    if (ir::IsFloat(g_.value(v).dtype) && !g_.value(v).constant) source_[v] = kManySources;
  for (ir::NodeId id : order_) {
    const ir::Node& n = g_.node(id);
    ValueId s = kNoSource;
    bool positions = n.op == ir::OpKind::kRange ||
                     (n.op == ir::OpKind::kCast && n.inputs[0] != ir::kNoValue &&
                      !ir::IsFloat(g_.value(n.inputs[0]).dtype));
    for (ValueId in : n.inputs) {
      if (in == ir::kNoValue || !ir::IsFloat(g_.value(in).dtype)) continue;
      const ValueId t = source_[in];
      if (t == kNoSource) {
        positions = positions || positions_[in];
      } else if (s == kNoSource) {
        s = t;
      } else if (s != t) {
        s = kManySources;
      }
    }
    for (ValueId o : n.outputs) {
      if (o == ir::kNoValue || !ir::IsFloat(g_.value(o).dtype)) continue;
      source_[o] = s;
      positions_[o] = s == kNoSource && (positions || constant_tensor(g_.value(o)));
    }
  }
}

FreezeReason Analysis::PositionalCheck(ValueId w) {
  // state: 1 = derived from w alone, not yet multiplied by positions; 2 = multiplied by them.
  std::map<ValueId, int> state = {{w, 1}};
  std::set<int> frontier;
  auto push_consumers = [&](ValueId v) {
    for (ir::NodeId c : uses_[v]) frontier.insert(position_[c]);
  };
  if (is_target_[w]) return FreezeReason::kNone;
  push_consumers(w);
  bool positioned = false;
  while (!frontier.empty()) {
    const ir::Node& n = g_.node(order_[*frontier.begin()]);
    frontier.erase(frontier.begin());
    int own = 0;  // the lowest state among the gradient-carrying inputs derived from w
    int own_input = -1;
    for (int i = 0; i < static_cast<int>(n.inputs.size()); ++i) {
      auto it = state.find(n.inputs[i]);
      if (it == state.end() || !CarriesGradient(reg_, g_, n, i)) continue;
      if (own == 0 || it->second < own) {
        own = it->second;
        own_input = i;
      }
    }
    if (own == 0) continue;
    bool meets_activation = false, meets_positions = false;
    for (int i = 0; i < static_cast<int>(n.inputs.size()); ++i) {
      const ValueId in = n.inputs[i];
      if (in == ir::kNoValue || state.count(in) || !ir::IsFloat(g_.value(in).dtype)) continue;
      const ValueId s = source_[in];
      if (s != kNoSource && s != w) meets_activation = true;
      if (s == kNoSource && positions_[in]) meets_positions = true;
    }
    if (meets_activation) {
      if (own == 1) return FreezeReason::kNone;  // w's own values meet data: a parameter
      continue;                                  // positions met first; the product is data now
    }
    int out_state = own;
    if (own == 1 && meets_positions && IsProduct(n, own_input) && !n.outputs.empty() &&
        n.outputs[0] != ir::kNoValue && Broadcasts(g_.value(n.inputs[own_input]), g_.value(n.outputs[0]))) {
      out_state = 2;
      positioned = true;
    }
    for (ValueId o : n.outputs) {
      if (o == ir::kNoValue || !ir::IsFloat(g_.value(o).dtype)) continue;
      if (is_target_[o] && out_state == 1) return FreezeReason::kNone;
      state[o] = out_state;
      push_consumers(o);
    }
  }
  return positioned ? FreezeReason::kPositional : FreezeReason::kNone;
}

bool Analysis::EndUses(ValueId v, std::vector<std::pair<const ir::Node*, int>>* out) const {
  std::vector<ValueId> stack = {v};
  while (!stack.empty()) {
    const ValueId cur = stack.back();
    stack.pop_back();
    if (cur != v && is_target_[cur]) return false;
    for (ir::NodeId c : uses_[cur]) {
      const ir::Node& n = g_.node(c);
      const bool pass = n.op == ir::OpKind::kCast || n.op == ir::OpKind::kIdentity;
      if (pass && !n.outputs.empty() && n.outputs[0] != ir::kNoValue) {
        stack.push_back(n.outputs[0]);
        continue;
      }
      for (int i = 0; i < static_cast<int>(n.inputs.size()); ++i)
        if (n.inputs[i] == cur) out->push_back({&n, i});
    }
  }
  return true;
}

FreezeReason Analysis::ExporterCheck(ValueId w) {
  const ir::Value& val = g_.value(w);
  if (val.exported_as == ir::ExportedAs::kBuffer) return FreezeReason::kExportedBuffer;
  std::vector<std::pair<const ir::Node*, int>> uses;
  const bool direct = EndUses(w, &uses) && !uses.empty();
  if (val.exported_as == ir::ExportedAs::kExporterMade) {
    // A Linear weight the exporter pre-transposed: the file's only copy of that parameter.
    bool transposed_weight = val.constant->rank() == 2 && direct;
    for (const auto& [n, i] : uses) {
      transposed_weight = transposed_weight && (n->op == ir::OpKind::kMatMul || (n->op == ir::OpKind::kGemm && i < 2));
    }
    if (!transposed_weight) return FreezeReason::kExporterMade;
  }
  if (IsZeroRow(*val.constant) && direct) {
    // Added to activations: the other operand derives from graph data or a parameter (a zero row
    // added to a constant, e.g. a gate 1 + g, is a reparametrised parameter).
    bool added = true;
    for (const auto& [n, i] : uses) {
      const ValueId other = n->inputs.size() == 2 ? n->inputs[1 - i] : ir::kNoValue;
      added = added && (n->op == ir::OpKind::kAdd || n->op == ir::OpKind::kSub) && other != ir::kNoValue &&
              source_[other] != kNoSource;
    }
    if (added) return FreezeReason::kZeroRow;
  }
  return FreezeReason::kNone;
}

absl::StatusOr<std::optional<std::regex>> CompileRegex(const std::string& pattern, const char* flag) {
  if (pattern.empty()) return std::optional<std::regex>();
  try {
    return std::optional<std::regex>(std::regex(pattern, std::regex::ECMAScript));
  } catch (const std::regex_error& e) {
    return INVALID_ARGUMENT() << flag << " regex '" << pattern << "' is invalid: " << e.what();
  }
}

absl::StatusOr<TrainableReport> Analysis::Run(const TrainableOptions& options) {
  ASSIGN_OR_RETURN(std::optional<std::regex> freeze, CompileRegex(options.freeze_regex, "--freeze"));
  ASSIGN_OR_RETURN(std::optional<std::regex> train_only, CompileRegex(options.train_only_regex, "--train-only"));
  const int32_t nv = g_.num_values();
  std::vector<ValueId> targets = g_.outputs();
  for (ValueId t : options.targets) {
    if (t < 0 || t >= nv) return INVALID_ARGUMENT() << "target value id " << t << " out of range";
    targets.push_back(t);
  }
  MarkReachable(targets);

  TrainableReport report;
  std::vector<bool> is_source(nv, false);
  std::vector<size_t> pending;  // indices into report.decisions left to the positional check
  for (ValueId v = 0; v < nv; ++v) {
    const ir::Value& val = g_.value(v);
    if (!IsInitializer(val)) continue;
    if (!ir::IsFloat(val.dtype)) {
      report.decisions.push_back({v, false, FreezeReason::kNonFloat});
      continue;
    }
    if (val.param_state != ir::ParamState::kUndecided) {
      is_source[v] = val.param_state == ir::ParamState::kTrainable;
      continue;
    }
    InitializerDecision d{v, false, FreezeReason::kNone};
    if (freeze && std::regex_search(val.name, *freeze)) {
      d.reason = FreezeReason::kUserFreeze;
    } else if (train_only) {
      d.trainable = std::regex_search(val.name, *train_only);
      if (!d.trainable) d.reason = FreezeReason::kNotTrainOnly;
    } else if (!reaches_any_[v]) {
      d.reason = FreezeReason::kUnused;
    } else if (!reaches_grad_[v]) {
      d.reason = FreezeReason::kNoGradient;
    } else if (HoldsSentinel(*val.constant)) {
      d.reason = FreezeReason::kSentinel;
    } else if (val.constant->rank() == 0) {
      d.reason = FreezeReason::kScalar;
    } else if (IsSinusoidalTable(*val.constant)) {
      d.reason = FreezeReason::kSinusoidal;
    } else {
      d.trainable = true;
      pending.push_back(report.decisions.size());
    }
    is_source[v] = d.trainable;
    report.decisions.push_back(d);
  }
  if (pending.empty()) return report;

  ComputeSources(is_source);
  uses_ = g_.ComputeUses();
  position_.assign(g_.num_node_slots(), -1);
  for (size_t i = 0; i < order_.size(); ++i) position_[order_[i]] = static_cast<int>(i);
  for (size_t k : pending) {
    InitializerDecision& d = report.decisions[k];
    d.reason = PositionalCheck(d.value);
    if (d.reason == FreezeReason::kNone) d.reason = ExporterCheck(d.value);
    d.trainable = d.reason == FreezeReason::kNone;
  }
  return report;
}

}  // namespace

std::string_view FreezeReasonText(FreezeReason r) {
  switch (r) {
    case FreezeReason::kNone:
      return "trained";
    case FreezeReason::kUserFreeze:
      return "matched by --freeze";
    case FreezeReason::kNotTrainOnly:
      return "not matched by --train-only";
    case FreezeReason::kNonFloat:
      return "integer/bool initializers (indices, shapes, masks; never trained)";
    case FreezeReason::kUnused:
      return "not used by the outputs";
    case FreezeReason::kNoGradient:
      return "no gradient path (used only as index, shape, condition or comparison operand)";
    case FreezeReason::kSentinel:
      return "mask fill values (inf, NaN or finfo.min/max)";
    case FreezeReason::kScalar:
      return "rank-0 exporter literals (eps, scales, exponents, fill values)";
    case FreezeReason::kSinusoidal:
      return "sinusoidal position tables (sin/cos of the row index)";
    case FreezeReason::kPositional:
      return "positional buffers (multiplied by positions before meeting activations: rotary inv_freq, ALiBi "
             "slopes)";
    case FreezeReason::kExportedBuffer:
      return "buffers by the file's torch.export signature (registered buffers, lifted tensor constants)";
    case FreezeReason::kExporterMade:
      return "exporter-made constants (the file's torch.export signature names no parameter for them: folded "
             "module state, e.g. a position table gathered at fixed positions)";
    case FreezeReason::kZeroRow:
      return "all-zero (1, ..., 1, N) rows added to activations (zero buffers such as BART's final_logits_bias)";
  }
  return "?";
}

std::string_view FreezeReasonKey(FreezeReason r) {
  switch (r) {
    case FreezeReason::kNone:
      return "trained";
    case FreezeReason::kUserFreeze:
      return "freeze_flag";
    case FreezeReason::kNotTrainOnly:
      return "not_train_only";
    case FreezeReason::kNonFloat:
      return "non_float";
    case FreezeReason::kUnused:
      return "unused";
    case FreezeReason::kNoGradient:
      return "no_gradient";
    case FreezeReason::kSentinel:
      return "sentinel";
    case FreezeReason::kScalar:
      return "scalar";
    case FreezeReason::kSinusoidal:
      return "sinusoidal";
    case FreezeReason::kPositional:
      return "positional";
    case FreezeReason::kExportedBuffer:
      return "exported_buffer";
    case FreezeReason::kExporterMade:
      return "exporter_made";
    case FreezeReason::kZeroRow:
      return "zero_row";
  }
  return "?";
}

int64_t TrainableReport::num_trainable() const {
  int64_t n = 0;
  for (const InitializerDecision& d : decisions) n += d.trainable ? 1 : 0;
  return n;
}

std::vector<std::string> TrainableReport::SummaryLines(const ir::Graph& g, int max_names) const {
  std::map<FreezeReason, std::vector<ValueId>> groups;
  for (const InitializerDecision& d : decisions)
    if (!d.trainable) groups[d.reason].push_back(d.value);
  std::vector<std::string> lines;
  for (const auto& [reason, values] : groups) {
    std::string line = std::string(FreezeReasonText(reason)) + ": " + std::to_string(values.size()) + " (";
    for (size_t i = 0; i < values.size() && i < static_cast<size_t>(max_names); ++i)
      line += (i ? ", " : "") + g.value(values[i]).name;
    if (values.size() > static_cast<size_t>(max_names)) line += ", ...";
    lines.push_back(line + ")");
  }
  return lines;
}

absl::StatusOr<TrainableReport> DecideTrainable(const ir::Graph& g, const TrainableOptions& options) {
  Analysis a(g, GradRegistry::Get());
  return a.Run(options);
}

void ApplyTrainable(ir::Graph* g, const TrainableReport& report) {
  for (const InitializerDecision& d : report.decisions) {
    ir::Value& v = g->value(d.value);
    if (!ir::IsFloat(v.dtype)) continue;
    v.param_state = d.trainable ? ir::ParamState::kTrainable : ir::ParamState::kFrozen;
  }
}

absl::StatusOr<TrainableReport> MarkTrainable(ir::Graph* g, const TrainableOptions& options) {
  ASSIGN_OR_RETURN(TrainableReport report, DecideTrainable(*g, options));
  ApplyTrainable(g, report);
  return report;
}

}  // namespace onnxpipe::autodiff
