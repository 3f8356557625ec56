#include "executor/runtime/interpreter.h"

#include <cmath>

#include "frontend/ir/status.h"

namespace onnxpipe::runtime {

absl::Status CheckInput(const ir::Graph& g, ir::ValueId input, const ir::Tensor& t,
                        std::map<std::string, int64_t>* bindings) {
  const ir::Value& v = g.value(input);
  auto describe = [&] {
    std::string dims;
    for (int64_t d : t.dims()) dims += (dims.empty() ? "" : ",") + std::to_string(d);
    return std::string(ir::DTypeName(t.dtype())) + "[" + dims + "]";
  };
  if (t.dtype() != v.dtype) {
    return INVALID_ARGUMENT() << "input '" << v.name << "' expects " << ir::DTypeName(v.dtype)
                              << ir::ShapeToString(v.shape) << " but got " << describe();
  }
  if (!v.shape_known) return absl::OkStatus();
  if (static_cast<size_t>(t.rank()) != v.shape.size()) {
    return INVALID_ARGUMENT() << "input '" << v.name << "' expects rank " << v.shape.size() << " "
                              << ir::ShapeToString(v.shape) << " but got " << describe();
  }
  for (size_t i = 0; i < v.shape.size(); ++i) {
    const ir::Dim& d = v.shape[i];
    const int64_t got = t.dims()[i];
    if (d.is_concrete()) {
      if (d.value() != got) {
        return INVALID_ARGUMENT() << "input '" << v.name << "' expects " << ir::ShapeToString(v.shape) << " but got "
                                  << describe() << " (dim " << i << ")";
      }
      continue;
    }
    if (d.symbols().size() != 1 || d.factor() != 1 || d.is_unknown()) continue;
    const std::string& sym = d.symbols()[0];
    auto [it, inserted] = bindings->emplace(sym, got);
    if (!inserted && it->second != got) {
      return INVALID_ARGUMENT() << "input '" << v.name << "' dim " << i << " ('" << sym << "') is " << got
                                << " but another input bound it to " << it->second;
    }
  }
  return absl::OkStatus();
}

bool AllFinite(const ir::Tensor& t) {
  const int64_t n = t.num_elements();
  if (t.dtype() == ir::DType::kF32) {
    const float* p = t.data<float>();
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(p[i])) return false;
  } else if (t.dtype() == ir::DType::kF64) {
    const double* p = t.data<double>();
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(p[i])) return false;
  }
  return true;
}

