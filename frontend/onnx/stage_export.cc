// Stage export: IR forward graph -> ONNX opset 17. Fused ops are expanded into the standard ops
// their importers and fusion passes recognise, so a stage file re-imports into the same fused
// graph. The model is checked by libonnx (checker + strict shape inference) before the file is
// committed: a stage that would not load elsewhere is an error here, naming the node.
#include "frontend/onnx/stage_export.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <numbers>
#include <optional>
#include <set>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "frontend/ir/attention_views.h"
#include "frontend/ir/gated_activation.h"
#include "frontend/ir/precision.h"
#include "frontend/ir/status.h"
#include "frontend/onnx/file_io.h"
#include "frontend/onnx/libonnx_guard.h"
#include "frontend/onnx/tensor_proto.h"
#include "onnx/checker.h"
#include "onnx/defs/schema.h"
#include "onnx/onnx_pb.h"
#include "onnx/shape_inference/implementation.h"

namespace onnx::checker {
void check_model(const ModelProto& model, CheckerContext& ctx);
}  // namespace onnx::checker

namespace onnxpipe::onnx_frontend {
namespace {

constexpr int64_t kOpset = 17;
constexpr int64_t kIrVersion = 8;

void SetTensorData(onnx::TensorProto* t, const std::string& name, const ir::Tensor& value) {
  t->set_name(name);
  t->set_data_type(OnnxFromDType(value.dtype()));
  for (int64_t d : value.dims()) t->add_dims(d);
  t->set_raw_data(value.raw(), static_cast<size_t>(value.num_bytes()));
}

ir::Tensor Scalar(ir::DType dtype, double x) {
  ir::Tensor t(dtype, {});
  switch (dtype) {
    case ir::DType::kF64:
      t.mutable_data<double>()[0] = x;
      break;
    case ir::DType::kBF16:
      t.mutable_data<uint16_t>()[0] = ir::FloatToBF16(static_cast<float>(x));
      break;
    case ir::DType::kF16:
      t.mutable_data<uint16_t>()[0] = ir::FloatToF16(static_cast<float>(x));
      break;
    default:
      t.mutable_data<float>()[0] = static_cast<float>(x);
      break;
  }
  return t;
}

class Exporter {
 public:
  Exporter(const ir::Graph& g, const StageExportOptions& options) : g_(g), options_(options) {
    for (ir::ValueId v = 0; v < g.num_values(); ++v) used_names_.insert(g.value(v).name);
    graph_ = model_.mutable_graph();
  }

  absl::Status Build() {
    model_.set_ir_version(kIrVersion);
    model_.set_producer_name("onnxpipe");
    model_.set_producer_version("partition");
    auto* opset = model_.add_opset_import();
    opset->set_domain("");
    opset->set_version(kOpset);
    graph_->set_name(options_.graph_name);
    if (!options_.doc.empty()) graph_->set_doc_string(options_.doc);
    for (ir::ValueId v : g_.inputs()) RETURN_IF_ERROR(ValueInfo(graph_->add_input(), v));
    for (ir::NodeId id : g_.LiveNodes()) RETURN_IF_ERROR(Node(g_.node(id)));
    for (ir::ValueId v : g_.outputs()) RETURN_IF_ERROR(ValueInfo(graph_->add_output(), v));
    return absl::OkStatus();
  }

  onnx::ModelProto& model() { return model_; }
  // Initializers (IR constants) in first-use order.
  const std::vector<ir::ValueId>& constants() const { return constants_; }
  std::vector<std::pair<std::string, ir::Tensor>>& extra_constants() { return extra_; }

 private:
  absl::Status ValueInfo(onnx::ValueInfoProto* vi, ir::ValueId v) {
    const ir::Value& val = g_.value(v);
    vi->set_name(val.name);
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(OnnxFromDType(val.dtype));
    auto* shape = tt->mutable_shape();
    for (const ir::Dim& d : val.shape) {
      if (d.is_concrete()) {
        shape->add_dim()->set_dim_value(d.value());
      } else {
        shape->add_dim()->set_dim_param(d.ToString());
      }
    }
    return absl::OkStatus();
  }

  std::string Fresh(const std::string& base) {
    std::string name = base;
    for (int i = 1; used_names_.count(name); ++i) name = absl::StrCat(base, "_", i);
    used_names_.insert(name);
    return name;
  }

  // A value read by a node: constants become initializers the first time.
  std::string In(ir::ValueId v) {
    if (v == ir::kNoValue) return "";
    const ir::Value& val = g_.value(v);
    if (val.constant && seen_constants_.insert(v).second) constants_.push_back(v);
    return val.name;
  }
  std::string Out(ir::ValueId v) { return v == ir::kNoValue ? "" : g_.value(v).name; }

  // op.h's KeepBits from a Dropout's bool mask of rank `rank`: each run of 8 along the last dim (reshaped to
  // (..., D / 8, 8)) weighted by 1, 2, ..., 128 and summed (in int32: ReduceSum takes no uint8), cast to uint8.
  void PackBits(const std::string& mask, const std::string& bits, const std::string& base, size_t rank) {
    const std::string wide = Fresh(base + "/mask_i32"), runs = Fresh(base + "/mask_runs"),
                      weighted = Fresh(base + "/mask_weighted"), sum = Fresh(base + "/keep_bits_i32");
    SetInt(Emit("Cast", base + "/mask_Cast", {mask}, {wide}), "to", onnx::TensorProto::INT32);
    std::vector<int64_t> shape(rank - 1, 0);  // 0: the input's dim
    shape.push_back(-1);
    shape.push_back(8);
    Emit("Reshape", base + "/mask_Reshape", {wide, IntsConst(base + "/runs_of_8", shape)}, {runs});
    std::vector<int32_t> weights;
    for (int k = 0; k < 8; ++k) weights.push_back(1 << k);
    Emit("Mul", base + "/mask_Mul", {runs, Const(base + "/bit_weights", ir::Tensor::FromVector<int32_t>({8}, weights))},
         {weighted});
    SetInt(Emit("ReduceSum", base + "/mask_ReduceSum", {weighted, IntsConst(base + "/last", {-1})}, {sum}), "keepdims", 0);
    SetInt(Emit("Cast", base + "/keep_bits_Cast", {sum}, {bits}), "to", onnx::TensorProto::UINT8);
  }

