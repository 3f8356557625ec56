#include "executor/backend/copy_checks.h"

#include <string>

#include "frontend/ir/status.h"

namespace onnxpipe::backend {

absl::Status CheckPlaced(const ir::Tensor& t, ir::Placement where, std::string_view what) {
  if (!t.has_data())
    return INVALID_ARGUMENT() << "cannot " << what << " a tensor without data (" << t.DebugString(0) << ")";
  if (!(t.placement() == where)) {
    return INVALID_ARGUMENT() << "cannot " << what << " a tensor on " << t.placement().ToString() << " here: expected "
                              << where.ToString();
  }
  return absl::OkStatus();
}

absl::Status CheckCopy(const ir::Tensor& src, ir::Placement src_at, const ir::Tensor& dst, ir::Placement dst_at,
                       std::string_view what) {
  RETURN_IF_ERROR(CheckPlaced(src, src_at, what));
  RETURN_IF_ERROR(CheckPlaced(dst, dst_at, what));
  if (src.dtype() != dst.dtype() || src.dims() != dst.dims()) {
    return INVALID_ARGUMENT() << "cannot " << what << " " << src.DebugString(0) << " into " << dst.DebugString(0);
  }
  return absl::OkStatus();
}

}  // namespace onnxpipe::backend
