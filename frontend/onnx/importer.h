// Internal to frontend/onnx: the per-op importer framework.
//
// One function per ONNX op, `ONNX_IMPORTER(Add) { ... }`, registered in a table by
// `REGISTER_ONNX_IMPORTER(registry, Add)` inside the op family's Register*Importers function.
// The dispatcher (loader.cc) resolves the node's input and output names to IR values (an empty
// name is an absent optional input, ir::kNoValue), then calls the importer with an
// ImportContext. Importers normalise ONNX's opset differences to the IR conventions written in
// frontend/ir/op.h and emit IR nodes that keep the ONNX node's name and output values.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/ir/status.h"
#include "onnx/onnx_pb.h"

namespace onnxpipe::onnx_frontend {

// Typed, type-checked reads of a node's attributes: attrs.Get<float>("epsilon", 1e-5f).
// A present attribute of the wrong ONNX type is an error naming the node and attribute.
// Supported T: int64_t, float, double, std::string, std::vector<int64_t>,
// std::vector<double>, ir::Tensor.
class AttrReader {
 public:
  AttrReader(const onnx::NodeProto& node, std::string node_desc, std::string base_dir)
      : node_(node), node_desc_(std::move(node_desc)), base_dir_(std::move(base_dir)) {}

  bool Has(std::string_view name) const { return Find(name) != nullptr; }
  // The attribute, or `def` when absent.
  template <typename T>
  absl::StatusOr<T> Get(std::string_view name, T def) const {
    const onnx::AttributeProto* a = Find(name);
    if (a == nullptr) return def;
    return Read<T>(*a);
  }
  // The attribute, or nullopt when absent.
  template <typename T>
  absl::StatusOr<std::optional<T>> GetOptional(std::string_view name) const {
    const onnx::AttributeProto* a = Find(name);
    if (a == nullptr) return std::optional<T>();
    ASSIGN_OR_RETURN(T v, Read<T>(*a));
    return std::optional<T>(std::move(v));
  }
  // The attribute; an error naming it when absent.
  template <typename T>
  absl::StatusOr<T> Required(std::string_view name) const {
    const onnx::AttributeProto* a = Find(name);
    if (a == nullptr) {
      return INVALID_ARGUMENT() << node_desc_ << ": missing required attribute '" << name << "'";
    }
    return Read<T>(*a);
  }

 private:
  const onnx::AttributeProto* Find(std::string_view name) const;
  template <typename T>
  absl::StatusOr<T> Read(const onnx::AttributeProto& a) const;
  absl::Status WrongType(const onnx::AttributeProto& a, const char* expected) const;

  const onnx::NodeProto& node_;
  std::string node_desc_;
  std::string base_dir_;  // for tensor attributes with external data
};

template <> absl::StatusOr<int64_t> AttrReader::Read(const onnx::AttributeProto& a) const;
template <> absl::StatusOr<float> AttrReader::Read(const onnx::AttributeProto& a) const;
template <> absl::StatusOr<double> AttrReader::Read(const onnx::AttributeProto& a) const;
template <> absl::StatusOr<std::string> AttrReader::Read(const onnx::AttributeProto& a) const;
template <>
absl::StatusOr<std::vector<int64_t>> AttrReader::Read(const onnx::AttributeProto& a) const;
template <>
absl::StatusOr<std::vector<double>> AttrReader::Read(const onnx::AttributeProto& a) const;
template <> absl::StatusOr<ir::Tensor> AttrReader::Read(const onnx::AttributeProto& a) const;

// What an importer sees of one ONNX node.
class ImportContext {
 public:
  ImportContext(ir::Graph& graph, const onnx::NodeProto& node, std::string node_desc,
                int64_t opset, std::vector<ir::ValueId> inputs, std::vector<ir::ValueId> outputs,
                const std::string& base_dir, std::vector<std::string>* warnings);

  const onnx::NodeProto& node() const { return node_; }
  const std::string& op_type() const { return node_.op_type(); }
  // Opset version of the node's domain (the ai.onnx opset for standard ops).
  int64_t opset() const { return opset_; }
  ir::Graph& graph() { return graph_; }
  // "node 'name' (OpType)", for messages.
  const std::string& describe() const { return desc_; }

  // Inputs, with trailing absent ones dropped.
  int num_inputs() const { return static_cast<int>(inputs_.size()); }
  ir::ValueId input(int i) const { return i < num_inputs() ? inputs_[i] : ir::kNoValue; }
  bool has_input(int i) const { return input(i) != ir::kNoValue; }
  absl::StatusOr<ir::ValueId> RequiredInput(int i) const;
  // Constant data of optional input i (nullptr when absent). `role` names the operand in the
  // error raised when the input is not a constant ("axes", "ratio").
  absl::StatusOr<const ir::Tensor*> ConstantInput(int i, std::string_view role) const;
  // Fails unless the node has between min and max inputs (after dropping trailing absent ones).
  absl::Status CheckNumInputs(int min, int max) const;

  // Outputs, with trailing absent ones dropped.
  int num_outputs() const { return static_cast<int>(outputs_.size()); }
  const std::vector<ir::ValueId>& outputs() const { return outputs_; }
  // For ops whose output count carries meaning (Split): all the node's outputs, absent ones
  // (empty names) replaced by fresh unnamed values.
  void MaterializeAllOutputs();

