// PassPipeline: sequencing, verification between passes, fixpoint iteration.

#include <string>

#include "frontend/ir/status.h"
#include "frontend/ir/verifier.h"
#include "frontend/passes/pass.h"

namespace onnxpipe::passes {

PassPipeline& PassPipeline::AddFixpoint(std::string name, int max_iterations) {
  PassPipeline& sub = AddPass<PassPipeline>(std::move(name));
  sub.fixpoint_ = true;
  sub.max_iterations_ = max_iterations;
  sub.verify_ = verify_;
  return sub;
}

absl::StatusOr<bool> PassPipeline::RunOnce(ir::Graph* g) {
  bool changed = false;
  for (const std::unique_ptr<Pass>& pass : passes_) {
    const std::string pass_name(pass->name());
    auto* sub = dynamic_cast<PassPipeline*>(pass.get());
    if (sub != nullptr) sub->verify_ = verify_;  // a sub-pipeline verifies as its parent does
    absl::StatusOr<bool> result = pass->Run(g);
    if (!result.ok()) return Annotate(result.status(), "pass '" + pass_name + "'");
    if (verify_) {
      // The verifier, not the next pass, should be the one to notice a broken rewrite.
      absl::Status st = ir::Verify(*g);
      if (!st.ok()) return Annotate(st, "graph invalid after pass '" + pass_name + "'");
    }
    if (*result) {
      changed = true;
      if (sub != nullptr) {
        for (const std::string& inner : sub->changed_log())
          changed_log_.push_back(pass_name + "/" + inner);
      } else {
        changed_log_.push_back(pass_name);
      }
    }
  }
  return changed;
}

absl::StatusOr<bool> PassPipeline::Run(ir::Graph* g) {
  changed_log_.clear();
  if (!fixpoint_) return RunOnce(g);
  bool changed_any = false;
  for (int iteration = 0; iteration < max_iterations_; ++iteration) {
    ASSIGN_OR_RETURN(bool changed, RunOnce(g));
    if (!changed) return changed_any;
    changed_any = true;
  }
  return FAILED_PRECONDITION() << "pipeline '" << name_ << "' did not reach a fixpoint within "
                               << max_iterations_ << " iterations";
}

}  // namespace onnxpipe::passes
