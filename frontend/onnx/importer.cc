// The importer framework: attribute reader, per-node context and the registry of op families.
#include "frontend/onnx/importer.h"

#include "absl/strings/str_cat.h"
#include "frontend/ir/infer.h"
#include "frontend/onnx/proto_metadata.h"
#include "frontend/onnx/tensor_proto.h"

namespace onnxpipe::onnx_frontend {

using onnx::AttributeProto;

// ---------------------------------------------------------------------------------------------
// AttrReader

const AttributeProto* AttrReader::Find(std::string_view name) const {
  for (const AttributeProto& a : node_.attribute()) {
    if (a.name() == name) return &a;
  }
  return nullptr;
}

absl::Status AttrReader::WrongType(const AttributeProto& a, const char* expected) const {
  const std::string got = AttributeProto::AttributeType_IsValid(a.type())
                              ? AttributeProto::AttributeType_Name(a.type())
                              : absl::StrCat(static_cast<int>(a.type()));
  return INVALID_ARGUMENT() << node_desc_ << ": attribute '" << a.name() << "' is of type " << got
                            << "; expected " << expected;
}

template <>
absl::StatusOr<int64_t> AttrReader::Read(const AttributeProto& a) const {
  if (a.type() != AttributeProto::INT) return WrongType(a, "INT");
  return static_cast<int64_t>(a.i());
}

template <>
absl::StatusOr<float> AttrReader::Read(const AttributeProto& a) const {
  if (a.type() != AttributeProto::FLOAT) return WrongType(a, "FLOAT");
  return a.f();
}

template <>
absl::StatusOr<double> AttrReader::Read(const AttributeProto& a) const {
  if (a.type() != AttributeProto::FLOAT) return WrongType(a, "FLOAT");
  return static_cast<double>(a.f());
}

template <>
absl::StatusOr<std::string> AttrReader::Read(const AttributeProto& a) const {
  if (a.type() != AttributeProto::STRING) return WrongType(a, "STRING");
  return a.s();
}

template <>
absl::StatusOr<std::vector<int64_t>> AttrReader::Read(const AttributeProto& a) const {
  if (a.type() != AttributeProto::INTS) return WrongType(a, "INTS");
  return std::vector<int64_t>(a.ints().begin(), a.ints().end());
}

template <>
absl::StatusOr<std::vector<double>> AttrReader::Read(const AttributeProto& a) const {
  if (a.type() != AttributeProto::FLOATS) return WrongType(a, "FLOATS");
  return std::vector<double>(a.floats().begin(), a.floats().end());
}

template <>
absl::StatusOr<ir::Tensor> AttrReader::Read(const AttributeProto& a) const {
  if (a.type() != AttributeProto::TENSOR) return WrongType(a, "TENSOR");
  auto t = TensorFromProto(a.t(), base_dir_);
  if (!t.ok()) return Annotate(t.status(), absl::StrCat(node_desc_, ": attribute '", a.name(), "'"));
  return t;
}

// ---------------------------------------------------------------------------------------------
// ImportContext

ImportContext::ImportContext(ir::Graph& graph, const onnx::NodeProto& node, std::string node_desc,
                             int64_t opset, std::vector<ir::ValueId> inputs,
                             std::vector<ir::ValueId> outputs, const std::string& base_dir,
                             std::vector<std::string>* warnings)
    : graph_(graph),
      node_(node),
      desc_(std::move(node_desc)),
      opset_(opset),
      inputs_(std::move(inputs)),
      outputs_(std::move(outputs)),
      attrs_(node, desc_, base_dir),
      warnings_(warnings) {
  const std::string scope = ScopeOfNameScopes(MetadataProp(node, kNodeMetadataField, "pkg.torch.onnx.name_scopes"));
  name_ = scope.empty() ? node.name() : absl::StrCat(scope, "/", node.name());
  while (!inputs_.empty() && inputs_.back() == ir::kNoValue) inputs_.pop_back();
  while (!outputs_.empty() && outputs_.back() == ir::kNoValue) outputs_.pop_back();
}

absl::StatusOr<ir::ValueId> ImportContext::RequiredInput(int i) const {
  if (!has_input(i)) return Error() << "missing required input " << i;
  return input(i);
}

absl::StatusOr<const ir::Tensor*> ImportContext::ConstantInput(int i, std::string_view role) const {
  if (!has_input(i)) return static_cast<const ir::Tensor*>(nullptr);
  const ir::Value& v = graph_.value(input(i));
  if (!v.constant) {
    return Error() << "input " << i << " ('" << v.name << "', " << role
                   << ") must be a constant (an initializer or a Constant node); onnxpipe needs "
                   << role << " at import time";
  }
  return &*v.constant;
}

absl::Status ImportContext::CheckNumInputs(int min, int max) const {
  if (num_inputs() < min || num_inputs() > max) {
    const std::string expected = min == max ? absl::StrCat(min) : absl::StrCat(min, " to ", max);
    return Error() << "has " << num_inputs() << " inputs; expected " << expected;
  }
  for (int i = 0; i < min; ++i) {
    if (!has_input(i)) return Error() << "missing required input " << i;
  }
  return absl::OkStatus();
}

void ImportContext::MaterializeAllOutputs() {
  outputs_.resize(node_.output_size(), ir::kNoValue);
  for (size_t i = 0; i < outputs_.size(); ++i) {
    if (outputs_[i] != ir::kNoValue) continue;
    outputs_[i] = graph_.AddValue(graph_.UniqueName(absl::StrCat(name_, "_unused_", i)), ir::DType::kF32, {},
                                  /*shape_known=*/false);
  }
}

absl::Status ImportContext::Emit(ir::OpKind op, std::vector<ir::ValueId> inputs, ir::Attrs attrs) {
  const ir::OpInfo& info = ir::GetOpInfo(op);
  if (num_outputs() < info.min_outputs || num_outputs() > info.max_outputs) {
    return Error() << "has " << num_outputs() << " outputs; onnxpipe's " << info.name
                   << " takes " << info.min_outputs << " to " << info.max_outputs;
  }
  while (!inputs.empty() && inputs.back() == ir::kNoValue) inputs.pop_back();
  if (static_cast<int>(inputs.size()) < info.min_inputs ||
      static_cast<int>(inputs.size()) > info.max_inputs) {
    return Error() << "has " << inputs.size() << " operands; onnxpipe's " << info.name
                   << " takes " << info.min_inputs << " to " << info.max_inputs;
  }
  graph_.AddNode(op, name_, std::move(inputs), outputs_, std::move(attrs));
  return absl::OkStatus();
}

ir::ValueId ImportContext::EmitHelper(ir::OpKind op, std::vector<ir::ValueId> inputs,
                                      ir::Attrs attrs) {
  const std::string base = absl::StrCat(name_, "/", std::string(ir::OpName(op)));
  const ir::ValueId out = graph_.AddValue(graph_.UniqueName(base + "_output"), ir::DType::kF32,
                                          {}, /*shape_known=*/false);
  graph_.AddNode(op, absl::StrCat(base, "_", helpers_++), std::move(inputs), {out}, std::move(attrs));
  return out;
}

ir::ValueId ImportContext::HelperConstant(ir::Tensor t) {
  return graph_.AddConstant(graph_.UniqueName(absl::StrCat(name_, "/const")), std::move(t));
}

absl::Status ImportContext::DefineConstant(ir::Tensor t) {
  if (num_outputs() != 1 || outputs_[0] == ir::kNoValue) {
    return Error() << "must have exactly one output";
  }
  ir::Value& v = graph_.value(outputs_[0]);
  v.dtype = t.dtype();
  v.shape = ir::FromInts(t.dims());
  v.shape_known = true;
  v.constant = std::move(t);
  return absl::OkStatus();
}

StatusBuilder ImportContext::Error() const {
  StatusBuilder b(absl::StatusCode::kInvalidArgument, __FILE__, __LINE__);
  b << desc_ << ": ";
  return b;
}

void ImportContext::Warn(const std::string& message) {
  if (warnings_) warnings_->push_back(absl::StrCat(desc_, ": ", message));
}

// ---------------------------------------------------------------------------------------------
// Registry

std::string_view CanonicalDomain(std::string_view domain) {
  return domain == "ai.onnx" ? std::string_view() : domain;
}

const ImporterRegistry& ImporterRegistry::Get() {
  static const ImporterRegistry* registry = [] {
    auto* r = new ImporterRegistry;
    RegisterElementwiseImporters(*r);
    RegisterActivationImporters(*r);
    RegisterShapeImporters(*r);
    RegisterReduceImporters(*r);
    RegisterMiscImporters(*r);
    RegisterEinsumImporter(*r);
    RegisterConvImporter(*r);
    RegisterAttentionImporters(*r);
    RegisterIndexImporters(*r);
    return r;
  }();
  return *registry;
}

void ImporterRegistry::Add(std::string_view domain, std::string_view op_type, ImporterFn fn,
                           int64_t since_opset) {
  table_[{std::string(CanonicalDomain(domain)), std::string(op_type)}] = {fn, since_opset};
}

const ImporterEntry* ImporterRegistry::Find(std::string_view domain,
                                            std::string_view op_type) const {
  auto it = table_.find({std::string(CanonicalDomain(domain)), std::string(op_type)});
  return it == table_.end() ? nullptr : &it->second;
}

std::vector<std::string> ImporterRegistry::DefaultDomainOps() const {
  std::vector<std::string> out;
  for (const auto& [key, entry] : table_) {
    if (key.first.empty()) out.push_back(key.second);
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> TensorToInts(const ir::Tensor& t, std::string_view role,
                                                  const ImportContext& ctx) {
  if (t.dtype() != ir::DType::kI64 && t.dtype() != ir::DType::kI32) {
    return ctx.Error() << role << " must be an integer tensor; got " << t.DebugString(4);
  }
  if (t.rank() > 1) return ctx.Error() << role << " must be 1-D; got " << t.DebugString(4);
  return t.ToInt64Vector();
}

const ir::Value& InferredValue(ImportContext& ctx, ir::ValueId v) {
  if (!ctx.graph().value(v).shape_known) ir::InferShapes(ctx.graph()).IgnoreError();  // unknown stays unknown
  return ctx.graph().value(v);
}

absl::StatusOr<std::optional<std::vector<int64_t>>> AttrOrConstantInputInts(
    const ImportContext& ctx, std::string_view name, int input_index) {
  ASSIGN_OR_RETURN(std::optional<std::vector<int64_t>> from_attr,
                   ctx.attrs().GetOptional<std::vector<int64_t>>(name));
  ASSIGN_OR_RETURN(const ir::Tensor* from_input, ctx.ConstantInput(input_index, name));
  if (from_attr && from_input) {
    return ctx.Error() << "gives " << name << " both as an attribute and as input " << input_index;
  }
  if (from_input) {
    ASSIGN_OR_RETURN(std::vector<int64_t> v, TensorToInts(*from_input, name, ctx));
    return std::optional<std::vector<int64_t>>(std::move(v));
  }
  return from_attr;
}

}  // namespace onnxpipe::onnx_frontend
