// Checkpoint writer. Initializers are streamed one at a time (decode, write, drop) so that a
// checkpoint of a large model never holds a second copy of all its weights in memory.
#include "frontend/onnx/writer.h"

#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "frontend/ir/status.h"
#include "frontend/onnx/file_io.h"
#include "frontend/onnx/tensor_proto.h"
#include "onnx/onnx_pb.h"

namespace onnxpipe::onnx_frontend {
namespace {

constexpr int64_t kAlignment = 64;

std::string DimsString(const std::vector<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ","), "]");
}

// Points `t` at bytes stored inline or in the side file, dropping every other data field.
void ClearData(onnx::TensorProto& t) {
  t.clear_float_data();
  t.clear_int32_data();
  t.clear_string_data();
  t.clear_int64_data();
  t.clear_double_data();
  t.clear_uint64_data();
  t.clear_raw_data();
  t.clear_external_data();
  t.clear_data_location();
}

}  // namespace

absl::Status WriteOnnxWithInitializers(const std::string& src_model,
                                       const std::map<std::string, ir::Tensor>& new_values,
                                       const std::string& out_path,
                                       int64_t external_threshold_bytes) {
  onnx::ModelProto model;
  RETURN_IF_ERROR(ParseProtoFile(src_model, model, "ONNX model"));
  if (!model.has_graph()) return INVALID_ARGUMENT() << src_model << ": not an ONNX model (no graph)";
  const std::string src_dir = FolderOf(src_model);

  // Check every replacement against the initializer it replaces before writing anything.
  std::set<std::string> seen;
  for (const onnx::TensorProto& init : model.graph().initializer()) {
    auto it = new_values.find(init.name());
    if (it == new_values.end()) continue;
    seen.insert(init.name());
    const ir::Tensor& v = it->second;
    auto dtype = DTypeFromOnnx(init.data_type());
    if (!dtype.ok()) {
      return Annotate(dtype.status(), absl::StrCat(src_model, ": initializer '", init.name(), "'"));
    }
    const std::vector<int64_t> dims(init.dims().begin(), init.dims().end());
    if (!v.defined() || *dtype != v.dtype() || dims != v.dims()) {
      return INVALID_ARGUMENT() << out_path << ": new value of initializer '" << init.name()
                                << "' is " << ir::DTypeName(v.dtype()) << DimsString(v.dims())
                                << " but " << src_model << " declares "
                                << ir::DTypeName(*dtype) << DimsString(dims);
    }
  }
  for (const auto& [name, value] : new_values) {
    if (!seen.count(name)) {
      return NOT_FOUND() << out_path << ": '" << name << "' is not an initializer of "
                         << src_model;
    }
  }

  const std::string data_path = out_path + ".data";
  const std::string data_location = std::filesystem::path(data_path).filename().string();
  AtomicFileWriter data_file(data_path);
  bool data_open = false;
  for (onnx::TensorProto& init : *model.mutable_graph()->mutable_initializer()) {
    ir::Tensor value;
    auto it = new_values.find(init.name());
    if (it != new_values.end()) {
      value = it->second;
    } else {
      auto t = TensorFromProto(init, src_dir);
      if (!t.ok()) {
        return Annotate(t.status(), absl::StrCat(src_model, ": initializer '", init.name(), "'"));
      }
      value = std::move(*t);
    }
    ClearData(init);
    const int64_t nbytes = value.num_bytes();
    if (external_threshold_bytes >= 0 && nbytes > external_threshold_bytes) {
      if (!data_open) {
        RETURN_IF_ERROR(data_file.Open());
        data_open = true;
      }
      RETURN_IF_ERROR(data_file.PadTo(kAlignment));
      const int64_t offset = data_file.size();
      RETURN_IF_ERROR(data_file.Write(value.raw(), nbytes));
      init.set_data_location(onnx::TensorProto::EXTERNAL);
      for (const auto& [key, val] :
           {std::pair<std::string, std::string>{"location", data_location},
            {"offset", absl::StrCat(offset)},
            {"length", absl::StrCat(nbytes)}}) {
        auto* entry = init.add_external_data();
        entry->set_key(key);
        entry->set_value(val);
      }
    } else {
      init.set_raw_data(value.raw(), nbytes);
    }
  }

  std::string bytes;
  if (model.ByteSizeLong() > static_cast<size_t>(INT32_MAX) || !model.SerializeToString(&bytes)) {
    return INVALID_ARGUMENT() << out_path
                              << ": the model does not fit protobuf's 2 GiB limit; lower the "
                                 "external-data threshold";
  }
  if (data_open) RETURN_IF_ERROR(data_file.Commit());
  AtomicFileWriter model_file(out_path);
  RETURN_IF_ERROR(model_file.Open());
  RETURN_IF_ERROR(model_file.Write(bytes));
  return model_file.Commit();
}

}  // namespace onnxpipe::onnx_frontend
