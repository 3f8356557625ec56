// The model loader: parse, summarise, validate, import node by node, sort, verify.
//
// Order of the phases (each failure names the file):
//  1. parse the protobuf; a model needs a graph and an ai.onnx opset in [13, 23];
//  2. summary (producer, opsets, op histogram) and unsupported ops: an error naming every
//     unsupported node, or (allow_unsupported) the summary without a graph;
//  3. structural validation on the protobuf: SSA (each name defined once), no dangling inputs,
//     graph outputs defined, declared dims sane. Done here rather than left to libonnx so that
//     opsets 18-23, which libonnx 1.12 cannot check, get the same guarantees and messages;
//  4. build the IR: graph inputs, initializers (data decoded and checked, external data
//     resolved), node output values with declared types, then the importers (Constant nodes
//     first, so constant operands are known whatever the node order);
//  5. TopoSort (reports cycles), then for opsets 13-17 libonnx's checker and shape inference,
//     whose value_info types and shapes are copied onto node outputs;
//  6. ir::Verify.
#include "frontend/onnx/loader.h"

#include <algorithm>
#include <climits>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "frontend/ir/status.h"
#include "frontend/ir/verifier.h"
#include "frontend/onnx/export_signature.h"
#include "frontend/onnx/file_io.h"
#include "frontend/onnx/importer.h"
#include "frontend/onnx/libonnx_guard.h"
#include "frontend/onnx/proto_metadata.h"
#include "frontend/onnx/tensor_proto.h"
#include "google/protobuf/unknown_field_set.h"
#include "onnx/checker.h"
#include "onnx/shape_inference/implementation.h"

// libonnx 1.12 exports this overload but does not declare it: it is check_model() with a
// caller-provided context, which is how the model's folder reaches the external-data checks
// (the declared check_model(const ModelProto&) resolves them against the working directory).
namespace onnx::checker {
void check_model(const ModelProto& model, CheckerContext& ctx);
}  // namespace onnx::checker

namespace onnxpipe::onnx_frontend {
namespace {

std::string DescribeNode(const onnx::NodeProto& n, int index) {
  std::string who =
      n.name().empty() ? absl::StrCat("#", index) : absl::StrCat("'", n.name(), "'");
  std::string_view domain = CanonicalDomain(n.domain());
  std::string op =
      domain.empty() ? n.op_type() : absl::StrCat(std::string(domain), "::", n.op_type());
  return absl::StrCat("node ", who, " (", op, ")");
}

// Where a value name is defined, for duplicate-definition messages.
struct DefSite {
  enum Kind { kInput, kInitializer, kNode } kind;
  int index;
};

class ModelImporter {
 public:
  ModelImporter(onnx::ModelProto& model, std::string file, std::string base_dir,
                const LoadOptions& options)
      : model_(model), file_(std::move(file)), base_dir_(std::move(base_dir)), options_(options) {}

  absl::StatusOr<LoadedModel> Run() {
    RETURN_IF_ERROR(CheckModelHeader());
    RETURN_IF_ERROR(SpecializeInputs());
    Summarise();
    if (!result_.summary.unsupported.empty()) {
      RETURN_IF_ERROR(ReportUnsupported());
      return std::move(result_);
    }
    checked_ = opset_ <= kMaxCheckedOpset && model_.ir_version() <= kMaxCheckedIrVersion;
    if (!checked_) {
      const std::string why =
          opset_ > kMaxCheckedOpset
              ? absl::StrCat("ai.onnx opset ", opset_, " is newer than libonnx 1.12 knows (<= ",
                             kMaxCheckedOpset, ")")
              : absl::StrCat("IR version ", model_.ir_version(),
                             " is newer than libonnx 1.12 knows (<= ", kMaxCheckedIrVersion, ")");
      result_.warnings.push_back(absl::StrCat(
          file_, ": ", why,
          ": its checker and shape inference were skipped; onnxpipe validated the graph "
          "structure itself, and shapes of intermediate values come from onnxpipe's own shape "
          "inference for these ops"));
    }
    RETURN_IF_ERROR(ValidateStructure());
    // libonnx needs the protobuf's initializer data; when it runs first, the importer can move
    // the data into the IR and drop the protobuf's copy, halving peak memory on big models.
    // It only can when the nodes are in topological order (libonnx refuses anything else):
    // otherwise TopoSort first reports a cycle or gives the order to check the model in.
    if (model_.functions_size() > 0) {
      // No node is imported through a model-local function (calls to them are unsupported
      // ops, refused above); drop them so that libonnx does not check unused code.
      result_.warnings.push_back(absl::StrCat(file_, ": ", model_.functions_size(),
                                              " unused model-local function(s) ignored"));
      model_.clear_functions();
    }
    if (model_.training_info_size() > 0) {
      result_.warnings.push_back(absl::StrCat(file_, ": training_info ignored"));
      model_.clear_training_info();
    }
    if (checked_ && in_order_) RETURN_IF_ERROR(CheckAndInferWithLibonnx());
    RETURN_IF_ERROR(BuildGraph(/*release_proto_data=*/!checked_ || in_order_));
    RETURN_IF_ERROR(InFile(graph_.TopoSort()));
    if (checked_ && !in_order_) {
      SortProtoNodes();
      RETURN_IF_ERROR(CheckAndInferWithLibonnx());
      RETURN_IF_ERROR(ApplyInferredTypes());
    }
    RETURN_IF_ERROR(InFile(ir::Verify(graph_)));
    result_.graph = std::move(graph_);
    return std::move(result_);
  }

