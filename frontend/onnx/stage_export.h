// Writes an IR forward graph (a pipeline stage's forward subgraph) as a standard ONNX model
// (opset 17, IR version 8) that passes the ONNX checker and opens in Netron. No ONNX or protobuf
// type appears in this header.
//
// Every live node of `g` is written, in order; `g.inputs()` and `g.outputs()` become the model's
// inputs and outputs (with their concrete shapes); every constant a node reads becomes an
// initializer with its data. IR conventions are turned back into opset 17's: Reduce/Squeeze/
// Unsqueeze axes and Split sizes go back to constant inputs where opset 17 wants inputs, Cast's
// `to` to the ONNX enum, Dropout's ratio to an input (with training_mode = true: the stage is a
// training graph). Fused ops are written as standard ops:
//   Linear     -> Gemm (2-D input) or MatMul (+ Transpose of W when trans_b) + Add
//   LayerNorm  -> LayerNormalization (axis, epsilon; optional Mean / InvStdDev outputs)
//   Gelu       -> x * 0.5 * (1 + Erf(x / sqrt 2)), or the tanh formula
//   Attention  -> MatMul(Q, Transpose(K)) * scale (+ mask | Where(mask, ., -inf)) (+ causal
//                 triangle) -> Softmax -> Dropout -> MatMul(., V)
// Attributes that are onnxpipe-only (not in the op's opset-17 schema, e.g. rng_key) are dropped.
// Gradient and optimizer ops have no ONNX form here: an error names the node.
// Initializers larger than `external_threshold_bytes` go to `<path>.data` (ONNX external data,
// relative location) once their total passes 1 GiB, so stages of big models stay under
// protobuf's 2 GiB limit; files are written atomically.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::onnx_frontend {

struct StageExportOptions {
  std::string graph_name = "stage";
  std::string doc;  // stored as the graph's doc_string
  int64_t external_threshold_bytes = 1024;
  int64_t inline_limit_bytes = int64_t{1} << 30;  // external data only past this total
  bool check = true;  // run onnx::checker::check_model before writing
};

absl::Status ExportStageOnnx(const ir::Graph& g, const std::string& path,
                             const StageExportOptions& options = {});

}  // namespace onnxpipe::onnx_frontend