  const AttrReader& attrs() const { return attrs_; }

  // Adds the IR node carrying this node's name and all its outputs.
  absl::Status Emit(ir::OpKind op, std::vector<ir::ValueId> inputs, ir::Attrs attrs = {});
  // Adds a helper node of a lowering (Einsum, variadic Min/Max) with one fresh output of unknown
  // type (shape inference fills it in), named after this node; returns that output.
  ir::ValueId EmitHelper(ir::OpKind op, std::vector<ir::ValueId> inputs, ir::Attrs attrs = {});
  // A constant value named after this node.
  ir::ValueId HelperConstant(ir::Tensor t);
  // Makes output 0 a constant holding `t` (Constant nodes become values, not nodes).
  absl::Status DefineConstant(ir::Tensor t);

  // InvalidArgument prefixed with the node description.
  StatusBuilder Error() const;
  void Warn(const std::string& message);

 private:
  ir::Graph& graph_;
  const onnx::NodeProto& node_;
  std::string desc_;
  int64_t opset_;
  std::vector<ir::ValueId> inputs_, outputs_;
  AttrReader attrs_;
  std::vector<std::string>* warnings_;
  int helpers_ = 0;
  // The name of the IR nodes made for this one: the ONNX name, behind the module scope that torch's
  // dynamo exporter records in the node's name_scopes metadata (proto_metadata.h) when it does, so
  // that the nodes and everything fused from them carry their layer ("/m/model/layers.0/self_attn/
  // node_linear_3") as TorchScript exports' names do.
  std::string name_;
};

using ImporterFn = absl::Status (*)(ImportContext& ctx);

struct ImporterEntry {
  ImporterFn fn = nullptr;
  int64_t since_opset = 0;  // first opset of the domain defining the op (0: any)
};

class ImporterRegistry {
 public:
  // All importers of all op families.
  static const ImporterRegistry& Get();

  // `domain` "" and "ai.onnx" are the same domain.
  void Add(std::string_view domain, std::string_view op_type, ImporterFn fn,
           int64_t since_opset = 0);
  const ImporterEntry* Find(std::string_view domain, std::string_view op_type) const;
  // Supported op types of the default domain, sorted (for messages and tests).
  std::vector<std::string> DefaultDomainOps() const;

 private:
  std::map<std::pair<std::string, std::string>, ImporterEntry> table_;
};

// "ai.onnx" -> "", everything else unchanged.
std::string_view CanonicalDomain(std::string_view domain);

#define ONNX_IMPORTER(op) absl::Status Import##op(::onnxpipe::onnx_frontend::ImportContext& ctx)
#define REGISTER_ONNX_IMPORTER(registry, op) (registry).Add("", #op, &Import##op)
#define REGISTER_ONNX_IMPORTER_SINCE(registry, op, since) (registry).Add("", #op, &Import##op, since)
#define REGISTER_ONNX_IMPORTER_IN_DOMAIN(registry, domain, op) \
  (registry).Add(domain, #op, &Import##op)

// One per op family file.
void RegisterElementwiseImporters(ImporterRegistry& r);  // import_elementwise.cc
void RegisterActivationImporters(ImporterRegistry& r);   // import_activation.cc
void RegisterShapeImporters(ImporterRegistry& r);        // import_shape.cc
void RegisterReduceImporters(ImporterRegistry& r);       // import_reduce.cc: reductions, norms, softmax, loss
void RegisterMiscImporters(ImporterRegistry& r);    // import_misc.cc: matmul, gather, constants, casts
void RegisterAttentionImporters(ImporterRegistry& r);  // import_attention.cc: Attention, RotaryEmbedding (opset 23)
void RegisterEinsumImporter(ImporterRegistry& r);   // import_einsum.cc: Einsum lowered to IR ops
void RegisterConvImporter(ImporterRegistry& r);     // import_conv.cc: patch-embedding Conv as a MatMul
void RegisterIndexImporters(ImporterRegistry& r);   // import_index.cc: GatherElements/ND, CumSum, mask predicates

// Shared helpers for importers.
// The int list operand that ONNX moved from attribute `name` to input `input_index` across
// opsets (Reduce* axes, Squeeze/Unsqueeze axes, Split sizes): whichever form the node uses (both
// is an error), nullopt when neither is present. The input form must be a constant.
absl::StatusOr<std::optional<std::vector<int64_t>>> AttrOrConstantInputInts(
    const ImportContext& ctx, std::string_view name, int input_index);
// v's value, with the shapes and dtypes of the graph imported so far inferred first when v's shape is not known
// yet (an importer that needs a rank, a dim or a dtype its inputs do not declare).
const ir::Value& InferredValue(ImportContext& ctx, ir::ValueId v);
// Reads a 1-D (or scalar) integer constant as int64 values.
absl::StatusOr<std::vector<int64_t>> TensorToInts(const ir::Tensor& t, std::string_view role,
                                                  const ImportContext& ctx);

}  // namespace onnxpipe::onnx_frontend