  std::string Const(const std::string& hint, ir::Tensor t) {
    const std::string name = Fresh(hint);
    extra_.emplace_back(name, std::move(t));
    return name;
  }
  std::string IntsConst(const std::string& hint, const std::vector<int64_t>& values) {
    return Const(hint, ir::Tensor::FromVector<int64_t>({static_cast<int64_t>(values.size())}, values));
  }

  onnx::NodeProto* Emit(const std::string& op, const std::string& name, std::vector<std::string> inputs,
                        std::vector<std::string> outputs) {
    while (!inputs.empty() && inputs.back().empty()) inputs.pop_back();
    while (!outputs.empty() && outputs.back().empty()) outputs.pop_back();
    onnx::NodeProto* n = graph_->add_node();
    n->set_op_type(op);
    n->set_name(name);
    for (const std::string& i : inputs) n->add_input(i);
    for (const std::string& o : outputs) n->add_output(o);
    return n;
  }

  static void SetInt(onnx::NodeProto* n, const char* name, int64_t v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  static void SetFloat(onnx::NodeProto* n, const char* name, double v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(static_cast<float>(v));
  }
  static void SetInts(onnx::NodeProto* n, const char* name, const std::vector<int64_t>& v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t x : v) a->add_ints(x);
  }

  // Copies the IR attributes the op's opset-17 schema declares, in the schema's types.
  absl::Status CopyAttrs(const ir::Node& n, onnx::NodeProto* out, const std::set<std::string>& skip = {}) {
    const onnx::OpSchema* schema = onnx::OpSchemaRegistry::Schema(out->op_type(), static_cast<int>(kOpset), "");
    if (!schema) return INVALID_ARGUMENT() << "node '" << n.name << "': no ONNX schema for " << out->op_type();
    const auto& declared = schema->attributes();
    for (const auto& [name, value] : n.attrs.all()) {
      if (skip.count(name)) continue;
      auto it = declared.find(name);
      if (it == declared.end()) continue;  // onnxpipe-only attribute
      auto* a = out->add_attribute();
      a->set_name(name);
      const auto type = it->second.type;
      a->set_type(type);
      switch (type) {
        case onnx::AttributeProto::INT:
          if (auto* i = std::get_if<int64_t>(&value)) {
            a->set_i(*i);
          } else if (auto* d = std::get_if<double>(&value)) {
            a->set_i(static_cast<int64_t>(*d));
          } else if (auto* s = std::get_if<std::string>(&value)) {  // Cast's `to` is a dtype name here
            std::optional<ir::DType> dt = ir::ParseDType(*s);
            if (!dt) return INVALID_ARGUMENT() << "node '" << n.name << "': attribute " << name << " = '" << *s << "'";
            a->set_i(OnnxFromDType(*dt));
          }
          break;
        case onnx::AttributeProto::FLOAT:
          if (auto* d = std::get_if<double>(&value)) a->set_f(static_cast<float>(*d));
          if (auto* i = std::get_if<int64_t>(&value)) a->set_f(static_cast<float>(*i));
          break;
        case onnx::AttributeProto::STRING:
          if (auto* s = std::get_if<std::string>(&value)) a->set_s(*s);
          break;
        case onnx::AttributeProto::INTS:
          if (auto* v = std::get_if<std::vector<int64_t>>(&value))
            for (int64_t x : *v) a->add_ints(x);
          break;
        case onnx::AttributeProto::FLOATS:
          if (auto* v = std::get_if<std::vector<double>>(&value))
            for (double x : *v) a->add_floats(static_cast<float>(x));
          break;
        case onnx::AttributeProto::TENSOR:
          if (auto* t = std::get_if<ir::Tensor>(&value)) SetTensorData(a->mutable_t(), "", *t);
          break;
        default:
          return INVALID_ARGUMENT() << "node '" << n.name << "': attribute " << name << " has an unsupported type";
      }
    }
    return absl::OkStatus();
  }

