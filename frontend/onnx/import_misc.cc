// Importers for MatMul, Gemm, Gather, Constant, Cast and Dropout.
#include "absl/strings/str_cat.h"
#include "frontend/onnx/importer.h"
#include "frontend/onnx/tensor_proto.h"

namespace onnxpipe::onnx_frontend {
namespace {

using ir::OpKind;

ONNX_IMPORTER(MatMul) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(2, 2));
  return ctx.Emit(OpKind::kMatMul, {ctx.input(0), ctx.input(1)});
}

ONNX_IMPORTER(Gemm) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(2, 3));
  ASSIGN_OR_RETURN(double alpha, ctx.attrs().Get<double>("alpha", 1.0));
  ASSIGN_OR_RETURN(double beta, ctx.attrs().Get<double>("beta", 1.0));
  ASSIGN_OR_RETURN(int64_t trans_a, ctx.attrs().Get<int64_t>("transA", 0));
  ASSIGN_OR_RETURN(int64_t trans_b, ctx.attrs().Get<int64_t>("transB", 0));
  ir::Attrs attrs;
  attrs.Set("alpha", alpha);
  attrs.Set("beta", beta);
  attrs.Set("transA", trans_a);
  attrs.Set("transB", trans_b);
  return ctx.Emit(OpKind::kGemm, {ctx.input(0), ctx.input(1), ctx.input(2)}, std::move(attrs));
}

ONNX_IMPORTER(Gather) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(2, 2));
  ASSIGN_OR_RETURN(int64_t axis, ctx.attrs().Get<int64_t>("axis", 0));
  ir::Attrs attrs;
  attrs.Set("axis", axis);
  return ctx.Emit(OpKind::kGather, {ctx.input(0), ctx.input(1)}, std::move(attrs));
}

// Constant nodes become constant values, not nodes: exactly one of value, value_float(s),
// value_int(s). Sparse and string constants are not supported.
ONNX_IMPORTER(Constant) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(0, 0));
  const AttrReader& attrs = ctx.attrs();
  int forms = 0;
  for (const char* name : {"value", "value_float", "value_floats", "value_int", "value_ints",
                           "sparse_value", "value_string", "value_strings"}) {
    forms += attrs.Has(name) ? 1 : 0;
  }
  if (forms != 1) {
    return ctx.Error() << "must have exactly one value attribute (value, value_float(s), "
                          "value_int(s)); it has "
                       << forms;
  }
  for (const char* name : {"sparse_value", "value_string", "value_strings"}) {
    if (attrs.Has(name)) return ctx.Error() << "attribute " << name << " is not supported";
  }
  ir::Tensor t;
  if (attrs.Has("value")) {
    ASSIGN_OR_RETURN(t, attrs.Required<ir::Tensor>("value"));
  } else if (attrs.Has("value_float")) {
    ASSIGN_OR_RETURN(float v, attrs.Required<float>("value_float"));
    t = ir::Tensor::Scalar<float>(v);
  } else if (attrs.Has("value_floats")) {
    ASSIGN_OR_RETURN(std::vector<double> v, attrs.Required<std::vector<double>>("value_floats"));
    t = ir::Tensor::FromVector<float>({static_cast<int64_t>(v.size())},
                                      std::vector<float>(v.begin(), v.end()));
  } else if (attrs.Has("value_int")) {
    ASSIGN_OR_RETURN(int64_t v, attrs.Required<int64_t>("value_int"));
    t = ir::Tensor::Scalar<int64_t>(v);
  } else {
    ASSIGN_OR_RETURN(std::vector<int64_t> v, attrs.Required<std::vector<int64_t>>("value_ints"));
    t = ir::Tensor::FromVector<int64_t>({static_cast<int64_t>(v.size())}, v);
  }
  return ctx.DefineConstant(std::move(t));
}

// Cast's `to` is stored as the IR dtype name ("f32", "i64", ...).
ONNX_IMPORTER(Cast) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 1));
  ASSIGN_OR_RETURN(int64_t to, ctx.attrs().Required<int64_t>("to"));
  if (to < INT32_MIN || to > INT32_MAX) return ctx.Error() << "attribute to is " << to;
  auto dtype = DTypeFromOnnx(static_cast<int32_t>(to));
  if (!dtype.ok()) return Annotate(dtype.status(), absl::StrCat(ctx.describe(), ": attribute to"));
  ir::Attrs attrs;
  attrs.Set("to", std::string(ir::DTypeName(*dtype)));
  return ctx.Emit(OpKind::kCast, {ctx.input(0)}, std::move(attrs));
}

// ONNX Dropout(data, ratio?, training_mode?) -> IR Dropout(data) with attribute `ratio`: the
// ratio input must be constant; training_mode is dropped because the trainer treats every Dropout
// as active while training (PyTorch's exporter leaves it off some of them).
ONNX_IMPORTER(Dropout) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 3));
  ASSIGN_OR_RETURN(const ir::Tensor* ratio_input, ctx.ConstantInput(1, "ratio"));
  ASSIGN_OR_RETURN(std::optional<double> ratio_attr,
                   ctx.attrs().GetOptional<double>("ratio"));  // opset < 12 form
  if (ratio_input && ratio_attr) {
    return ctx.Error() << "gives ratio both as an attribute and as input 1";
  }
  double ratio = ratio_attr.value_or(0.5);
  if (ratio_input) {
    if (ratio_input->num_elements() != 1 || !ir::IsFloat(ratio_input->dtype())) {
      return ctx.Error() << "ratio must be a floating-point scalar; got "
                         << ratio_input->DebugString(4);
    }
    ratio = ratio_input->GetAsDouble(0);
  }
  if (!(ratio >= 0.0 && ratio < 1.0)) {
    return ctx.Error() << "ratio must be in [0, 1); got " << ratio;
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> seed, ctx.attrs().GetOptional<int64_t>("seed"));
  ir::Attrs attrs;
  attrs.Set("ratio", ratio);
  if (seed) attrs.Set("seed", *seed);
  return ctx.Emit(OpKind::kDropout, {ctx.input(0)}, std::move(attrs));
}

}  // namespace

void RegisterMiscImporters(ImporterRegistry& r) {
  REGISTER_ONNX_IMPORTER(r, MatMul);
  REGISTER_ONNX_IMPORTER(r, Gemm);
  REGISTER_ONNX_IMPORTER(r, Gather);
  REGISTER_ONNX_IMPORTER(r, Constant);
  REGISTER_ONNX_IMPORTER(r, Cast);
  REGISTER_ONNX_IMPORTER(r, Dropout);
}

}  // namespace onnxpipe::onnx_frontend
