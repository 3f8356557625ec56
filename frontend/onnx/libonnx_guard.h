// Internal to frontend/onnx: guards around libonnx 1.12 functions that crash on bad models.
#pragma once

namespace onnxpipe::onnx_frontend {

// Wraps the shape-inference functions of libonnx 1.12 schemas that read or write out of bounds
// on invalid attributes, so that they throw InferenceError (which the loader reports) instead.
// Idempotent and thread-safe; call before onnx::shape_inference::InferShapes.
void GuardLibonnxInference();

}  // namespace onnxpipe::onnx_frontend