 private:
  absl::Status InFile(const absl::Status& s) const { return Annotate(s, file_); }
  // LoadOptions::constant_inputs: the named graph inputs become initializers holding the values.
  absl::Status SpecializeInputs() {
    onnx::GraphProto* g = model_.mutable_graph();
    for (const auto& entry : options_.constant_inputs) {
      // Not a structured binding: clang 14 cannot capture one in the lambda below.
      const std::string& name = entry.first;
      const ir::Tensor& t = entry.second;
      auto* inputs = g->mutable_input();
      auto it = std::find_if(inputs->begin(), inputs->end(),
                             [&](const onnx::ValueInfoProto& v) { return v.name() == name; });
      if (it == inputs->end()) return Error() << "'" << name << "' is not a graph input";
      inputs->erase(it);
      onnx::TensorProto* init = g->add_initializer();
      init->set_name(name);
      init->set_data_type(OnnxFromDType(t.dtype()));
      for (int64_t d : t.dims()) init->add_dims(d);
      init->set_raw_data(std::string(static_cast<const char*>(t.raw()), t.num_bytes()));
    }
    return absl::OkStatus();
  }

  StatusBuilder Error() const {
    StatusBuilder b(absl::StatusCode::kInvalidArgument, __FILE__, __LINE__);
    b << file_ << ": ";
    return b;
  }

  // Phase 1: a model has a graph and an ai.onnx opset in range.
  absl::Status CheckModelHeader() {
    if (!model_.has_graph()) {
      return Error() << "not an ONNX model: the protobuf has no graph (is it a tensor or "
                        "another protobuf message?)";
    }
    ModelSummary& s = result_.summary;
    s.producer_name = model_.producer_name();
    s.producer_version = model_.producer_version();
    s.ir_version = model_.ir_version();
    for (const auto& imp : model_.opset_import()) {
      s.opset_imports[std::string(CanonicalDomain(imp.domain()))] = imp.version();
    }
    auto it = s.opset_imports.find("");
    if (it == s.opset_imports.end()) {
      return Error() << "the model imports no ai.onnx opset; onnxpipe supports opsets "
                     << kMinOpset << " to " << kMaxOpset;
    }
    opset_ = it->second;
    if (opset_ < kMinOpset || opset_ > kMaxOpset) {
      return Error() << "the model uses ai.onnx opset " << opset_
                     << "; onnxpipe supports opsets " << kMinOpset << " to " << kMaxOpset
                     << (opset_ < kMinOpset ? " (re-export with opset_version >= 13)" : "");
    }
    return absl::OkStatus();
  }

  int64_t OpsetOf(const std::string& domain) const {
    auto it = result_.summary.opset_imports.find(std::string(CanonicalDomain(domain)));
    return it == result_.summary.opset_imports.end() ? 0 : it->second;
  }

