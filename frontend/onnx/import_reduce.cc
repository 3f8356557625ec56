// Importers for reductions, normalisation, softmax and the softmax cross-entropy loss.
// Reduce* axes moved from an attribute to an input (ReduceSum at opset 13, ReduceMean/ReduceMax
// at 18); both forms import to the IR attribute `axes`, with keepdims and noop_with_empty_axes
// always written so that every opset's form of the same reduction gives the same IR node.
// LayerNormalization (opset 17) and RMSNormalization (opset 23) import to the fused IR norms.
#include "absl/strings/str_cat.h"
#include "frontend/onnx/importer.h"

namespace onnxpipe::onnx_frontend {
namespace {

using ir::OpKind;

absl::Status ImportReduce(ImportContext& ctx, OpKind op) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 2));
  // The StatusOr is kept, not moved into a local optional: GCC 12 warns (-Wmaybe-uninitialized, a false
  // positive) about the moved-to optional's vector.
  const absl::StatusOr<std::optional<std::vector<int64_t>>> axes = AttrOrConstantInputInts(ctx, "axes", 1);
  RETURN_IF_ERROR(axes.status());
  ASSIGN_OR_RETURN(int64_t keepdims, ctx.attrs().Get<int64_t>("keepdims", 1));
  ASSIGN_OR_RETURN(int64_t noop, ctx.attrs().Get<int64_t>("noop_with_empty_axes", 0));
  ir::Attrs attrs;
  if (*axes && !(*axes)->empty()) attrs.Set("axes", **axes);
  attrs.Set("keepdims", keepdims);
  attrs.Set("noop_with_empty_axes", noop);
  return ctx.Emit(op, {ctx.input(0)}, std::move(attrs));
}

ONNX_IMPORTER(ReduceMean) { return ImportReduce(ctx, OpKind::kReduceMean); }
ONNX_IMPORTER(ReduceSum) { return ImportReduce(ctx, OpKind::kReduceSum); }
ONNX_IMPORTER(ReduceMax) { return ImportReduce(ctx, OpKind::kReduceMax); }

// Opset >= 13 softmax: one axis, default -1 (the opset < 13 "coerce to 2-D" form is not
// accepted: the loader refuses opsets below 13).
absl::Status ImportSoftmaxLike(ImportContext& ctx, OpKind op) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 1));
  ASSIGN_OR_RETURN(int64_t axis, ctx.attrs().Get<int64_t>("axis", -1));
  ir::Attrs attrs;
  attrs.Set("axis", axis);
  return ctx.Emit(op, {ctx.input(0)}, std::move(attrs));
}

ONNX_IMPORTER(Softmax) { return ImportSoftmaxLike(ctx, OpKind::kSoftmax); }
ONNX_IMPORTER(LogSoftmax) { return ImportSoftmaxLike(ctx, OpKind::kLogSoftmax); }

// ONNX LayerNormalization (opset 17) is the fused IR LayerNorm; stash_type only picks the
// precision of Mean/InvStdDev, which the IR computes in f32 anyway.
ONNX_IMPORTER(LayerNormalization) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(2, 3));
  ASSIGN_OR_RETURN(int64_t axis, ctx.attrs().Get<int64_t>("axis", -1));
  ASSIGN_OR_RETURN(double epsilon, ctx.attrs().Get<double>("epsilon", 1e-5));
  if (!(epsilon >= 0)) return ctx.Error() << "attribute epsilon must be >= 0; got " << epsilon;
  ir::Attrs attrs;
  attrs.Set("axis", axis);
  attrs.Set("epsilon", epsilon);
  return ctx.Emit(OpKind::kLayerNorm, {ctx.input(0), ctx.input(1), ctx.input(2)},
                  std::move(attrs));
}