  absl::Status Node(const ir::Node& n) {
    const std::string op(ir::OpName(n.op));
    std::vector<std::string> ins, outs;
    for (ir::ValueId v : n.inputs) ins.push_back(In(v));
    for (ir::ValueId v : n.outputs) outs.push_back(Out(v));
    switch (n.op) {
      case ir::OpKind::kLinear:
        return Linear(n, ins, outs);
      case ir::OpKind::kLayerNorm: {
        if (ins.size() > 3 && !ins[3].empty()) RETURN_IF_ERROR(ResidualSum(n, ins, outs));
        ins.resize(std::min<size_t>(ins.size(), 3));
        outs.resize(std::min<size_t>(outs.size(), 3));
        while (outs.size() > 1 && outs.back().empty()) outs.pop_back();
        onnx::NodeProto* p = Emit("LayerNormalization", n.name, ins, outs);
        SetInt(p, "axis", n.attrs.Get<int64_t>("axis", -1));
        SetFloat(p, "epsilon", n.attrs.Get<double>("epsilon", 1e-5));
        return absl::OkStatus();
      }
      case ir::OpKind::kRMSNorm:
        if (ins.size() > 2 && !ins[2].empty()) RETURN_IF_ERROR(ResidualSum(n, ins, outs));
        return RMSNorm(n, ins, outs);
      case ir::OpKind::kGelu: {
        const double ratio = n.attrs.Get<double>("dropout", 0.0);
        if (ratio == 0.0) {
          if (outs.size() > 1 && !outs[1].empty())
            return absl::InvalidArgumentError("node '" + n.name + "' (Gelu): keep bits without a fused dropout");
          return Gelu(n, ins[0], outs[0], n.name);
        }
        // The fused dropout becomes the Dropout it was, named by its random-stream key so that
        // the stage file, imported, draws the same mask.
        const std::string gelu = Fresh(n.name + "/gelu");
        RETURN_IF_ERROR(Gelu(n, ins[0], gelu, n.name));
        const std::string key = n.attrs.Get<std::string>("rng_key", n.name + "/Dropout");
        const bool bits = outs.size() > 1 && !outs[1].empty();
        const std::string mask = bits ? Fresh(key + "/mask") : "";
        Emit("Dropout", key,
             {gelu, Const(key + "/ratio", Scalar(ir::DType::kF32, ratio)),
              Const(key + "/training_mode", ir::Tensor::Scalar<bool>(true))},
             {outs[0], mask});
        if (bits) PackBits(mask, outs[1], n.name, g_.value(n.inputs[0]).shape.size());
        return absl::OkStatus();
      }
      case ir::OpKind::kAttention:
        return Attention(n, ins, outs[0], outs.size() > 1 && !outs[1].empty() ? &outs[1] : nullptr);
      case ir::OpKind::kRotary:
        return Rotary(n, ins, outs[0]);
      case ir::OpKind::kGatedActivation:
        return GatedActivation(n, ins, outs[0]);
      case ir::OpKind::kReduceSum:
      case ir::OpKind::kSqueeze:
      case ir::OpKind::kUnsqueeze:
      case ir::OpKind::kSplit: {
        const char* key = n.op == ir::OpKind::kSplit ? "split" : "axes";
        if (n.attrs.Has(key)) ins.push_back(IntsConst(n.name + "/" + key, n.attrs.Get<std::vector<int64_t>>(key)));
        return CopyAttrs(n, Emit(op, n.name, ins, outs), {key});
      }
      case ir::OpKind::kDropout: {
        ins.push_back(Const(n.name + "/ratio", Scalar(ir::DType::kF32, n.attrs.Get<double>("ratio", 0.5))));
        ins.push_back(Const(n.name + "/training_mode", ir::Tensor::Scalar<bool>(true)));
        return CopyAttrs(n, Emit(op, n.name, ins, outs), {"ratio"});
      }
      case ir::OpKind::kSoftmaxCrossEntropyLoss:
        if (n.attrs.Get<double>("label_smoothing", 0.0) != 0.0) {
          return INVALID_ARGUMENT() << "node '" << n.name
                                    << "': SoftmaxCrossEntropyLoss with label smoothing has no ONNX form";
        }
        return SoftmaxCrossEntropyLoss(n, std::move(ins), std::move(outs));
      default:
        break;
    }
    // The op list puts the gradient and training ops after Sum (Rotary and GatedActivation, appended
    // later, are handled above); none has a standard ONNX form.
    if (static_cast<int>(n.op) > static_cast<int>(ir::OpKind::kSum)) {
      return INVALID_ARGUMENT() << "node '" << n.name << "' (" << op
                                << ") has no ONNX form: stage files hold forward nodes only";
    }
    return CopyAttrs(n, Emit(op, n.name, ins, outs));
  }

  absl::Status Linear(const ir::Node& n, const std::vector<std::string>& ins, const std::vector<std::string>& outs) {
    const bool trans_b = n.attrs.Get<int64_t>("trans_b", 0) != 0;
    const bool has_bias = ins.size() > 2 && !ins[2].empty();
    const ir::Value& x = g_.value(n.inputs[0]);
    if (x.shape.size() == 2) {
      onnx::NodeProto* p = Emit("Gemm", n.name, {ins[0], ins[1], has_bias ? ins[2] : ""}, {outs[0]});
      if (trans_b) SetInt(p, "transB", 1);
      return absl::OkStatus();
    }
    std::string w = ins[1];
    if (trans_b) {
      const std::string wt = Fresh(n.name + "/W_T");
      SetInts(Emit("Transpose", n.name + "/transpose_W", {w}, {wt}), "perm", {1, 0});
      w = wt;
    }
    if (!has_bias) {
      Emit("MatMul", n.name, {ins[0], w}, {outs[0]});
      return absl::OkStatus();
    }
    const std::string mm = Fresh(n.name + "/matmul");
    Emit("MatMul", n.name + "/MatMul", {ins[0], w}, {mm});
    Emit("Add", n.name, {mm, ins[2]}, {outs[0]});
    return absl::OkStatus();
  }

