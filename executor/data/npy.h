// NumPy .npy files <-> ir::Tensor.
//
// Reads format versions 1.0, 2.0 and 3.0, C order, little-endian dtypes '<f4' '<f8' '<i8' '<i4'
// '<f2', and the one-byte '|b1' '|u1' '|i1' (written by numpy as np.save does). Everything else is
// InvalidArgument naming the file and what was expected: bad magic or version, a header that is
// truncated or not the dict numpy writes (keys descr, fortran_order, shape), fortran_order True,
// big-endian or unsupported dtypes, negative or overflowing shapes, data shorter or longer than the
// shape needs, bool bytes other than 0/1. A missing file is NotFound. Nothing is allocated before
// the data size has been checked against the file size, so a hostile shape cannot exhaust memory.
//
// Writes version 1.0 (2.0 when the header needs it) with numpy's header layout (padded so the
// data starts on a 64-byte boundary), atomically: temp file, fsync, rename (executor/io).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "frontend/ir/tensor.h"

namespace onnxpipe::data {

absl::StatusOr<ir::Tensor> ReadNpy(const std::string& path);
// Parses the bytes of a whole .npy file; `name` stands for the file in error messages.
absl::StatusOr<ir::Tensor> ParseNpy(std::string_view bytes, const std::string& name);

absl::Status WriteNpy(const std::string& path, const ir::Tensor& t);
// The bytes WriteNpy writes (InvalidArgument for dtypes .npy cannot hold here, e.g. bf16).
absl::StatusOr<std::string> SerializeNpy(const ir::Tensor& t);

}  // namespace onnxpipe::data