  // Phase 2: histogram and unsupported ops.
  void Summarise() {
    const ImporterRegistry& registry = ImporterRegistry::Get();
    ModelSummary& s = result_.summary;
    const auto& nodes = model_.graph().node();
    s.num_nodes = nodes.size();
    for (int i = 0; i < nodes.size(); ++i) {
      const onnx::NodeProto& n = nodes[i];
      ++s.op_histogram[n.op_type()];
      const ImporterEntry* e = registry.Find(n.domain(), n.op_type());
      if (e != nullptr && OpsetOf(n.domain()) >= e->since_opset) continue;
      s.unsupported.push_back({n.name(), n.op_type(), n.domain()});
      std::string note = DescribeNode(n, i);
      if (e != nullptr) {
        absl::StrAppend(&note, " exists from opset ", e->since_opset, ", the model uses ",
                        OpsetOf(n.domain()));
      } else if (!CanonicalDomain(n.domain()).empty()) {
        absl::StrAppend(&note, " is in domain '", n.domain(), "', which onnxpipe does not import");
      }
      unsupported_notes_.push_back(std::move(note));
    }
  }

  absl::Status ReportUnsupported() {
    const size_t n = unsupported_notes_.size();
    const size_t shown = std::min<size_t>(n, 20);
    std::string list = absl::StrJoin(unsupported_notes_.begin(),
                                     unsupported_notes_.begin() + shown, "; ");
    if (shown < n) absl::StrAppend(&list, "; and ", n - shown, " more");
    if (options_.allow_unsupported) {
      result_.warnings.push_back(
          absl::StrCat(file_, ": ", n, " node(s) with unsupported ops, no graph built: ", list));
      return absl::OkStatus();
    }
    return Error() << n << " node(s) with unsupported ops: " << list
                   << ". Supported ai.onnx ops: "
                   << absl::StrJoin(ImporterRegistry::Get().DefaultDomainOps(), ", ");
  }

  // Phase 3: SSA, dangling names, graph outputs.
  absl::Status ValidateStructure() {
    const onnx::GraphProto& g = model_.graph();
    if (g.sparse_initializer_size() > 0) {
      return Error() << "sparse initializers are not supported ('"
                     << g.sparse_initializer(0).values().name() << "')";
    }
    auto describe = [&](const DefSite& d) -> std::string {
      switch (d.kind) {
        case DefSite::kInput: return absl::StrCat("graph input #", d.index);
        case DefSite::kInitializer: return absl::StrCat("initializer #", d.index);
        case DefSite::kNode: return DescribeNode(g.node(d.index), d.index);
      }
      return "";
    };
    auto define = [&](const std::string& name, DefSite site) -> absl::Status {
      auto [it, inserted] = defs_.emplace(name, site);
      if (!inserted) {
        return Error() << "value name '" << name << "' is defined twice, by "
                       << describe(it->second) << " and by " << describe(site)
                       << " (ONNX graphs are SSA: one definition per name)";
      }
      return absl::OkStatus();
    };
    for (int i = 0; i < g.initializer_size(); ++i) {
      const std::string& name = g.initializer(i).name();
      if (name.empty()) return Error() << "initializer #" << i << " has no name";
      RETURN_IF_ERROR(define(name, {DefSite::kInitializer, i}));
      // Data size, dims and external-data paths, without reading any data yet.
      auto layout = InspectTensorProto(g.initializer(i), base_dir_);
      if (!layout.ok()) {
        return InFile(Annotate(layout.status(), absl::StrCat("initializer '", name, "'")));
      }
    }
    // Declared types: supported dtypes, no negative or absurd dims.
    for (const auto* list : {&g.input(), &g.output(), &g.value_info()}) {
      for (const onnx::ValueInfoProto& vi : *list) {
        RETURN_IF_ERROR(Declared(vi.type(), vi.name()).status());
      }
    }
    for (int i = 0; i < g.input_size(); ++i) {
      const std::string& name = g.input(i).name();
      if (name.empty()) return Error() << "graph input #" << i << " has no name";
      auto it = defs_.find(name);
      // Old exporters list initializers among the inputs too: those are initializers.
      if (it != defs_.end() && it->second.kind == DefSite::kInitializer &&
          !initializer_inputs_.count(name)) {
        initializer_inputs_.insert(name);
        continue;
      }
      RETURN_IF_ERROR(define(name, {DefSite::kInput, i}));
    }
    for (int i = 0; i < g.node_size(); ++i) {
      for (const std::string& out : g.node(i).output()) {
        if (!out.empty()) RETURN_IF_ERROR(define(out, {DefSite::kNode, i}));
      }
    }
    // Attributes: tensors must decode (external data stays inside the folder), and no imported
    // op takes a subgraph. Checked before libonnx, whose checker would follow both.
    for (int i = 0; i < g.node_size(); ++i) {
      for (const onnx::AttributeProto& a : g.node(i).attribute()) {
        const std::string where =
            absl::StrCat(DescribeNode(g.node(i), i), ": attribute '", a.name(), "'");
        if (a.has_g() || a.graphs_size() > 0) {
          return Error() << where << ": subgraphs are not supported";
        }
        if (a.has_sparse_tensor() || a.sparse_tensors_size() > 0) {
          return Error() << where << ": sparse tensors are not supported";
        }
        std::vector<const onnx::TensorProto*> tensors;
        if (a.has_t()) tensors.push_back(&a.t());
        for (const onnx::TensorProto& t : a.tensors()) tensors.push_back(&t);
        for (const onnx::TensorProto* t : tensors) {
          auto layout = InspectTensorProto(*t, base_dir_);
          if (!layout.ok()) return Error() << where << ": " << layout.status().message();
        }
      }
    }
    in_order_ = true;
    for (int i = 0; i < g.node_size(); ++i) {
      const onnx::NodeProto& n = g.node(i);
      for (int k = 0; k < n.input_size(); ++k) {
        const std::string& in = n.input(k);
        if (in.empty()) continue;
        auto it = defs_.find(in);
        if (it == defs_.end()) {
          return Error() << DescribeNode(n, i) << ": input " << k << " '" << in
                         << "' is not defined by any graph input, initializer or node output "
                            "(dangling input)";
        }
        if (it->second.kind == DefSite::kNode && it->second.index >= i) in_order_ = false;
      }
    }
    for (int i = 0; i < g.output_size(); ++i) {
      const std::string& name = g.output(i).name();
      if (name.empty()) return Error() << "graph output #" << i << " has no name";
      if (!defs_.count(name)) {
        return Error() << "graph output '" << name
                       << "' is not produced by any node, graph input or initializer";
      }
    }
    return absl::OkStatus();
  }

