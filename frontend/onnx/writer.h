// Writes checkpoints as ONNX files: the source model with some initializers' data replaced.
// No ONNX or protobuf type appears in this header.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "frontend/ir/tensor.h"

namespace onnxpipe::onnx_frontend {

// Copies the ONNX model `src_model` to `out_path`, replacing the data of the initializers named
// in `new_values` (each must exist, with the same dtype and dims: NotFound / InvalidArgument
// naming it otherwise). Every initializer (replaced or not, inline or external in the source)
// larger than `external_threshold_bytes` is written to the side file `<out_path>.data` as ONNX
// external data (64-byte aligned, location relative to the model's folder); smaller ones are
// stored inline as raw_data. A negative threshold keeps everything inline. Both files are
// written atomically (temp file, fsync, rename): the side file first, then the model, so a
// reader never sees a model whose side file is incomplete.
absl::Status WriteOnnxWithInitializers(const std::string& src_model,
                                       const std::map<std::string, ir::Tensor>& new_values,
                                       const std::string& out_path,
                                       int64_t external_threshold_bytes);

}  // namespace onnxpipe::onnx_frontend
