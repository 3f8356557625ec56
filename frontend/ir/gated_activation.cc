#include "frontend/ir/gated_activation.h"

#include "frontend/ir/attrs.h"

namespace onnxpipe::ir {

std::optional<GatedAct> GatedActOf(const Attrs& attrs) {
  const std::string activation = attrs.Get<std::string>("activation", "");
  const std::string approximate = attrs.Get<std::string>("approximate", "none");
  if (activation == "silu") return attrs.Has("approximate") ? std::nullopt : std::optional(GatedAct::kSilu);
  if (activation != "gelu") return std::nullopt;
  if (approximate == "none") return GatedAct::kGeluErf;
  if (approximate == "tanh") return GatedAct::kGeluTanh;
  return std::nullopt;
}

Attrs GatedActAttrs(GatedAct act) {
  Attrs a;
  a.Set("activation", std::string(act == GatedAct::kSilu ? "silu" : "gelu"));
  if (act != GatedAct::kSilu) a.Set("approximate", std::string(act == GatedAct::kGeluTanh ? "tanh" : "none"));
  return a;
}

std::string GatedActName(GatedAct act) {
  switch (act) {
    case GatedAct::kSilu:
      return "silu";
    case GatedAct::kGeluErf:
      return "gelu (erf)";
    case GatedAct::kGeluTanh:
      return "gelu (tanh)";
  }
  return "?";
}

}  // namespace onnxpipe::ir
