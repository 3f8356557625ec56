// Importers for the index and mask ops of Hugging Face exports: GatherElements, GatherND, CumSum,
// ArgMax (RoBERTa's position ids, the padding-mask lookups of transformers' mask code, the last
// non-pad token of sequence classification heads) and the
// predicates GreaterOrEqual, LessOrEqual, IsNaN (causal and padding masks, SDPA's guard against
// fully masked rows). CumSum's axis becomes an attribute (op.h).
#include "frontend/onnx/importer.h"

namespace onnxpipe::onnx_frontend {
namespace {

using ir::OpKind;

absl::Status ImportPredicate(ImportContext& ctx, OpKind op, int n) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(n, n));
  std::vector<ir::ValueId> in(n);
  for (int i = 0; i < n; ++i) in[i] = ctx.input(i);
  return ctx.Emit(op, std::move(in));
}

ONNX_IMPORTER(GreaterOrEqual) { return ImportPredicate(ctx, OpKind::kGreaterOrEqual, 2); }
ONNX_IMPORTER(LessOrEqual) { return ImportPredicate(ctx, OpKind::kLessOrEqual, 2); }
ONNX_IMPORTER(IsNaN) { return ImportPredicate(ctx, OpKind::kIsNaN, 1); }

ONNX_IMPORTER(GatherElements) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(2, 2));
  ASSIGN_OR_RETURN(int64_t axis, ctx.attrs().Get<int64_t>("axis", 0));
  ir::Attrs attrs;
  attrs.Set("axis", axis);
  return ctx.Emit(OpKind::kGatherElements, {ctx.input(0), ctx.input(1)}, std::move(attrs));
}

ONNX_IMPORTER(GatherND) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(2, 2));
  ASSIGN_OR_RETURN(int64_t batch_dims, ctx.attrs().Get<int64_t>("batch_dims", 0));
  if (batch_dims < 0) return ctx.Error() << "attribute batch_dims must be >= 0; got " << batch_dims;
  ir::Attrs attrs;
  attrs.Set("batch_dims", batch_dims);
  return ctx.Emit(OpKind::kGatherND, {ctx.input(0), ctx.input(1)}, std::move(attrs));
}

// CumSum(x, axis): the axis input must be a constant integer scalar (exporters write one).
ONNX_IMPORTER(CumSum) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(2, 2));
  ASSIGN_OR_RETURN(const ir::Tensor* axis, ctx.ConstantInput(1, "axis"));
  if (axis == nullptr) return ctx.Error() << "input 1 (axis) must be a constant";
  ASSIGN_OR_RETURN(std::vector<int64_t> axis_values, TensorToInts(*axis, "axis", ctx));
  if (axis_values.size() != 1) {
    return ctx.Error() << "input 1 (axis) must hold one value; got " << axis->DebugString(4);
  }
  ir::Attrs attrs;
  attrs.Set("axis", axis_values[0]);
  for (const char* flag : {"exclusive", "reverse"}) {
    ASSIGN_OR_RETURN(int64_t v, ctx.attrs().Get<int64_t>(flag, 0));
    if (v != 0 && v != 1) return ctx.Error() << "attribute " << flag << " must be 0 or 1; got " << v;
    attrs.Set(flag, v);
  }
  return ctx.Emit(OpKind::kCumSum, {ctx.input(0)}, std::move(attrs));
}

ONNX_IMPORTER(ArgMax) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 1));
  ir::Attrs attrs;
  ASSIGN_OR_RETURN(int64_t axis, ctx.attrs().Get<int64_t>("axis", 0));
  attrs.Set("axis", axis);
  for (auto [flag, def] : {std::pair<const char*, int64_t>{"keepdims", 1}, {"select_last_index", 0}}) {
    ASSIGN_OR_RETURN(int64_t v, ctx.attrs().Get<int64_t>(flag, def));
    if (v != 0 && v != 1) return ctx.Error() << "attribute " << flag << " must be 0 or 1; got " << v;
    attrs.Set(flag, v);
  }
  return ctx.Emit(OpKind::kArgMax, {ctx.input(0)}, std::move(attrs));
}

}  // namespace

void RegisterIndexImporters(ImporterRegistry& r) {
  REGISTER_ONNX_IMPORTER(r, GreaterOrEqual);
  REGISTER_ONNX_IMPORTER(r, LessOrEqual);
  REGISTER_ONNX_IMPORTER(r, IsNaN);
  REGISTER_ONNX_IMPORTER(r, GatherElements);
  REGISTER_ONNX_IMPORTER(r, GatherND);
  REGISTER_ONNX_IMPORTER(r, CumSum);
  REGISTER_ONNX_IMPORTER(r, ArgMax);
}

}  // namespace onnxpipe::onnx_frontend
