// The pass interface and the pass pipeline (in the style of XLA's HloPassInterface and
// HloPassPipeline).
//
// A pass rewrites an ir::Graph in place and reports whether it changed anything. A PassPipeline
// runs passes in the order they were added, runs ir::Verify after every pass, and prefixes any
// error (from the pass or from the verifier) with the pass name, so a broken rewrite is caught
// where it happens. A pipeline is itself a pass; a sub-pipeline added with AddFixpoint() repeats
// until none of its passes changes the graph.
//
// Contract for passes: the graph is in a valid topological order on entry (Verify holds) and must
// be again on exit (call ir::Graph::TopoSort() after inserting or removing nodes). Passes never
// delete values; a value that loses its last use simply stays unused.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::passes {

class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string_view name() const = 0;
  // Returns true when the graph changed.
  virtual absl::StatusOr<bool> Run(ir::Graph* g) = 0;
};

class PassPipeline : public Pass {
 public:
  explicit PassPipeline(std::string name) : name_(std::move(name)) {}

  std::string_view name() const override { return name_; }

  // Adds a pass constructed from `args`; returns it so that callers may configure it further.
  template <typename T, typename... Args>
  T& AddPass(Args&&... args) {
    auto pass = std::make_unique<T>(std::forward<Args>(args)...);
    T& ref = *pass;
    passes_.push_back(std::move(pass));
    return ref;
  }

  // Adds a sub-pipeline that is re-run until no pass in it reports a change. More than
  // `max_iterations` rounds is reported as an error (the passes do not converge).
  PassPipeline& AddFixpoint(std::string name, int max_iterations = 25);

  // Runs every pass once (or to the fixpoint for a fixpoint pipeline), verifying after each.
  absl::StatusOr<bool> Run(ir::Graph* g) override;

  // Names of the passes that ran and reported a change, in order ("fold/constant-folding" for a
  // pass inside a sub-pipeline). Reset at the start of every Run(). For logs and tests.
  const std::vector<std::string>& changed_log() const { return changed_log_; }

  // Whether to run ir::Verify after each pass (default true); sub-pipelines follow their parent.
  void set_verify(bool verify) { verify_ = verify; }

 private:
  absl::StatusOr<bool> RunOnce(ir::Graph* g);

  std::string name_;
  std::vector<std::unique_ptr<Pass>> passes_;
  int max_iterations_ = 1;
  bool fixpoint_ = false;
  bool verify_ = true;
  std::vector<std::string> changed_log_;
};

}  // namespace onnxpipe::passes