namespace {

// Evaluates the graph and returns the graph outputs followed by the values of `extra` (which are
// kept alive until the end like outputs).
absl::StatusOr<std::vector<ir::Tensor>> InterpretImpl(const ir::Graph& g, const ir::OpEvaluator& ev,
                                                      const std::vector<ir::Tensor>& inputs,
                                                      const InterpreterOptions& options,
                                                      const std::vector<ir::ValueId>& extra) {
  if (inputs.size() != g.inputs().size()) {
    return INVALID_ARGUMENT() << "the model has " << g.inputs().size() << " inputs but " << inputs.size()
                              << " were given";
  }
  std::map<std::string, int64_t> bindings;
  std::vector<ir::Tensor> values(g.num_values());
  for (size_t i = 0; i < inputs.size(); ++i) {
    RETURN_IF_ERROR(CheckInput(g, g.inputs()[i], inputs[i], &bindings));
    values[g.inputs()[i]] = inputs[i];
  }
  // Remaining uses per value, so that intermediates are released as soon as possible.
  std::vector<int> remaining(g.num_values(), 0);
  const std::vector<ir::NodeId> order = g.LiveNodes();
  for (ir::NodeId id : order)
    for (ir::ValueId v : g.node(id).inputs)
      if (v != ir::kNoValue) ++remaining[v];
  for (ir::ValueId v : g.outputs()) ++remaining[v];
  for (ir::ValueId v : extra) ++remaining[v];

  std::vector<ir::Tensor> operands;
  for (ir::NodeId id : order) {
    const ir::Node& n = g.node(id);
    operands.clear();
    for (ir::ValueId v : n.inputs) {
      if (v == ir::kNoValue) {
        operands.emplace_back();
      } else if (g.value(v).constant) {
        operands.push_back(*g.value(v).constant);
      } else {
        RET_CHECK(values[v].defined()) << "value '" << g.value(v).name << "' used by node '" << n.name
                                       << "' was never computed";
        operands.push_back(values[v]);
      }
    }
    absl::StatusOr<std::vector<ir::Tensor>> out = ev.Evaluate(n, operands);
    if (!out.ok()) {
      return Annotate(out.status(), ir::NodeLabel(n));
    }
    RET_CHECK(out->size() >= n.outputs.size()) << "kernel for " << ir::OpName(n.op) << " returned too few outputs";
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      ir::ValueId v = n.outputs[k];
      if (v == ir::kNoValue) continue;
      if (options.check_numerics && !AllFinite((*out)[k])) {
        return FAILED_PRECONDITION() << "node '" << n.name << "' (" << ir::OpName(n.op)
                                     << ") produced a non-finite value in output '" << g.value(v).name << "'";
      }
      values[v] = std::move((*out)[k]);
    }
    for (ir::ValueId v : n.inputs) {
      if (v != ir::kNoValue && --remaining[v] == 0) values[v] = ir::Tensor();
    }
  }
  std::vector<ir::Tensor> result;
  for (ir::ValueId v : g.outputs()) {
    result.push_back(g.value(v).constant ? *g.value(v).constant : values[v]);
  }
  for (ir::ValueId v : extra) {
    result.push_back(g.value(v).constant ? *g.value(v).constant : values[v]);
  }
  return result;
}

}  // namespace

absl::StatusOr<std::vector<ir::Tensor>> Interpret(const ir::Graph& g, const ir::OpEvaluator& ev,
                                                  const std::vector<ir::Tensor>& inputs,
                                                  const InterpreterOptions& options) {
  return InterpretImpl(g, ev, inputs, options, /*extra=*/{});
}

absl::StatusOr<StepResult> InterpretStep(const ir::Graph& g, const ir::OpEvaluator& ev,
                                         const std::vector<ir::Tensor>& inputs, const InterpreterOptions& options) {
  std::vector<ir::ValueId> extra;
  for (const ir::Graph::StateUpdate& u : g.state_updates()) {
    RET_CHECK(u.state >= 0 && u.state < g.num_values() && u.new_value >= 0 && u.new_value < g.num_values());
    extra.push_back(u.new_value);
  }
  ASSIGN_OR_RETURN(std::vector<ir::Tensor> all, InterpretImpl(g, ev, inputs, options, extra));
  StepResult r;
  const size_t n_out = g.outputs().size();
  r.outputs.assign(std::make_move_iterator(all.begin()), std::make_move_iterator(all.begin() + n_out));
  r.state.assign(std::make_move_iterator(all.begin() + n_out), std::make_move_iterator(all.end()));
  return r;
}

absl::Status ApplyStateUpdates(ir::Graph& g, std::vector<ir::Tensor> state) {
  RET_CHECK(state.size() == g.state_updates().size())
      << "got " << state.size() << " state values for " << g.state_updates().size() << " updates";
  for (size_t i = 0; i < state.size(); ++i) {
    ir::Value& s = g.value(g.state_updates()[i].state);
    if (!s.constant) {
      return FAILED_PRECONDITION() << "state '" << s.name << "' is not a constant of the graph";
    }
    if (!state[i].defined() || state[i].dtype() != s.constant->dtype() || state[i].dims() != s.constant->dims()) {
      return FAILED_PRECONDITION() << "the new value of state '" << s.name << "' does not match its dtype and dims";
    }
    s.constant = std::move(state[i]);
  }
  return absl::OkStatus();
}

}  // namespace onnxpipe::runtime
