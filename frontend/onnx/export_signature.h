// torch.export's graph signature, which torch's dynamo exporter stores in the ONNX graph's metadata
// (GraphProto.metadata_props, key kTorchExportSignatureKey): one line per input of the exported
// program, e.g.
//   p_m_lm_head_weight: PARAMETER target='m.lm_head.weight'
//   b_m_final_logits_bias: BUFFER target='m.final_logits_bias' persistent=True
//   c_lifted_tensor_0: CONSTANT_TENSOR target='lifted_tensor_0'
//   input_ids: USER_INPUT
// The exporter names each parameter's and buffer's initializer after its target. This file reads
// the signature into ir::Value::exported_as, which the trainable-parameter rule uses
// (autodiff/trainable.h). IR types only; the loader extracts the text from the protobuf.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "frontend/ir/graph.h"

namespace onnxpipe::onnx_frontend {

inline constexpr std::string_view kTorchExportSignatureKey = "pkg.torch.export.ExportedProgram.graph_signature";

// target -> kParameter (PARAMETER) or kBuffer (BUFFER, CONSTANT_TENSOR) for the signature's lines of
// those kinds; other lines (user inputs, outputs, comments) and malformed ones are skipped.
std::map<std::string, ir::ExportedAs> ParseTorchExportSignature(std::string_view text);

// Sets exported_as of every initializer of `g` from `signature`: its role when a target names it,
// kExporterMade otherwise. Does nothing (returns false) when no PARAMETER target names an
// initializer: then the signature does not describe this graph's initializers (renamed by a tool).
bool ApplyTorchExportSignature(std::string_view signature, ir::Graph* g);

}  // namespace onnxpipe::onnx_frontend