  // Declared type of a value; errors name the file and value.
  absl::StatusOr<DeclaredType> Declared(const onnx::TypeProto& type, const std::string& name) {
    auto t = DeclaredTypeFromProto(type, name);
    if (!t.ok()) return InFile(t.status());
    return t;
  }

  // Phase 4: values and nodes.
  absl::Status BuildGraph(bool release_proto_data) {
    onnx::GraphProto& g = *model_.mutable_graph();
    graph_.name = g.name();
    graph_.producer_name = model_.producer_name();
    graph_.producer_version = model_.producer_version();
    graph_.opset = opset_;
    graph_.ir_version = model_.ir_version();
    graph_.source_path = file_;

    for (const onnx::ValueInfoProto& in : g.input()) {
      if (initializer_inputs_.count(in.name())) continue;
      ASSIGN_OR_RETURN(DeclaredType t, Declared(in.type(), in.name()));
      if (!t.has_dtype) {
        return Error() << "graph input '" << in.name() << "' has no tensor element type";
      }
      graph_.inputs().push_back(graph_.AddValue(in.name(), t.dtype, t.shape, t.has_shape));
    }
    for (onnx::TensorProto& init : *g.mutable_initializer()) {
      std::string external;
      auto t = TensorFromProto(init, base_dir_, &external);
      if (!t.ok()) return InFile(Annotate(t.status(), absl::StrCat("initializer '", init.name(), "'")));
      ir::ValueId id = graph_.AddConstant(init.name(), std::move(*t), /*is_initializer=*/true);
      graph_.value(id).external_file = external;
      if (release_proto_data) {
        init.clear_raw_data();
        init.clear_float_data();
      }
    }
    // torch's dynamo exporter records which initializers are parameters and which buffers.
    if (const std::string sig = MetadataProp(g, kGraphMetadataField, kTorchExportSignatureKey); !sig.empty()) {
      if (ApplyTorchExportSignature(sig, &graph_)) {
        // LoadOptions::constant_inputs are graph inputs bound by the caller, not exporter-made.
        for (const auto& entry : options_.constant_inputs) {
          const ir::ValueId id = graph_.FindValue(entry.first);
          if (id != ir::kNoValue) graph_.value(id).exported_as = ir::ExportedAs::kUnrecorded;
        }
      }
    }
    // Types the file declares for intermediate values and outputs.
    std::unordered_map<std::string, const onnx::TypeProto*> declared;
    for (const auto& vi : g.value_info()) declared[vi.name()] = &vi.type();
    for (const auto& vi : g.output()) declared[vi.name()] = &vi.type();
    for (const onnx::NodeProto& n : g.node()) {
      for (const std::string& out : n.output()) {
        if (out.empty()) continue;
        ir::ValueId id = graph_.AddValue(out, ir::DType::kF32, {}, /*shape_known=*/false);
        auto it = declared.find(out);
        if (it != declared.end()) RETURN_IF_ERROR(ApplyDeclared(*it->second, id));
      }
    }

    // Constant nodes first: their values are operands that importers read (axes, ratio).
    const ImporterRegistry& registry = ImporterRegistry::Get();
    for (int pass = 0; pass < 2; ++pass) {
      for (int i = 0; i < g.node_size(); ++i) {
        const onnx::NodeProto& n = g.node(i);
        const bool is_constant = n.op_type() == "Constant" && CanonicalDomain(n.domain()).empty();
        if (is_constant != (pass == 0)) continue;
        const ImporterEntry* e = registry.Find(n.domain(), n.op_type());
        RET_CHECK(e != nullptr) << n.op_type();
        std::vector<ir::ValueId> ins, outs;
        for (const std::string& s : n.input()) ins.push_back(s.empty() ? ir::kNoValue : graph_.FindValue(s));
        for (const std::string& s : n.output()) outs.push_back(s.empty() ? ir::kNoValue : graph_.FindValue(s));
        ImportContext ctx(graph_, n, DescribeNode(n, i), OpsetOf(n.domain()), std::move(ins),
                          std::move(outs), base_dir_, &result_.warnings);
        RETURN_IF_ERROR(InFile(e->fn(ctx)));
      }
    }
    for (const auto& out : g.output()) graph_.outputs().push_back(graph_.FindValue(out.name()));
    return absl::OkStatus();
  }

