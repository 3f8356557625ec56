// Gated MLP activations on the GPU (frontend/ir/op.h: GatedActivation, GatedActivationGrad), f32 or
// bf16 (computed in fp32, each output rounded once), one launch each:
//   forward   y = act(gate) * up
//   backward  dgate = dy * up * act'(gate), dup = dy * act(gate)
// act = silu (x sigmoid(x)) or gelu (erf or tanh form), ir::GatedAct. The backward computes the
// gradients it is given buffers for (dgate or dup may be null, not both) from one read of dy, gate
// and up. Buffers: gate, up, y, dy, dgate, dup are dense (n) device pointers of T, float or
// __nv_bfloat16, moved in 16-byte accesses where every pointer is 16-byte aligned (map.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "frontend/ir/gated_activation.h"

#ifndef __CUDACC__
#include "absl/status/status.h"
#endif

namespace onnxpipe::cuda {

template <typename T>
cudaError_t LaunchGatedActivationForward(ir::GatedAct act, const T* gate, const T* up, T* y, int64_t n,
                                         cudaStream_t stream);
template <typename T>
cudaError_t LaunchGatedActivationBackward(ir::GatedAct act, const T* dy, const T* gate, const T* up, T* dgate, T* dup,
                                          int64_t n, cudaStream_t stream);

#ifndef __CUDACC__
template <typename T>
absl::Status GatedActivationForward(ir::GatedAct act, const T* gate, const T* up, T* y, int64_t n, cudaStream_t stream);
template <typename T>
absl::Status GatedActivationBackward(ir::GatedAct act, const T* dy, const T* gate, const T* up, T* dgate, T* dup,
                                     int64_t n, cudaStream_t stream);
#endif

}  // namespace onnxpipe::cuda
