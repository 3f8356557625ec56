// Argument checks shared by the backends' memory calls: a tensor is where the call expects it,
// a copy's two ends agree on dtype and dims.
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "frontend/ir/tensor.h"

namespace onnxpipe::backend {

// `t` has data and lives at `where`; else an error naming `what` (the call) and both placements.
absl::Status CheckPlaced(const ir::Tensor& t, ir::Placement where, std::string_view what);
// src at src_at and dst at dst_at, both with data, same dtype and dims.
absl::Status CheckCopy(const ir::Tensor& src, ir::Placement src_at, const ir::Tensor& dst, ir::Placement dst_at,
                       std::string_view what = "copy");

}  // namespace onnxpipe::backend
