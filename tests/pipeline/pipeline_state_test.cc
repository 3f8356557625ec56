// PipelineExecutor::State / SetState, what checkpoints and --resume of a pipelined run rest on: the state is the
// unpartitioned trainer's (same names, dtypes, dims); setting it reaches every holder of a tied parameter, each
// with its own storage; a run that stops, hands its state to another executor and continues equals one that never
// stopped, bit for bit (dropout on, tied embedding, AdamW); bad names and shapes are refused, changing nothing.
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/pipeline/pipeline_test_util.h"

namespace onnxpipe::pipeline::testing {
namespace {

using ::testing::HasSubstr;

const ModelFixture& Gpt() {
  static std::unique_ptr<ModelFixture> f = [] {
    absl::StatusOr<std::unique_ptr<ModelFixture>> l = ModelFixture::Load("tiny_gpt");
    EXPECT_TRUE(l.ok()) << l.status();
    return std::move(*l);
  }();
  return *f;
}

RunConfig AdamWithDropout(int32_t stages, int32_t steps) {
  RunConfig c;
  c.stages = stages;
  c.microbatches = 2;
  c.steps = steps;
  c.optimizer = autodiff::OptimizerKind::kAdamW;
  c.dropout = true;
  c.lr = 1e-3;
  return c;
}

TEST(PipelineState, HoldsTheUnpartitionedTrainersStateOnceEach) {
  const ModelFixture& f = Gpt();
  const RunConfig c = AdamWithDropout(/*stages=*/3, /*steps=*/1);
  absl::StatusOr<RunResult> r = f.Pipeline(c);
  ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<train::TrainOptions> o = f.Options(c, f.batch());
  ASSERT_TRUE(o.ok()) << o.status();
  absl::StatusOr<ir::Graph> g = f.MicrobatchTrainingGraph(c);
  ASSERT_TRUE(g.ok()) << g.status();
  const std::map<std::string, ir::Tensor> state = r->executor->State();
  ASSERT_EQ(state.size(), g->state_updates().size());
  for (const ir::Graph::StateUpdate& u : g->state_updates()) {
    const ir::Value& v = g->value(u.state);
    auto it = state.find(v.name);
    ASSERT_NE(it, state.end()) << v.name;
    EXPECT_EQ(it->second.dtype(), v.constant->dtype()) << v.name;
    EXPECT_EQ(it->second.dims(), v.constant->dims()) << v.name;
  }
  // AdamW: every parameter with its two moments.
  EXPECT_EQ(state.size(), 3 * r->params.size());
  // A copy: a later step does not change it.
  const ir::Tensor before = state.at("tok_emb.weight");
  ASSERT_TRUE(r->executor->Step(f.Feeds(1, c.lr, c.dtype)).ok());
  EXPECT_TRUE(before.BitwiseEquals(state.at("tok_emb.weight")));
  EXPECT_FALSE(before.BitwiseEquals(r->executor->State().at("tok_emb.weight")));
}

// Held once: on the CPU the stages update their states where they are, with no second copy once nobody else holds
// them (the layouts keep their dims only), and a snapshot shares the stage's storage until the next step.
TEST(PipelineState, StepsUpdateTheStatesInPlaceWhenNoSnapshotIsHeld) {
  const ModelFixture& f = Gpt();
  const RunConfig c = AdamWithDropout(/*stages=*/1, /*steps=*/1);
  absl::StatusOr<RunResult> r = f.Pipeline(c);
  ASSERT_TRUE(r.ok()) << r.status();
  r->params.clear();
  const void* before = r->executor->State().at("tok_emb.weight").address();
  ASSERT_TRUE(r->executor->Step(f.Feeds(1, c.lr, c.dtype)).ok());
  EXPECT_EQ(r->executor->State().at("tok_emb.weight").address(), before);
}

TEST(PipelineState, SetStateReachesEveryHolderOfATiedParameterWithItsOwnStorage) {
  const ModelFixture& f = Gpt();
  const RunConfig c = AdamWithDropout(/*stages=*/3, /*steps=*/1);
  absl::StatusOr<RunResult> r = f.Pipeline(c);
  ASSERT_TRUE(r.ok()) << r.status();
  PipelineExecutor& ex = *r->executor;
  for (const std::string name : {"tok_emb.weight", "tok_emb.weight/adam_m"}) {
    SCOPED_TRACE(name);
    std::vector<int32_t> holders;
    for (const StageProgram& sp : ex.program().stages) {
      for (const ir::Graph::StateUpdate& u : sp.state_updates) {
        if (sp.graph.value(u.state).name == name) holders.push_back(sp.stage);
      }
    }
    ASSERT_EQ(holders, (std::vector<int32_t>{0, 2}));  // the embedding's stage and the lm head's
    ir::Tensor value = ex.State().at(name).Clone();
    for (int64_t i = 0; i < value.num_elements(); ++i) {
      value.mutable_data<double>()[i] = 0.25 * static_cast<double>(i % 7);
    }
    ASSERT_TRUE(ex.SetState(name, value).ok());
    for (int32_t s : holders) EXPECT_TRUE(ex.StageConstant(s, name)->BitwiseEquals(value)) << "stage " << s;
    const ir::Value& v0 = ex.program().stages[0].graph.value(ex.program().stages[0].graph.FindValue(name));
    const ir::Value& v2 = ex.program().stages[2].graph.value(ex.program().stages[2].graph.FindValue(name));
    EXPECT_NE(v0.constant->raw(), v2.constant->raw());
    EXPECT_NE(v0.constant->raw(), value.raw());
  }
}

TEST(PipelineState, BadNamesAndShapesAreRefusedChangingNothing) {
  const ModelFixture& f = Gpt();
  absl::StatusOr<RunResult> r = f.Pipeline(AdamWithDropout(/*stages=*/2, /*steps=*/1));
  ASSERT_TRUE(r.ok()) << r.status();
  PipelineExecutor& ex = *r->executor;
  const std::map<std::string, ir::Tensor> before = ex.State();
  const ir::Tensor emb = before.at("tok_emb.weight");
  absl::Status st = ex.SetState("no.such.weight", emb);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(st.message(), HasSubstr("'no.such.weight'"));
  st = ex.SetState("tok_emb.weight", emb.CastTo(ir::DType::kF32));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("state 'tok_emb.weight' is f64"));
  st = ex.SetState("tok_emb.weight", emb.Reshaped({emb.num_elements()}));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  const std::map<std::string, ir::Tensor> after = ex.State();
  for (const auto& [name, t] : before) EXPECT_TRUE(t.BitwiseEquals(after.at(name))) << name;
}

// Steps 0..3 in one executor against steps 0..1, State() into another executor, steps 2..3 there.
TEST(PipelineState, StoppingAndContinuingInAFreshExecutorIsBitwise) {
  const ModelFixture& f = Gpt();
  for (int32_t K : {2, 3}) {
    SCOPED_TRACE("K=" + std::to_string(K));
    const RunConfig whole = AdamWithDropout(K, /*steps=*/4);
    absl::StatusOr<RunResult> a = f.Pipeline(whole);
    ASSERT_TRUE(a.ok()) << a.status();
    absl::StatusOr<RunResult> half = f.Pipeline(AdamWithDropout(K, /*steps=*/2));
    ASSERT_TRUE(half.ok()) << half.status();
    // Another executor that ran a step of its own: SetState replaces everything it updated.
    absl::StatusOr<RunResult> b = f.Pipeline(AdamWithDropout(K, /*steps=*/1));
    ASSERT_TRUE(b.ok()) << b.status();
    for (const auto& [name, t] : half->executor->State()) ASSERT_TRUE(b->executor->SetState(name, t).ok()) << name;
    for (int64_t k = 2; k < 4; ++k) {
      absl::StatusOr<PipelineStepResult> s = b->executor->Step(f.Feeds(k, whole.lr, whole.dtype));
      ASSERT_TRUE(s.ok()) << s.status();
      EXPECT_EQ(s->loss, a->losses[k]) << "step " << k;
      EXPECT_EQ(s->grad_norm, a->grad_norms[k]) << "step " << k;
    }
    const std::map<std::string, ir::Tensor> want = a->executor->State(), got = b->executor->State();
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, t] : want) EXPECT_TRUE(got.at(name).BitwiseEquals(t)) << name;
    // Both holders of the tied embedding continued identically.
    EXPECT_TRUE(b->executor->StageConstant(K - 1, "tok_emb.weight")->BitwiseEquals(want.at("tok_emb.weight")));
  }
}

}  // namespace
}  // namespace onnxpipe::pipeline::testing
