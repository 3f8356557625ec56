// Numerical checks of rewrites: evaluate a graph before and after a pass on the same random
// inputs with the CPU backend's evaluator (inference mode: Dropout is the identity) and compare.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/ir/tensor.h"

namespace onnxpipe::passes::testing {

// One tensor per graph input: floats uniform in [-1, 1), bools true with probability 0.8,
// integers in [0, int_high). Symbolic dims are taken from `dims` ("B" -> 2).
absl::StatusOr<std::vector<ir::Tensor>> RandomFeeds(const ir::Graph& g, const std::map<std::string, int64_t>& dims,
                                                    uint32_t seed, int64_t int_high = 4);

// Evaluates the graph on the CPU backend (inference mode; `training`: random ops active, seed 1).
absl::StatusOr<std::vector<ir::Tensor>> Evaluate(const ir::Graph& g, const std::vector<ir::Tensor>& feeds,
                                                 bool training = false);

// Output 0 of `g` differentiated (autodiff::BuildGradients), evaluated on RandomFeeds(seed 7): the
// loss and every parameter's gradient; `training`: random ops active (Evaluate's).
absl::StatusOr<std::vector<ir::Tensor>> LossAndGradients(ir::Graph g, bool training);

// `g` written as a stage ONNX file (onnx_frontend::ExportStageOnnx) under the temporary directory as
// `name`, imported back and shape-inferred; the file is removed.
absl::StatusOr<ir::Graph> StageOnnxRoundTrip(const ir::Graph& g, const std::string& name);

// Largest |a - b| over all outputs (as double); fails when dtypes/dims differ or a value is NaN
// in one and not the other.
absl::StatusOr<double> MaxAbsDiff(const std::vector<ir::Tensor>& a, const std::vector<ir::Tensor>& b);

// MaxAbsDiff of the outputs of graphs `a` and `b` (one graph before and after a rewrite: the same
// inputs) evaluated (inference mode) on the same RandomFeeds(a, {}, seed).
absl::StatusOr<double> MaxAbsDiffOnRandomFeeds(const ir::Graph& a, const ir::Graph& b, uint32_t seed);

}  // namespace onnxpipe::passes::testing
