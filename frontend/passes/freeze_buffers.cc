#include "frontend/passes/freeze_buffers.h"

#include "frontend/autodiff/trainable.h"
#include "frontend/ir/status.h"

namespace onnxpipe::passes {

absl::StatusOr<bool> FreezeBuffers::Run(ir::Graph* g) {
  ASSIGN_OR_RETURN(autodiff::TrainableReport report, autodiff::MarkTrainable(g));
  for (const autodiff::InitializerDecision& d : report.decisions) {
    if (!d.trainable && ir::IsFloat(g->value(d.value).dtype)) return true;
  }
  return false;
}

}  // namespace onnxpipe::passes
