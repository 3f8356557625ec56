// The activation of a GatedActivation / GatedActivationGrad node (op.h) as one enum, read from and
// written to its attributes in one place: the shape rule, the fusion pass, autodiff, the kernels of
// every backend and the stage export all go through these. Plain C++ (Attrs only declared), so
// the CUDA kernels (.cu) take the enum too.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace onnxpipe::ir {

class Attrs;

enum class GatedAct : uint8_t {
  kSilu,      // activation "silu": x * sigmoid(x)
  kGeluErf,   // activation "gelu", approximate "none": x * Phi(x)
  kGeluTanh,  // activation "gelu", approximate "tanh"
};

// The activation `attrs` name (activation, approximate); nullopt for anything op.h does not allow
// (an unknown activation, an approximation other than none/tanh, or one given for silu).
std::optional<GatedAct> GatedActOf(const Attrs& attrs);
// The attributes naming `act` (approximate only for gelu).
Attrs GatedActAttrs(GatedAct act);
// "silu", "gelu (erf)", "gelu (tanh)": for messages.
std::string GatedActName(GatedAct act);

}  // namespace onnxpipe::ir