  // x * (1 / sqrt(mean(x * x over [axis, rank)) + eps)) * scale; InvStdDev is the reciprocal.
  absl::Status RMSNorm(const ir::Node& n, const std::vector<std::string>& ins, const std::vector<std::string>& outs) {
    const ir::Value& xv = g_.value(n.inputs[0]);
    const int64_t rank = static_cast<int64_t>(xv.shape.size());
    int64_t axis = n.attrs.Get<int64_t>("axis", -1);
    if (axis < 0) axis += rank;
    if (!xv.shape_known || axis < 0 || axis >= rank) {
      return INVALID_ARGUMENT() << "node '" << n.name << "': RMSNorm axis " << n.attrs.Get<int64_t>("axis", -1)
                                << " is out of range for input " << ir::ShapeToString(xv.shape);
    }
    std::vector<int64_t> axes;
    for (int64_t a = axis; a < rank; ++a) axes.push_back(a);
    auto tmp = [&](const char* hint) { return Fresh(n.name + "/" + hint); };
    const std::string sq = tmp("square"), ms = tmp("mean_square"), v = tmp("plus_eps"), rms = tmp("rms"),
                      inv = outs.size() > 1 && !outs[1].empty() ? outs[1] : tmp("inv_rms"), xn = tmp("normalised");
    Emit("Mul", n.name + "/Mul_square", {ins[0], ins[0]}, {sq});
    onnx::NodeProto* mean = Emit("ReduceMean", n.name + "/ReduceMean", {sq}, {ms});
    SetInts(mean, "axes", axes);
    SetInt(mean, "keepdims", 1);
    Emit("Add", n.name + "/Add_eps",
         {ms, Const(n.name + "/eps", Scalar(xv.dtype, n.attrs.Get<double>("epsilon", 1e-5)))}, {v});
    Emit("Sqrt", n.name + "/Sqrt", {v}, {rms});
    Emit("Reciprocal", n.name + "/Reciprocal", {rms}, {inv});
    Emit("Mul", n.name + "/Mul_inv", {ins[0], inv}, {xn});
    Emit("Mul", n.name, {xn, ins[1]}, {outs[0]});
    return absl::OkStatus();
  }

  // The exporters' arithmetic (rotary_fusion.h), which re-imports into the same Rotary:
  // xr * cos + rot(xr) * sin on xr = x[..., :R], concatenated with x[..., R:] for a partial rotary.
  absl::Status Rotary(const ir::Node& n, const std::vector<std::string>& ins, const std::string& y) {
    const ir::Value& xv = g_.value(n.inputs[0]);
    const int64_t rank = static_cast<int64_t>(xv.shape.size());
    const int64_t r = n.attrs.Get<int64_t>("rotary_dim", -1), half = r / 2;
    if (!xv.shape_known || rank == 0 || !xv.shape.back().is_concrete() || r <= 0 || r % 2 != 0 ||
        r > xv.shape.back().value()) {
      return INVALID_ARGUMENT() << "node '" << n.name << "': Rotary rotary_dim " << r << " does not fit input "
                                << ir::ShapeToString(xv.shape);
    }
    const int64_t width = xv.shape.back().value();
    auto tmp = [&](const std::string& hint) { return Fresh(n.name + "/" + hint); };
    auto slice = [&](const std::string& hint, const std::string& in, int64_t start, int64_t end, int64_t step) {
      const std::string out = tmp(hint), base = n.name + "/" + hint;
      std::vector<std::string> args = {in, IntsConst(base + "_starts", {start}), IntsConst(base + "_ends", {end}),
                                       IntsConst(base + "_axes", {-1})};
      if (step != 1) args.push_back(IntsConst(base + "_steps", {step}));
      Emit("Slice", base + "/Slice", args, {out});
      return out;
    };
    const std::string xr = r == width ? ins[0] : slice("rotated", ins[0], 0, r, 1);
    const std::string neg = tmp("neg"), rot = tmp("rot");
    if (n.attrs.Get<int64_t>("interleaved", 0) == 0) {
      const std::string x1 = slice("x1", xr, 0, half, 1), x2 = slice("x2", xr, half, r, 1);
      Emit("Neg", n.name + "/Neg", {x2}, {neg});
      SetInt(Emit("Concat", n.name + "/Concat_rot", {neg, x1}, {rot}), "axis", -1);
    } else {
      // stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2): the flatten as Reshape to
      // (0, ..., 0, R), 0 copying the leading dims.
      const std::string odd = slice("odd", xr, 1, r, 2), even = slice("even", xr, 0, r, 2), u0 = tmp("neg_pair"),
                        u1 = tmp("even_pair"), pairs = tmp("pairs");
      Emit("Neg", n.name + "/Neg", {odd}, {neg});
      const std::string axis = IntsConst(n.name + "/pair_axis", {rank});
      Emit("Unsqueeze", n.name + "/Unsqueeze_neg", {neg, axis}, {u0});
      Emit("Unsqueeze", n.name + "/Unsqueeze_even", {even, axis}, {u1});
      SetInt(Emit("Concat", n.name + "/Concat_pairs", {u0, u1}, {pairs}), "axis", -1);
      std::vector<int64_t> dims(rank - 1, 0);
      dims.push_back(r);
      Emit("Reshape", n.name + "/Reshape_rot", {pairs, IntsConst(n.name + "/rot_shape", dims)}, {rot});
    }
    const std::string xc = tmp("x_cos"), rs = tmp("rot_sin"), yr = r == width ? y : tmp("rotated_out");
    Emit("Mul", n.name + "/Mul_cos", {xr, ins[1]}, {xc});
    Emit("Mul", n.name + "/Mul_sin", {rot, ins[2]}, {rs});
    Emit("Add", r == width ? n.name : n.name + "/Add", {xc, rs}, {yr});
    if (r == width) return absl::OkStatus();
    const std::string pass = slice("pass", ins[0], r, width, 1);
    SetInt(Emit("Concat", n.name, {yr, pass}, {y}), "axis", -1);
    return absl::OkStatus();
  }

