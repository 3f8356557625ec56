#include "frontend/passes/pipeline.h"

#include <algorithm>

#include "frontend/ir/status.h"
#include "frontend/ir/verifier.h"
#include "frontend/passes/attention_fusion.h"
#include "frontend/passes/attention_layout.h"
#include "frontend/passes/dead_code_elimination.h"
#include "frontend/passes/dropout_fusion.h"
#include "frontend/passes/freeze_buffers.h"
#include "frontend/passes/gated_activation_fusion.h"
#include "frontend/passes/gathers_to_split.h"
#include "frontend/passes/gelu_fusion.h"
#include "frontend/passes/layer_norm_fusion.h"
#include "frontend/passes/linear_fusion.h"
#include "frontend/passes/pass.h"
#include "frontend/passes/repeat_kv_fold.h"
#include "frontend/passes/residual_norm_fusion.h"
#include "frontend/passes/rms_norm_fusion.h"
#include "frontend/passes/rotary_fusion.h"
#include "frontend/passes/row_layout_motion.h"
#include "frontend/passes/tie_transposed_initializers.h"
#include "frontend/passes/upcast_half_precision.h"

namespace onnxpipe::passes {

absl::Status RunForwardPipeline(ir::Graph* g, const ir::OpEvaluator& evaluator, const PipelineOptions& options) {
  if (options.verify) RETURN_IF_ERROR(Annotate(ir::Verify(*g), "graph invalid before the forward pipeline"));
  PassPipeline pipeline("forward");
  pipeline.set_verify(options.verify);
  pipeline.AddPass<FreezeBuffers>();
  pipeline.AddPass<UpcastHalfPrecision>();
  pipeline.AddPass<TieTransposedInitializers>();
  if (options.fold) {
    PassPipeline& simplify = pipeline.AddFixpoint("simplify");
    simplify.AddPass<ConstantFolding>(evaluator, options.folding);
    simplify.AddPass<DeadCodeElimination>();
  }
  if (options.fuse) {
    pipeline.AddPass<LinearFusion>();
    pipeline.AddPass<LayerNormFusion>();
    pipeline.AddPass<RMSNormFusion>();
    pipeline.AddPass<RotaryFusion>();
    pipeline.AddPass<GeluFusion>();
    pipeline.AddPass<GatedActivationFusion>();  // reads the fused Gelu
    pipeline.AddPass<DropoutFusion>();
    pipeline.AddPass<AttentionFusion>(&evaluator, std::max(options.folding.max_elements, kMaxProvenMaskElements));
    pipeline.AddPass<RepeatKvFold>();
    pipeline.AddPass<GathersToSplit>();
    pipeline.AddPass<DeadCodeElimination>();  // the folds' leftovers would count as other readers below
    pipeline.AddPass<RowLayoutMotion>();
    pipeline.AddPass<AttentionLayout>();
    pipeline.AddPass<ResidualNormFusion>();
  }
  pipeline.AddPass<DeadCodeElimination>();
  RETURN_IF_ERROR(pipeline.Run(g).status());
  if (options.changed_log != nullptr) *options.changed_log = pipeline.changed_log();
  return absl::OkStatus();
}

}  // namespace onnxpipe::passes
