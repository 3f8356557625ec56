#include "frontend/passes/pass.h"

#include "frontend/ir/verifier.h"
#include "frontend/passes/constant_folding.h"
#include "frontend/passes/dead_code_elimination.h"
#include "gtest/gtest.h"
#include "tests/passes/test_util.h"

namespace onnxpipe::passes {
namespace {

using ir::Dim;
using ir::OpKind;
using ir::ValueId;
using testing::GraphBuilder;

// A pass that breaks SSA by pointing a node at a value defined after it.
class BreakGraph : public Pass {
 public:
  std::string_view name() const override { return "break-graph"; }
  absl::StatusOr<bool> Run(ir::Graph* g) override {
    std::vector<ir::NodeId> live = g->LiveNodes();
    g->node(live.front()).inputs[0] = g->node(live.back()).outputs[0];
    return true;
  }
};

class FailingPass : public Pass {
 public:
  std::string_view name() const override { return "failing"; }
  absl::StatusOr<bool> Run(ir::Graph*) override { return absl::InvalidArgumentError("boom"); }
};

// Reports a change the first `n` times it runs.
class CountdownPass : public Pass {
 public:
  explicit CountdownPass(int n) : remaining_(n) {}
  std::string_view name() const override { return "countdown"; }
  absl::StatusOr<bool> Run(ir::Graph*) override {
    ++runs;
    return remaining_-- > 0;
  }
  int runs = 0;

 private:
  int remaining_;
};

ir::Graph TwoNodeGraph() {
  GraphBuilder b;
  ValueId x = b.Input("x", {Dim(2)});
  b.Output(b.Op(OpKind::kNeg, {b.Op(OpKind::kRelu, {x}, {Dim(2)})}, {Dim(2)}));
  return b.graph();
}

TEST(PassPipelineTest, VerifierErrorsNameThePass) {
  ir::Graph g = TwoNodeGraph();
  PassPipeline pipeline("test");
  pipeline.AddPass<BreakGraph>();
  absl::StatusOr<bool> r = pipeline.Run(&g);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("after pass 'break-graph'"), std::string::npos) << r.status();
}

TEST(PassPipelineTest, PassErrorsArePrefixedWithThePassName) {
  ir::Graph g = TwoNodeGraph();
  PassPipeline pipeline("test");
  pipeline.AddPass<DeadCodeElimination>();
  pipeline.AddPass<FailingPass>();
  absl::StatusOr<bool> r = pipeline.Run(&g);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "pass 'failing': boom");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PassPipelineTest, FixpointRepeatsUntilNothingChanges) {
  ir::Graph g = TwoNodeGraph();
  PassPipeline pipeline("test");
  PassPipeline& fix = pipeline.AddFixpoint("fix");
  CountdownPass& countdown = fix.AddPass<CountdownPass>(3);
  absl::StatusOr<bool> r = pipeline.Run(&g);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(*r);
  EXPECT_EQ(countdown.runs, 4);  // three changing rounds and one quiet one
  EXPECT_EQ(pipeline.changed_log(),
            (std::vector<std::string>{"fix/countdown", "fix/countdown", "fix/countdown"}));
}

TEST(PassPipelineTest, FixpointThatNeverConvergesIsAnError) {
  ir::Graph g = TwoNodeGraph();
  PassPipeline pipeline("test");
  pipeline.AddFixpoint("fix", /*max_iterations=*/5).AddPass<CountdownPass>(100);
  absl::StatusOr<bool> r = pipeline.Run(&g);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("fixpoint"), std::string::npos) << r.status();
}

TEST(PassPipelineTest, UnchangedGraphReportsFalse) {
  ir::Graph g = TwoNodeGraph();
  PassPipeline pipeline("test");
  pipeline.AddPass<DeadCodeElimination>();
  testing::TinyEvaluator ev;
  pipeline.AddPass<ConstantFolding>(ev);
  absl::StatusOr<bool> r = pipeline.Run(&g);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(*r);
  EXPECT_TRUE(pipeline.changed_log().empty());
}

}  // namespace
}  // namespace onnxpipe::passes