  // Copies a declared (or inferred) type onto a node output; constants keep their data's type.
  absl::Status ApplyDeclared(const onnx::TypeProto& type, ir::ValueId id) {
    ir::Value& v = graph_.value(id);
    if (v.constant) return absl::OkStatus();
    ASSIGN_OR_RETURN(DeclaredType t, Declared(type, v.name));
    if (t.has_dtype) v.dtype = t.dtype;
    if (t.has_shape) {
      v.shape = std::move(t.shape);
      v.shape_known = true;
    }
    return absl::OkStatus();
  }

  // Reorders the protobuf's nodes topologically (stable), for libonnx. Only called once the
  // IR's TopoSort has shown the graph to be acyclic.
  void SortProtoNodes() {
    onnx::GraphProto& g = *model_.mutable_graph();
    const int n = g.node_size();
    std::vector<int> pending(n, 0);
    std::vector<std::vector<int>> consumers(n);
    for (int i = 0; i < n; ++i) {
      for (const std::string& in : g.node(i).input()) {
        auto it = in.empty() ? defs_.end() : defs_.find(in);
        if (it == defs_.end() || it->second.kind != DefSite::kNode) continue;
        ++pending[i];
        consumers[it->second.index].push_back(i);
      }
    }
    std::vector<int> ready, order;
    for (int i = 0; i < n; ++i)
      if (pending[i] == 0) ready.push_back(i);
    std::make_heap(ready.begin(), ready.end(), std::greater<>());
    while (!ready.empty()) {
      std::pop_heap(ready.begin(), ready.end(), std::greater<>());
      const int id = ready.back();
      ready.pop_back();
      order.push_back(id);
      for (int c : consumers[id]) {
        if (--pending[c] == 0) {
          ready.push_back(c);
          std::push_heap(ready.begin(), ready.end(), std::greater<>());
        }
      }
    }
    if (static_cast<int>(order.size()) != n) return;  // cannot happen after TopoSort
    google::protobuf::RepeatedPtrField<onnx::NodeProto> sorted;
    for (int id : order) sorted.Add()->Swap(g.mutable_node(id));
    g.mutable_node()->Swap(&sorted);
  }