// ONNX RMSNormalization (opset 23) is the fused IR RMSNorm. libonnx 1.12 has no schema for it (nor
// any opset above 17: the loader skips its checker for those files), so this importer checks what
// the schema would: two inputs and one output (the op has no InvStdDev output), epsilon >= 0, a
// float stash_type, and axis in [-rank, rank) when X's rank is declared; the IR's shape rule checks
// the axis against the inferred rank and scale's broadcast to the normalised dims. stash_type
// only picks the precision of the statistics, which the IR computes in X's dtype and at least f32.
ONNX_IMPORTER(RMSNormalization) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(2, 2));
  if (ctx.num_outputs() != 1) return ctx.Error() << "has " << ctx.num_outputs() << " outputs; expected 1 (Y)";
  ASSIGN_OR_RETURN(int64_t axis, ctx.attrs().Get<int64_t>("axis", -1));
  // The schema's default is the FLOAT 1e-5, i.e. 1e-5f, as a written attribute holds it.
  ASSIGN_OR_RETURN(double epsilon, ctx.attrs().Get<double>("epsilon", static_cast<double>(1e-5f)));
  ASSIGN_OR_RETURN(int64_t stash_type, ctx.attrs().Get<int64_t>("stash_type", 1));
  if (!(epsilon >= 0)) return ctx.Error() << "attribute epsilon must be >= 0; got " << epsilon;
  constexpr int64_t kFloat = 1, kFloat16 = 10, kDouble = 11, kBFloat16 = 16;  // TensorProto.DataType
  if (stash_type != kFloat && stash_type != kFloat16 && stash_type != kDouble && stash_type != kBFloat16) {
    return ctx.Error() << "attribute stash_type must be a float type (1 float, 10 float16, 11 double, "
                       << "16 bfloat16); got " << stash_type;
  }
  const ir::Value& x = ctx.graph().value(ctx.input(0));
  if (x.shape_known) {
    const int64_t rank = static_cast<int64_t>(x.shape.size());
    if (axis < -rank || axis >= rank) {
      return ctx.Error() << "attribute axis " << axis << " is out of range for X '" << x.name << "' of rank " << rank
                         << " (expected " << -rank << " to " << rank - 1 << ")";
    }
  }
  ir::Attrs attrs;
  attrs.Set("axis", axis);
  attrs.Set("epsilon", epsilon);
  return ctx.Emit(OpKind::kRMSNorm, {ctx.input(0), ctx.input(1)}, std::move(attrs));
}

ONNX_IMPORTER(SoftmaxCrossEntropyLoss) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(2, 3));
  ASSIGN_OR_RETURN(std::string reduction, ctx.attrs().Get<std::string>("reduction", "mean"));
  if (reduction != "none" && reduction != "sum" && reduction != "mean") {
    return ctx.Error() << "attribute reduction must be 'none', 'sum' or 'mean'; got '"
                       << reduction << "'";
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> ignore_index,
                   ctx.attrs().GetOptional<int64_t>("ignore_index"));
  ir::Attrs attrs;
  attrs.Set("reduction", reduction);
  if (ignore_index) attrs.Set("ignore_index", *ignore_index);
  return ctx.Emit(OpKind::kSoftmaxCrossEntropyLoss, {ctx.input(0), ctx.input(1), ctx.input(2)},
                  std::move(attrs));
}

}  // namespace

void RegisterReduceImporters(ImporterRegistry& r) {
  REGISTER_ONNX_IMPORTER(r, ReduceMean);
  REGISTER_ONNX_IMPORTER(r, ReduceSum);
  REGISTER_ONNX_IMPORTER(r, ReduceMax);
  REGISTER_ONNX_IMPORTER(r, Softmax);
  REGISTER_ONNX_IMPORTER(r, LogSoftmax);
  REGISTER_ONNX_IMPORTER_SINCE(r, LayerNormalization, 17);
  REGISTER_ONNX_IMPORTER_SINCE(r, RMSNormalization, 23);
  REGISTER_ONNX_IMPORTER(r, SoftmaxCrossEntropyLoss);
}

}  // namespace onnxpipe::onnx_frontend