  // act(gate) * up as the exporters write it (gated_activation_fusion.h), which re-imports into the
  // same GatedActivation: Mul(gate, Sigmoid(gate)) for silu, the Gelu's arithmetic for gelu.
  absl::Status GatedActivation(const ir::Node& n, const std::vector<std::string>& ins, const std::string& y) {
    const std::optional<ir::GatedAct> act = ir::GatedActOf(n.attrs);
    if (!act) return INVALID_ARGUMENT() << "node '" << n.name << "': GatedActivation " << n.attrs.ToString();
    const std::string activated = Fresh(n.name + "/act");
    if (*act == ir::GatedAct::kSilu) {
      const std::string s = Fresh(n.name + "/sigmoid");
      Emit("Sigmoid", n.name + "/Sigmoid", {ins[0]}, {s});
      Emit("Mul", n.name + "/Mul_silu", {ins[0], s}, {activated});
    } else {
      RETURN_IF_ERROR(Gelu(n, ins[0], activated, n.name + "/gelu"));
    }
    Emit("Mul", n.name, {activated, ins[1]}, {y});
    return absl::OkStatus();
  }

  // A LayerNorm's or RMSNorm's fused residual (op.h) as the Dropout (if any) and Add it was: ins[0]
  // becomes the sum, named as the node's Sum output when it has it.
  absl::Status ResidualSum(const ir::Node& n, std::vector<std::string>& ins, const std::vector<std::string>& outs) {
    std::string x = ins[0];
    if (const double ratio = n.attrs.Get<double>("dropout", 0.0); ratio != 0.0) {
      const std::string key = n.attrs.Get<std::string>("rng_key", n.name + "/Dropout");
      x = Fresh(key + "/output");
      Emit("Dropout", key,
           {ins[0], Const(key + "/ratio", Scalar(ir::DType::kF32, ratio)),
            Const(key + "/training_mode", ir::Tensor::Scalar<bool>(true))},
           {x});
    }
    const size_t r = static_cast<size_t>(ir::NormResidualInput(n.op));
    const std::string sum = outs.size() > r && !outs[r].empty() ? outs[r] : Fresh(n.name + "/sum");
    Emit("Add", n.name + "/residual_add", {ins[r], x}, {sum});
    ins[0] = sum;
    return absl::OkStatus();
  }

  // The GELU of x (n's input 0, approximate as n's attribute) into y, as the exporters' arithmetic;
  // the nodes are named under `base`, the last one `base`.
  absl::Status Gelu(const ir::Node& n, const std::string& x, const std::string& y, const std::string& base) {
    const ir::DType dt = g_.value(n.inputs[0]).dtype;
    auto c = [&](const char* hint, double v) { return Const(base + "/" + hint, Scalar(dt, v)); };
    auto tmp = [&](const char* hint) { return Fresh(base + "/" + hint); };
    const std::string approximate = n.attrs.Get<std::string>("approximate", "none");
    if (approximate == "tanh") {
      // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
      const std::string x2 = tmp("x2"), x3 = tmp("x3"), a = tmp("cubic"), s = tmp("inner"), sc = tmp("scaled"),
                        t = tmp("tanh"), t1 = tmp("tanh_plus_1"), hx = tmp("half_x");
      Emit("Mul", base + "/Mul_x2", {x, x}, {x2});
      Emit("Mul", base + "/Mul_x3", {x2, x}, {x3});
      Emit("Mul", base + "/Mul_c", {x3, c("c", 0.044715)}, {a});
      Emit("Add", base + "/Add_inner", {x, a}, {s});
      Emit("Mul", base + "/Mul_k", {s, c("k", std::sqrt(2.0 / std::numbers::pi))}, {sc});
      Emit("Tanh", base + "/Tanh", {sc}, {t});
      Emit("Add", base + "/Add_1", {t, c("one", 1.0)}, {t1});
      Emit("Mul", base + "/Mul_half", {x, c("half", 0.5)}, {hx});
      Emit("Mul", base, {hx, t1}, {y});
      return absl::OkStatus();
    }
    if (approximate != "none") {
      return INVALID_ARGUMENT() << "node '" << n.name << "': Gelu approximate='" << approximate << "'";
    }
    // x * 0.5 * (1 + erf(x / sqrt 2))
    const std::string d = tmp("div"), e = tmp("erf"), e1 = tmp("erf_plus_1"), m = tmp("x_times");
    Emit("Div", base + "/Div", {x, c("sqrt2", std::sqrt(2.0))}, {d});
    Emit("Erf", base + "/Erf", {d}, {e});
    Emit("Add", base + "/Add", {e, c("one", 1.0)}, {e1});
    Emit("Mul", base + "/Mul", {x, e1}, {m});
    Emit("Mul", base, {m, c("half", 0.5)}, {y});
    return absl::OkStatus();
  }

  // Value `in` (dims `buffer`) read through view `v`: Reshape to the nested form's fine dims, Slice,
  // Reshape, Transpose, Reshape (strided_view.h). Returns the read value's name.
  absl::StatusOr<std::string> ViewRead(const ir::Node& n, const std::string& in, const std::vector<int64_t>& buffer,
                                       const ir::StridedView& v, const std::string& hint) {
    const std::optional<ir::NestedForm> f = ir::ToNestedForm(v, ir::ElementCount(buffer));
    if (!f) return INVALID_ARGUMENT() << "node '" << n.name << "': its " << hint << " view does not nest";
    const std::string base = n.name + "/" + hint;
    std::vector<int64_t> ends, axes;
    for (size_t j = 0; j < f->fine.size(); ++j) {
      ends.push_back(f->starts[j] + f->lengths[j]);
      axes.push_back(static_cast<int64_t>(j));
    }
    const std::string fine = Fresh(base + "_fine"), taken = Fresh(base + "_taken"), picked = Fresh(base + "_picked"),
                      moved = Fresh(base + "_moved"), out = Fresh(base);
    Emit("Reshape", base + "/Reshape_fine", {in, IntsConst(base + "/fine", f->fine)}, {fine});
    Emit("Slice", base + "/Slice",
         {fine, IntsConst(base + "/starts", f->starts), IntsConst(base + "/ends", ends),
          IntsConst(base + "/axes", axes)},
         {taken});
    Emit("Reshape", base + "/Reshape_picked", {taken, IntsConst(base + "/picked", f->picked)}, {picked});
    SetInts(Emit("Transpose", base + "/Transpose", {picked}, {moved}), "perm", f->perm);
    Emit("Reshape", base + "/Reshape", {moved, IntsConst(base + "/dims", v.dims)}, {out});
    return out;
  }

