#include "frontend/onnx/proto_metadata.h"

#include <vector>

#include "onnx/onnx_pb.h"

namespace onnxpipe::onnx_frontend {

std::string MetadataProp(const google::protobuf::Message& message, int field, std::string_view key) {
  const google::protobuf::FieldDescriptor* known = message.GetDescriptor()->FindFieldByNumber(field);
  if (known != nullptr) {
    if (!known->is_repeated() || known->type() != google::protobuf::FieldDescriptor::TYPE_MESSAGE) return "";
    const google::protobuf::Reflection* r = message.GetReflection();
    for (int i = 0; i < r->FieldSize(message, known); ++i) {
      onnx::StringStringEntryProto e;
      if (e.ParseFromString(r->GetRepeatedMessage(message, known, i).SerializeAsString()) && e.key() == key) {
        return e.value();
      }
    }
    return "";
  }
  const google::protobuf::UnknownFieldSet& unknown = message.GetReflection()->GetUnknownFields(message);
  for (int i = 0; i < unknown.field_count(); ++i) {
    const google::protobuf::UnknownField& f = unknown.field(i);
    if (f.number() != field || f.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
    onnx::StringStringEntryProto e;
    if (e.ParseFromString(f.length_delimited()) && e.key() == key) return e.value();
  }
  return "";
}

std::string ScopeOfNameScopes(std::string_view list) {
  std::vector<std::string_view> items;  // the quoted strings, in order
  for (size_t pos = 0; pos < list.size();) {
    const size_t open = list.find_first_of("'\"", pos);
    if (open == std::string_view::npos) break;
    const size_t close = list.find(list[open], open + 1);
    if (close == std::string_view::npos) break;
    items.push_back(list.substr(open + 1, close - open - 1));
    pos = close + 1;
  }
  if (items.size() < 2) return "";
  items.pop_back();  // the op's own name
  std::string scope;
  std::string_view parent;
  for (std::string_view path : items) {
    if (path.empty()) continue;
    std::string_view name = path;
    if (!parent.empty() && path.size() > parent.size() + 1 && path.substr(0, parent.size()) == parent &&
        path[parent.size()] == '.') {
      name = path.substr(parent.size() + 1);
    }
    scope.append("/").append(name);
    parent = path;
  }
  return scope;
}

}  // namespace onnxpipe::onnx_frontend