  // After a late libonnx run: inferred value_info types onto node outputs.
  absl::Status ApplyInferredTypes() {
    const onnx::GraphProto& g = model_.graph();
    for (const auto* list : {&g.value_info(), &g.output()}) {
      for (const onnx::ValueInfoProto& vi : *list) {
        ir::ValueId id = graph_.FindValue(vi.name());
        if (id == ir::kNoValue || graph_.value(id).producer == ir::kNoNode) continue;
        RETURN_IF_ERROR(ApplyDeclared(vi.type(), id));
      }
    }
    return absl::OkStatus();
  }

  // Phase 5 (opsets 13-17): libonnx's checker and shape inference. Inference adds value_info.
  absl::Status CheckAndInferWithLibonnx() {
    onnx::checker::CheckerContext ctx;
    if (!base_dir_.empty()) ctx.set_model_dir(base_dir_ + "/");
    try {
      onnx::checker::check_model(model_, ctx);
    } catch (const std::exception& e) {
      return Error() << "libonnx checker: " << e.what();
    }
    GuardLibonnxInference();
    try {
      onnx::shape_inference::InferShapes(
          model_, onnx::OpSchemaRegistry::Instance(),
          onnx::ShapeInferenceOptions(/*check_type_val=*/true, /*strict_mode_val=*/1));
    } catch (const std::exception& e) {
      return Error() << "libonnx shape inference: " << e.what();
    }
    return absl::OkStatus();
  }

  onnx::ModelProto& model_;
  const std::string file_;
  const std::string base_dir_;
  const LoadOptions options_;
  LoadedModel result_;
  ir::Graph graph_;
  int64_t opset_ = 0;
  bool checked_ = false;
  bool in_order_ = true;  // every node's inputs are defined before it
  std::vector<std::string> unsupported_notes_;
  std::unordered_map<std::string, DefSite> defs_;
  std::unordered_set<std::string> initializer_inputs_;
};

}  // namespace

absl::StatusOr<LoadedModel> LoadOnnxModelFromBytes(std::string_view bytes,
                                                   const std::string& display_name,
                                                   const std::string& base_dir,
                                                   const LoadOptions& options) {
  if (bytes.size() > static_cast<size_t>(INT_MAX)) {
    return INVALID_ARGUMENT() << display_name << ": over protobuf's 2 GiB limit";
  }
  onnx::ModelProto model;
  if (!model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return INVALID_ARGUMENT() << display_name
                              << ": not a valid ONNX model protobuf (truncated or corrupt file, "
                                 "or not ONNX at all)";
  }
  ModelImporter importer(model, display_name, base_dir, options);
  return importer.Run();
}

absl::StatusOr<LoadedModel> LoadOnnxModel(const std::string& path, const LoadOptions& options) {
  onnx::ModelProto model;
  RETURN_IF_ERROR(ParseProtoFile(path, model, "ONNX model"));
  ModelImporter importer(model, path, FolderOf(path), options);
  return importer.Run();
}

absl::StatusOr<ir::Tensor> LoadTensorProtoFile(const std::string& path) {
  onnx::TensorProto t;
  RETURN_IF_ERROR(ParseProtoFile(path, t, "ONNX TensorProto"));
  auto tensor = TensorFromProto(t, FolderOf(path));
  if (!tensor.ok()) return Annotate(tensor.status(), path);
  return tensor;
}

absl::StatusOr<std::vector<std::string>> ReadGraphInputNames(const std::string& path) {
  onnx::ModelProto model;
  RETURN_IF_ERROR(ParseProtoFile(path, model, "ONNX model"));
  std::unordered_set<std::string> initializers;
  for (const onnx::TensorProto& t : model.graph().initializer()) initializers.insert(t.name());
  std::vector<std::string> names;
  for (const onnx::ValueInfoProto& v : model.graph().input())
    if (!initializers.count(v.name())) names.push_back(v.name());
  return names;
}

std::vector<std::string> SupportedOnnxOps() { return ImporterRegistry::Get().DefaultDomainOps(); }

}  // namespace onnxpipe::onnx_frontend