  // Writes `o` (the view's dims) into `out` of dims `buffer`, which view `v` covers exactly.
  absl::Status ViewWrite(const ir::Node& n, const std::string& o, const std::vector<int64_t>& buffer,
                         const ir::StridedView& v, const std::string& out) {
    const std::optional<ir::NestedForm> f = ir::ToNestedForm(v, ir::ElementCount(buffer));
    if (!f) return INVALID_ARGUMENT() << "node '" << n.name << "': its o_view does not nest";
    std::vector<int64_t> inverse(f->perm.size());
    for (size_t d = 0; d < f->perm.size(); ++d) inverse[f->perm[d]] = static_cast<int64_t>(d);
    std::vector<int64_t> proper;  // the view's dims other than 1, in its order
    for (int64_t d : v.dims)
      if (d != 1) proper.push_back(d);
    const std::string base = n.name + "/O", flat = Fresh(base + "_proper"), moved = Fresh(base + "_moved");
    Emit("Reshape", base + "/Reshape_proper", {o, IntsConst(base + "/proper", proper)}, {flat});
    SetInts(Emit("Transpose", base + "/Transpose", {flat}, {moved}), "perm", inverse);
    Emit("Reshape", base + "/Reshape", {moved, IntsConst(base + "/dims", buffer)}, {out});
    return absl::OkStatus();
  }

  // x (..., Hkv, S, D) -> (..., Hkv * group, S, D), kv head j repeated as query heads
  // [j group, (j + 1) group): Unsqueeze, Expand and Reshape, as transformers' repeat_kv.
  absl::StatusOr<std::string> RepeatKv(const ir::Node& n, const std::string& x, const std::vector<int64_t>& dims,
                                       int64_t group, const char* what) {
    const int r = static_cast<int>(dims.size());
    if (dims.back() < 0) {
      return INVALID_ARGUMENT() << "node '" << n.name << "': grouped " << what << " needs a concrete last dim, got "
                                << absl::StrJoin(dims, ", ");
    }
    const std::string base = n.name + "/repeat_" + what;
    const std::string unsq = Fresh(base + "_unsqueezed"), expanded = Fresh(base + "_expanded"),
                      repeated = Fresh(base + "_repeated");
    Emit("Unsqueeze", base + "/Unsqueeze", {x, IntsConst(base + "/axis", {r - 2})}, {unsq});
    std::vector<int64_t> expand(r + 1, 1);
    expand[r - 2] = group;
    Emit("Expand", base + "/Expand", {unsq, IntsConst(base + "/expand", expand)}, {expanded});
    std::vector<int64_t> merged(r - 3, 0);  // the batch dims before the heads, copied
    merged.insert(merged.end(), {dims[r - 3] * group, -1, dims.back()});
    Emit("Reshape", base + "/Reshape", {expanded, IntsConst(base + "/merged", merged)}, {repeated});
    return repeated;
  }

  // The loss computes in f32 from half scores (op.h) where ONNX's has its scores' type: half scores (and
  // class weights) are cast to f32 first. The onnxpipe-only Stats output (per position m, the maximum over
  // the class axis 1, and s = log(sum(exp(x - m)))) is written with standard ops, stacked on a last axis.
  absl::Status SoftmaxCrossEntropyLoss(const ir::Node& n, std::vector<std::string> ins, std::vector<std::string> outs) {
    auto tmp = [&](const char* hint) { return Fresh(n.name + "/" + hint); };
    const ir::Value& scores = g_.value(n.inputs[0]);
    if (ir::IsHalf(scores.dtype)) {
      for (size_t i : {size_t{0}, size_t{2}}) {
        if (i >= ins.size() || ins[i].empty() || !ir::IsHalf(g_.value(n.inputs[i]).dtype)) continue;
        const std::string wide = tmp(i == 0 ? "scores_f32" : "weights_f32");
        SetInt(Emit("Cast", n.name + (i == 0 ? "/Cast_scores" : "/Cast_weights"), {ins[i]}, {wide}), "to",
               onnx::TensorProto::FLOAT);
        ins[i] = wide;
      }
    }
    const std::string stats = outs.size() > 2 ? outs[2] : "";
    outs.resize(std::min<size_t>(outs.size(), 2));
    RETURN_IF_ERROR(CopyAttrs(n, Emit("SoftmaxCrossEntropyLoss", n.name, ins, outs)));
    if (stats.empty()) return absl::OkStatus();
    const int64_t rank = static_cast<int64_t>(scores.shape.size());
    const std::string mx = tmp("max"), d = tmp("centred"), e = tmp("exp"), sum = tmp("sum"), lsum = tmp("log_sum"),
                      both = tmp("stats_class_axis");
    onnx::NodeProto* r = Emit("ReduceMax", n.name + "/Stats_ReduceMax", {ins[0]}, {mx});
    SetInts(r, "axes", {1});
    SetInt(r, "keepdims", 1);
    Emit("Sub", n.name + "/Stats_Sub", {ins[0], mx}, {d});
    Emit("Exp", n.name + "/Stats_Exp", {d}, {e});
    SetInt(Emit("ReduceSum", n.name + "/Stats_ReduceSum", {e, IntsConst(n.name + "/class_axis", {1})}, {sum}),
           "keepdims", 1);
    Emit("Log", n.name + "/Stats_Log", {sum}, {lsum});
    SetInt(Emit("Concat", n.name + "/Stats_Concat", {mx, lsum}, {both}), "axis", 1);  // (N, 2, D1, ...)
    std::vector<int64_t> perm = {0};
    for (int64_t i = 2; i < rank; ++i) perm.push_back(i);
    perm.push_back(1);
    SetInts(Emit("Transpose", n.name + "/Stats_Transpose", {both}, {stats}), "perm", perm);  // (N, D1, ..., 2)
    return absl::OkStatus();
  }

