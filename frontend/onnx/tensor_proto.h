// Internal to frontend/onnx: ONNX TensorProto/TypeProto <-> IR conversions and the checks that
// keep them safe on hostile input (element-count limits, data sizes, external-data paths).
// Every error names the tensor; callers add the file and the context (initializer, attribute).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "frontend/ir/dtype.h"
#include "frontend/ir/shape.h"
#include "frontend/ir/tensor.h"
#include "onnx/onnx_pb.h"

namespace onnxpipe::onnx_frontend {

// Largest element count accepted for any tensor or declared shape: 2^40.
constexpr int64_t kMaxElements = int64_t{1} << 40;

// ONNX TensorProto::DataType -> IR dtype; InvalidArgument naming the ONNX type otherwise.
absl::StatusOr<ir::DType> DTypeFromOnnx(int32_t elem_type);
int32_t OnnxFromDType(ir::DType dtype);
// "FLOAT", "STRING", ... or the number when it is not a known enum value.
std::string OnnxTypeName(int32_t elem_type);

// Each dim non-negative and <= 2^40, product <= 2^40 (no overflow). Returns the element count.
// `what` names the tensor or value in the message.
absl::StatusOr<int64_t> CheckedElementCount(absl::Span<const int64_t> dims, const std::string& what);

// An external-data reference after validation: `path` is inside the base folder and exists.
struct ExternalData {
  std::string location;  // as written in the file
  std::string path;      // resolved path
  int64_t offset = 0;
  int64_t length = -1;   // -1: not given
};

// Validates `location` against `base_dir`: refuses empty, absolute, '..'-escaping paths and
// symlinks that resolve outside the folder; NotFound when the file is missing.
absl::StatusOr<std::string> ResolveExternalPath(const std::string& base_dir,
                                                const std::string& location,
                                                const std::string& tensor_name);
// Parses and validates the external_data entries of `t` (location/offset/length).
absl::StatusOr<ExternalData> ParseExternalData(const onnx::TensorProto& t,
                                               const std::string& base_dir);

// What a TensorProto holds, after every check short of reading its data: dtype supported, dims
// sane, inline data of the right size, external data inside the folder and long enough.
struct TensorLayout {
  ir::DType dtype = ir::DType::kF32;
  std::vector<int64_t> dims;
  int64_t num_elements = 0, num_bytes = 0;
  enum Source { kRaw, kTyped, kExternal } source = kTyped;
  ExternalData external;  // when source == kExternal
};
absl::StatusOr<TensorLayout> InspectTensorProto(const onnx::TensorProto& t,
                                               const std::string& base_dir);

// TensorProto -> IR tensor: raw_data (little-endian) or the typed field of the dtype, or
// external data resolved against `base_dir` ("" refuses external data). Checks dims and that the
// data size matches dims and dtype. `external_file`, when given, receives the side file's path.
absl::StatusOr<ir::Tensor> TensorFromProto(const onnx::TensorProto& t, const std::string& base_dir,
                                           std::string* external_file = nullptr);

// Declared type of a value (graph input/output, value_info) as IR dtype and shape. `has_shape`
// is false when the file gives no shape; missing dims become Dim::Unknown(), dim_param symbols.
// `has_dtype` is false when the element type is UNDEFINED.
struct DeclaredType {
  ir::DType dtype = ir::DType::kF32;
  bool has_dtype = false;
  ir::Shape shape;
  bool has_shape = false;
};
absl::StatusOr<DeclaredType> DeclaredTypeFromProto(const onnx::TypeProto& type,
                                                   const std::string& value_name);

}  // namespace onnxpipe::onnx_frontend
