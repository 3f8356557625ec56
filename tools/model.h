// Loading a model for any subcommand: import the ONNX file, infer shapes, bind the symbolic batch
// and sequence dims, fold and fuse. Shared by inspect, run, train and partition.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/onnx/loader.h"

namespace onnxpipe::tools {

struct ModelOptions {
  int64_t batch = 0;  // 0: leave the batch symbol unbound
  int64_t seq = 0;    // 0: leave the sequence symbol unbound
  std::map<std::string, int64_t> extra_dims;  // --dim NAME=V
  bool fuse = true;
  bool allow_unsupported = false;  // inspect: report unsupported ops instead of failing
  // kF64: the graph computes in f64 before it is folded (ir::ConvertComputePrecision); otherwise as exported.
  ir::DType compute = ir::DType::kF32;
};

struct Model {
  onnx_frontend::ModelSummary summary;
  std::vector<std::string> warnings;
  std::optional<ir::Graph> imported;  // as imported (before folding and fusion)
  std::optional<ir::Graph> graph;     // after binding, folding and fusion
  std::map<std::string, int64_t> bindings;
};

// Symbols that name the batch and sequence dims: a symbol at position 0 of a graph input is the
// batch; one at position 1 (and never at 0) is the sequence.
struct DimRoles {
  std::vector<std::string> batch, seq, other;
};
DimRoles ClassifySymbols(const ir::Graph& g);

// The bindings a dataset decided for g's symbols (Dataset::Load's), less the batch symbols, which
// --batch decides: what a training run binds as ModelOptions::extra_dims.
std::map<std::string, int64_t> NonBatchBindings(const ir::Graph& g,
                                                const std::map<std::string, int64_t>& bindings);

// Imports the file and infers shapes (Model::imported); with unsupported ops and
// allow_unsupported, only the summary is filled.
absl::StatusOr<Model> ImportModel(const std::string& path, bool allow_unsupported,
                                  std::map<std::string, ir::Tensor> constant_inputs = {});
// Binds dims, folds and fuses Model::imported into Model::graph.
absl::Status PrepareModel(Model& model, const ModelOptions& options);
// ImportModel + PrepareModel.
absl::StatusOr<Model> LoadModel(const std::string& path, const ModelOptions& options);

// Histogram of live node op names.
std::map<std::string, int64_t> OpHistogram(const ir::Graph& g);

}  // namespace onnxpipe::tools