  absl::Status Attention(const ir::Node& n, std::vector<std::string> ins, const std::string& result,
                         const std::string* stats) {
    const ir::Value& q = g_.value(n.inputs[0]);
    std::vector<int64_t> dims[3];  // Q, K, V as read
    for (int i = 0; i < 3; ++i) {
      const ir::Value& x = g_.value(n.inputs[i]);
      if (!ir::HasAttentionView(n, i)) {
        for (const ir::Dim& d : x.shape) dims[i].push_back(d.is_concrete() ? d.value() : -1);
        continue;
      }
      const std::vector<int64_t> buffer = ir::ToInts(x.shape);
      ASSIGN_OR_RETURN(const ir::StridedView v, ir::AttentionOperandView(n, i, buffer));
      ASSIGN_OR_RETURN(ins[i], ViewRead(n, ins[i], buffer, v, i == 0 ? "Q" : i == 1 ? "K" : "V"));
      dims[i] = v.dims;
    }
    const int r = static_cast<int>(dims[0].size());
    if (r < 2 || dims[1].size() != dims[0].size()) {
      return INVALID_ARGUMENT() << "node '" << n.name << "': Attention needs Q and K of equal rank >= 2";
    }
    // Grouped K and V (fewer heads than Q): repeated over the query heads as transformers' repeat_kv.
    if (const int64_t group = ir::AttentionKvGroup(dims[0], dims[1], dims[2]); group > 1) {
      for (int i = 1; i < 3; ++i) {
        ASSIGN_OR_RETURN(ins[i], RepeatKv(n, ins[i], dims[i], group, i == 1 ? "K" : "V"));
      }
    }
    const std::string out = ir::HasAttentionView(n, 3) ? Fresh(n.name + "/O") : result;
    const ir::DType dt = q.dtype;
    std::vector<int64_t> perm;
    for (int i = 0; i < r - 2; ++i) perm.push_back(i);
    perm.push_back(r - 1);
    perm.push_back(r - 2);
    auto tmp = [&](const char* hint) { return Fresh(n.name + "/" + hint); };
    const std::string kt = tmp("K_T"), s = tmp("scores");
    SetInts(Emit("Transpose", n.name + "/Transpose_K", {ins[1]}, {kt}), "perm", perm);
    Emit("MatMul", n.name + "/MatMul_QK", {ins[0], kt}, {s});
    std::string cur = s;
    const double dh = dims[0].back() > 0 ? static_cast<double>(dims[0].back()) : 1.0;
    const double scale = n.attrs.Get<double>("scale", 1.0 / std::sqrt(dh));
    if (scale != 1.0) {
      const std::string scaled = tmp("scaled");
      Emit("Mul", n.name + "/Mul_scale", {cur, Const(n.name + "/scale", Scalar(dt, scale))}, {scaled});
      cur = scaled;
    }
    if (ins.size() > 3 && !ins[3].empty()) {
      const std::string masked = tmp("masked");
      if (g_.value(n.inputs[3]).dtype == ir::DType::kBool) {
        Emit("Where", n.name + "/Where_mask",
             {ins[3], cur, Const(n.name + "/neg_inf", Scalar(dt, -std::numeric_limits<double>::infinity()))}, {masked});
      } else {
        Emit("Add", n.name + "/Add_mask", {cur, ins[3]}, {masked});
      }
      cur = masked;
    }
    if (n.attrs.Get<int64_t>("causal", 0) != 0) {
      const int64_t sq = dims[0][r - 2], sk = dims[1][r - 2];
      if (sq < 0 || sk < 0) {
        return INVALID_ARGUMENT() << "node '" << n.name << "': causal Attention needs concrete sequence lengths";
      }
      ir::Tensor tri(ir::DType::kF32, {sq, sk});
      for (int64_t i = 0; i < sq; ++i)
        for (int64_t j = 0; j < sk; ++j)
          tri.mutable_data<float>()[i * sk + j] = j > i ? -std::numeric_limits<float>::infinity() : 0.0f;
      if (dt != ir::DType::kF32) tri = tri.CastTo(dt);
      const std::string causal = tmp("causal");
      Emit("Add", n.name + "/Add_causal", {cur, Const(n.name + "/causal_mask", std::move(tri))}, {causal});
      cur = causal;
    }
    if (stats != nullptr) {
      // The optional Stats output, f32: m + log(sum(exp(s - m))) over the keys, m the row maximum
      // clamped to the lowest finite value (a row with every key masked gives -inf, not NaN).
      const std::string mx = tmp("row_max"), m = tmp("row_max_finite"), d = tmp("centred"), e = tmp("exp"),
                        sum = tmp("sum"), lsum = tmp("log_sum"), mq = tmp("row_max_squeezed"),
                        lse = dt == ir::DType::kF32 ? *stats : tmp("lse");
      onnx::NodeProto* r = Emit("ReduceMax", n.name + "/Stats_ReduceMax", {cur}, {mx});
      SetInts(r, "axes", {-1});
      SetInt(r, "keepdims", 1);
      Emit("Max", n.name + "/Stats_Max", {mx, Const(n.name + "/lowest", Scalar(dt, -ir::MaxFinite(dt)))}, {m});
      Emit("Sub", n.name + "/Stats_Sub", {cur, m}, {d});
      Emit("Exp", n.name + "/Stats_Exp", {d}, {e});
      const std::string last = IntsConst(n.name + "/last_axis", {-1});
      SetInt(Emit("ReduceSum", n.name + "/Stats_ReduceSum", {e, last}, {sum}), "keepdims", 0);
      Emit("Log", n.name + "/Stats_Log", {sum}, {lsum});
      Emit("Squeeze", n.name + "/Stats_Squeeze", {m, last}, {mq});
      Emit("Add", n.name + "/Stats_Add", {lsum, mq}, {lse});
      if (lse != *stats) SetInt(Emit("Cast", n.name + "/Stats_Cast", {lse}, {*stats}), "to", onnx::TensorProto::FLOAT);
    }
    const std::string probs = tmp("probs");
    SetInt(Emit("Softmax", n.name + "/Softmax", {cur}, {probs}), "axis", -1);
    cur = probs;
    const double dropout = n.attrs.Get<double>("dropout", 0.0);
    if (dropout > 0) {
      const std::string dropped = tmp("dropped");
      Emit("Dropout", n.name + "/Dropout",
           {cur, Const(n.name + "/ratio", Scalar(ir::DType::kF32, dropout)),
            Const(n.name + "/training_mode", ir::Tensor::Scalar<bool>(true))},
           {dropped});
      cur = dropped;
    }
    Emit("MatMul", n.name, {cur, ins[2]}, {out});
    if (!ir::HasAttentionView(n, 3)) return absl::OkStatus();
    const std::vector<int64_t> y = ir::ToInts(g_.value(n.outputs[0]).shape);
    ASSIGN_OR_RETURN(const ir::StridedView o, ir::AttentionOutputView(n, y));
    return ViewWrite(n, out, y, o, result);
  }

