// Evaluates a whole graph node by node on host tensors with an OpEvaluator, freeing each value
// after its last use. The reference path for `onnxpipe run`, conformance tests and checks of the
// planned executors against it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/evaluator.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::runtime {

struct InterpreterOptions {
  // Name the first node producing a NaN or Inf (in any float output) instead of running on.
  bool check_numerics = false;
};

// Checks a feed against the graph input's dtype and dims; symbolic dims are bound consistently
// across inputs (the bindings found are added to `bindings`). Errors name the input.
absl::Status CheckInput(const ir::Graph& g, ir::ValueId input, const ir::Tensor& t,
                        std::map<std::string, int64_t>* bindings);

// inputs: one tensor per graph input, in graph-input order. Returns one tensor per graph output.
absl::StatusOr<std::vector<ir::Tensor>> Interpret(const ir::Graph& g, const ir::OpEvaluator& ev,
                                                  const std::vector<ir::Tensor>& inputs,
                                                  const InterpreterOptions& options = {});

// One evaluation of a training graph: its outputs and the new value of every state (parameter or
// optimizer state) that the graph updates.
struct StepResult {
  std::vector<ir::Tensor> outputs;  // one per graph output
  std::vector<ir::Tensor> state;    // state[i] is the new value of g.state_updates()[i].state
};

// Interpret, also returning the values named by Graph::state_updates() (kept alive to the end).
absl::StatusOr<StepResult> InterpretStep(const ir::Graph& g, const ir::OpEvaluator& ev,
                                         const std::vector<ir::Tensor>& inputs,
                                         const InterpreterOptions& options = {});

// Stores state[i] as the constant of g.state_updates()[i].state (the parameter store of the CPU
// reference path), after checking that it keeps the state's dtype and dims.
absl::Status ApplyStateUpdates(ir::Graph& g, std::vector<ir::Tensor> state);

// True when every element of a float tensor is finite (non-float tensors: always true).
bool AllFinite(const ir::Tensor& t);

}  // namespace onnxpipe::runtime
