// metadata_props of ONNX messages that libonnx 1.12 predates: GraphProto's (field 16) and
// NodeProto's (field 9), both IR >= 10. Protobuf keeps them among a message's unknown fields as
// length-delimited StringStringEntryProto messages; a newer libonnx that knows the field is read
// through reflection. Private to the ONNX frontend (protobuf types).
#pragma once

#include <string>
#include <string_view>

#include "google/protobuf/message.h"

namespace onnxpipe::onnx_frontend {

inline constexpr int kGraphMetadataField = 16;
inline constexpr int kNodeMetadataField = 9;

// The value of entry `key` of `message`'s metadata_props (field number `field`), or "" when absent.
std::string MetadataProp(const google::protobuf::Message& message, int field, std::string_view key);

// torch's dynamo exporter records the modules a node was made in as the node's metadata entry
// "pkg.torch.onnx.name_scopes": a Python list of the module paths from the root, then the op's own
// name, e.g. ['', 'm', 'm.model', 'm.model.layers.0', 'm.model.layers.0.self_attn', 'linear_3'].
// Returns the scope in the TorchScript exporter's form, each module's name relative to its parent:
// "/m/model/layers.0/self_attn"; "" when the list holds no module.
std::string ScopeOfNameScopes(std::string_view list);

}  // namespace onnxpipe::onnx_frontend
