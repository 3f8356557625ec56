#include "frontend/onnx/export_signature.h"

namespace onnxpipe::onnx_frontend {

std::map<std::string, ir::ExportedAs> ParseTorchExportSignature(std::string_view text) {
  std::map<std::string, ir::ExportedAs> out;
  constexpr std::string_view kTarget = " target='";
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    const size_t colon = line.find(": ");
    if (colon == std::string_view::npos) continue;
    std::string_view rest = line.substr(colon + 2);
    ir::ExportedAs role;
    if (rest.starts_with("PARAMETER")) {
      role = ir::ExportedAs::kParameter;
    } else if (rest.starts_with("BUFFER") || rest.starts_with("CONSTANT_TENSOR")) {
      role = ir::ExportedAs::kBuffer;
    } else {
      continue;
    }
    const size_t t = rest.find(kTarget);
    if (t == std::string_view::npos) continue;
    rest = rest.substr(t + kTarget.size());
    const size_t end = rest.find('\'');
    if (end == std::string_view::npos || end == 0) continue;
    out[std::string(rest.substr(0, end))] = role;
  }
  return out;
}

bool ApplyTorchExportSignature(std::string_view signature, ir::Graph* g) {
  const std::map<std::string, ir::ExportedAs> roles = ParseTorchExportSignature(signature);
  bool names_a_parameter = false;
  for (const auto& [target, role] : roles) {
    const ir::ValueId v = g->FindValue(target);
    if (role == ir::ExportedAs::kParameter && v != ir::kNoValue && g->value(v).is_initializer) {
      names_a_parameter = true;
      break;
    }
  }
  if (!names_a_parameter) return false;
  for (ir::ValueId v = 0; v < g->num_values(); ++v) {
    ir::Value& val = g->value(v);
    if (!val.is_initializer) continue;
    auto it = roles.find(val.name);
    val.exported_as = it == roles.end() ? ir::ExportedAs::kExporterMade : it->second;
  }
  return true;
}

}  // namespace onnxpipe::onnx_frontend
