// Imports ONNX models into the IR. No ONNX or protobuf type appears in this header.
//
// Accepted: ai.onnx opsets 13-23, tensors of f32, f64, f16, bf16, i64, i32, i8, u8, bool.
// - Opsets 13-17 (IR version <= 8) go through libonnx 1.12's checker and shape inference; the
//   inferred value_info shapes become IR value shapes (dim_value -> concrete, dim_param ->
//   Dim::Symbol, missing -> Dim::Unknown()).
// - Opsets 18-23 are unknown to libonnx 1.12: onnxpipe validates the structure itself, sets only
//   the shapes the file declares (graph inputs, initializers, value_info, outputs) and adds a
//   warning; ir::InferShapes (run by the pipeline after loading) infers the rest.
// - Initializers become constant values (is_initializer); graph inputs that are also
//   initializers are initializers. Constant nodes become constant values, not nodes.
// - External data (weights in side files) is resolved against the model file's folder; absolute
//   paths, '..' escapes and symlinks leaving the folder are refused.
// The returned graph is topologically sorted and passes ir::Verify. Every failure is an
// InvalidArgument (NotFound for missing files) whose message names the file and, where it
// applies, the node, op type, value or tensor and what was expected; no input crashes or hangs.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/ir/tensor.h"

namespace onnxpipe::onnx_frontend {

struct UnsupportedOp {
  std::string node_name, op_type, domain;
};

struct ModelSummary {
  std::string producer_name, producer_version;
  int64_t ir_version = 0;
  std::map<std::string, int64_t> opset_imports;  // domain ("" = ai.onnx) -> version
  int64_t num_nodes = 0;                         // ONNX nodes as in the file
  std::map<std::string, int64_t> op_histogram;   // ONNX op_type -> count, as in the file
  std::vector<UnsupportedOp> unsupported;        // nodes with no importer
};

struct LoadOptions {
  // true: a model with unsupported ops returns its summary without a graph instead of failing.
  bool allow_unsupported = false;
  // Graph inputs fixed to known values: they become initializers before import, so operands
  // that ONNX allows at run time but onnxpipe needs at compile time (Reduce axes, Split sizes,
  // Dropout ratio fed as graph inputs) are constants. Unknown names are an error.
  std::map<std::string, ir::Tensor> constant_inputs;
};

struct LoadedModel {
  ModelSummary summary;
  std::optional<ir::Graph> graph;  // absent only when allow_unsupported and ops are unsupported
  std::vector<std::string> warnings;
};

// Loads `path`; external data is resolved against its folder.
absl::StatusOr<LoadedModel> LoadOnnxModel(const std::string& path, const LoadOptions& options = {});

// Loads serialized model bytes. `display_name` names the model in messages; `base_dir` resolves
// external data ("" refuses external data). Used by the fuzzer.
absl::StatusOr<LoadedModel> LoadOnnxModelFromBytes(std::string_view bytes,
                                                   const std::string& display_name,
                                                   const std::string& base_dir,
                                                   const LoadOptions& options = {});

// Loads a serialized TensorProto (ONNX backend-test input_<i>.pb / output_<i>.pb); external
// data is resolved against the file's folder.
absl::StatusOr<ir::Tensor> LoadTensorProtoFile(const std::string& path);

// ai.onnx opset range the loader accepts.
constexpr int64_t kMinOpset = 13;
constexpr int64_t kMaxOpset = 23;
// Highest ai.onnx opset (and IR version) libonnx 1.12's checker and shape inference know.
constexpr int64_t kMaxCheckedOpset = 17;
constexpr int64_t kMaxCheckedIrVersion = 8;

// Names of the graph inputs that are not initializers, in order (what a caller feeds).
absl::StatusOr<std::vector<std::string>> ReadGraphInputNames(const std::string& path);

// Sorted ai.onnx op types that have an importer.
std::vector<std::string> SupportedOnnxOps();

}  // namespace onnxpipe::onnx_frontend
