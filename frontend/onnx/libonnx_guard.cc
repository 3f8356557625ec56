// libonnx 1.12's shape inference trusts some attributes. Found by fuzzing the loader
// (fuzz/onnx_loader_fuzzer) and a sweep over every imported op with out-of-range attributes
// and input ranks 0-3:
// - LayerNormalization-17 with Mean/InvStdDev outputs and an axis below -rank (or any axis on a
//   rank-0 input) writes through mutable_dim(axis + rank) with a negative index: a SEGV.
// Each guard validates what the original function assumes, then calls it unchanged.
#include "frontend/onnx/libonnx_guard.h"

#include <mutex>

#include "onnx/defs/schema.h"
#include "onnx/defs/shape_inference.h"

namespace onnxpipe::onnx_frontend {
namespace {

// Replaces the inference function of (op_type, since_version) in the default domain by
// `guard` followed by the original.
void Wrap(const char* op_type, int since_version,
          void (*guard)(onnx::InferenceContext& ctx)) {
  const onnx::OpSchema* found = onnx::OpSchemaRegistry::Schema(op_type, since_version, "");
  if (found == nullptr || found->SinceVersion() != since_version) return;
  // The registry stores schemas by value in a mutable static map; it only hands out const
  // pointers, so the cast is how a schema's inference function is replaced.
  auto* schema = const_cast<onnx::OpSchema*>(found);
  onnx::InferenceFunction original = schema->GetTypeAndShapeInferenceFunction();
  if (!original) return;
  schema->TypeAndShapeInferenceFunction([original, guard](onnx::InferenceContext& ctx) {
    guard(ctx);
    original(ctx);
  });
}

void GuardLayerNormalizationAxis(onnx::InferenceContext& ctx) {
  if (ctx.getNumInputs() < 1 || !onnx::hasInputShape(ctx, 0)) return;
  const int64_t rank = onnx::getInputShape(ctx, 0).dim_size();
  const onnx::AttributeProto* attr = ctx.getAttribute("axis");
  const int64_t axis = attr != nullptr ? attr->i() : -1;
  if (rank == 0 || axis < -rank || axis >= rank) {
    fail_shape_inference("LayerNormalization: axis ", axis, " is out of range for an input of rank ",
                         rank);
  }
}

}  // namespace

void GuardLibonnxInference() {
  static std::once_flag once;
  std::call_once(once, [] { Wrap("LayerNormalization", 17, GuardLayerNormalizationAxis); });
}

}  // namespace onnxpipe::onnx_frontend