  const ir::Graph& g_;
  const StageExportOptions& options_;
  onnx::ModelProto model_;
  onnx::GraphProto* graph_ = nullptr;
  std::set<std::string> used_names_;
  std::set<ir::ValueId> seen_constants_;
  std::vector<ir::ValueId> constants_;
  std::vector<std::pair<std::string, ir::Tensor>> extra_;
};

}  // namespace

absl::Status ExportStageOnnx(const ir::Graph& g, const std::string& path, const StageExportOptions& options) {
  Exporter ex(g, options);
  if (absl::Status st = ex.Build(); !st.ok()) return Annotate(st, path);
  onnx::ModelProto& model = ex.model();
  std::vector<std::pair<std::string, const ir::Tensor*>> tensors;
  int64_t total = 0;
  for (ir::ValueId v : ex.constants()) {
    const ir::Value& val = g.value(v);
    if (!val.constant->defined()) return INVALID_ARGUMENT() << path << ": constant '" << val.name << "' has no data";
    tensors.emplace_back(val.name, &*val.constant);
    total += val.constant->num_bytes();
  }
  for (auto& [name, t] : ex.extra_constants()) {
    tensors.emplace_back(name, &t);
    total += t.num_bytes();
  }
  const bool external = total > options.inline_limit_bytes;
  const std::string data_path = path + ".data";
  AtomicFileWriter data_file(data_path);
  if (external) RETURN_IF_ERROR(data_file.Open());
  for (const auto& [name, t] : tensors) {
    onnx::TensorProto* init = model.mutable_graph()->add_initializer();
    if (external && t->num_bytes() > options.external_threshold_bytes) {
      init->set_name(name);
      init->set_data_type(OnnxFromDType(t->dtype()));
      for (int64_t d : t->dims()) init->add_dims(d);
      RETURN_IF_ERROR(data_file.PadTo(64));
      const int64_t offset = data_file.size();
      RETURN_IF_ERROR(data_file.Write(t->raw(), t->num_bytes()));
      init->set_data_location(onnx::TensorProto::EXTERNAL);
      for (const auto& [key, val] :
           {std::pair<std::string, std::string>{"location", std::filesystem::path(data_path).filename().string()},
            {"offset", absl::StrCat(offset)},
            {"length", absl::StrCat(t->num_bytes())}}) {
        auto* entry = init->add_external_data();
        entry->set_key(key);
        entry->set_value(val);
      }
    } else {
      SetTensorData(init, name, *t);
    }
  }
  if (external) RETURN_IF_ERROR(data_file.Commit());
  if (options.check) {
    onnx::checker::CheckerContext ctx;
    ctx.set_model_dir(FolderOf(path) + "/");
    try {
      onnx::checker::check_model(model, ctx);
      GuardLibonnxInference();
      onnx::ModelProto copy = model;
      onnx::shape_inference::InferShapes(copy, onnx::OpSchemaRegistry::Instance(),
                                         onnx::ShapeInferenceOptions(/*check_type_val=*/true, /*strict_mode_val=*/1));
    } catch (const std::exception& e) {
      return INVALID_ARGUMENT() << path << ": the exported stage fails the ONNX checker: " << e.what();
    }
  }
  std::string bytes;
  if (model.ByteSizeLong() > static_cast<size_t>(INT32_MAX) || !model.SerializeToString(&bytes)) {
    return INVALID_ARGUMENT() << path << ": the stage does not fit protobuf's 2 GiB limit";
  }
  AtomicFileWriter model_file(path);
  RETURN_IF_ERROR(model_file.Open());
  RETURN_IF_ERROR(model_file.Write(bytes));
  return model_file.Commit();
}

}  // namespace onnxpipe::onnx_frontend
