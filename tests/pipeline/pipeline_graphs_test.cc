// Graphs (ExecutorOptions::graphs) over the recording backend (recording_backend.h: a CUDA
// graph's semantics over the CPU kernels): replaying the recorded segments trains bit for bit as
// the eager CPU run, so nothing a step changes (the dropout offset, feeds, losses, accumulation,
// the states' storage) is baked into a graph. The recording backend itself is checked first.
#include <atomic>
#include <cmath>
#include <set>
#include <string>

#include "executor/backend/recording_backend.h"
#include "gtest/gtest.h"
#include "tests/pipeline/pipeline_test_util.h"

namespace onnxpipe::pipeline::testing {
namespace {

// A Dropout node over (4, 8) f32, its planned outputs in `slots`.
struct DropoutFixture {
  ir::Node node;
  ir::Tensor x = ir::Tensor(ir::DType::kF32, {4, 8});
  ir::Tensor y = ir::Tensor(ir::DType::kF32, {4, 8});
  DropoutFixture() {
    node.op = ir::OpKind::kDropout;
    node.name = "drop";
    node.attrs.Set("ratio", 0.5);
    node.inputs = {0};
    node.outputs = {1};
    for (int64_t i = 0; i < x.num_elements(); ++i) x.mutable_data<float>()[i] = 1.0f + static_cast<float>(i);
  }
};

class FixedSlot : public ir::OutputAllocator {
 public:
  explicit FixedSlot(ir::Tensor t) : t_(std::move(t)) {}
  absl::StatusOr<ir::Tensor> Allocate(const ir::Node&, int, ir::DType, const std::vector<int64_t>&) override {
    return t_;
  }
  bool SharesInputBuffer(const ir::Node&, int) const override { return false; }
  absl::StatusOr<void*> Workspace(const ir::Node&, int64_t) override { return nullptr; }

 private:
  ir::Tensor t_;
};

std::vector<float> Values(const ir::Tensor& t) { return {t.data<float>(), t.data<float>() + t.num_elements()}; }

TEST(RecordingBackend, ReplaysTheRecordedCallWithItsBuffersAndReadsTheOffsetFromMemory) {
  auto be = backend::MakeRecordingBackend(backend::MakeCpuBackend());
  std::unique_ptr<backend::Stream> s = be->CreateStream();
  DropoutFixture f;
  FixedSlot slot(f.y);
  int64_t step = 3;
  backend::ExecContext ctx{true, 11, /*offset=*/3, 0, 4, s.get(), reinterpret_cast<const uint64_t*>(&step)};
  ASSERT_TRUE(s->BeginCapture().ok());
  ASSERT_TRUE(be->Run(f.node, {f.x}, ctx, &slot).ok());
  absl::StatusOr<std::unique_ptr<backend::Graph>> g = s->EndCapture();
  ASSERT_TRUE(g.ok()) << g.status();
  const std::vector<float> at3 = Values(f.y);  // the recording ran the call once

  // The eager CPU kernel at offsets 3 and 4, as references.
  auto cpu = backend::MakeCpuBackend();
  backend::ExecContext eager{true, 11, 3, 0, 4, nullptr};
  absl::StatusOr<std::vector<ir::Tensor>> ref3 = cpu->Run(f.node, {f.x}, eager, nullptr);
  eager.offset = 4;
  absl::StatusOr<std::vector<ir::Tensor>> ref4 = cpu->Run(f.node, {f.x}, eager, nullptr);
  ASSERT_TRUE(ref3.ok() && ref4.ok());
  EXPECT_EQ(at3, Values((*ref3)[0]));
  ASSERT_NE(Values((*ref3)[0]), Values((*ref4)[0]));  // the offset matters

  // A replay writes the same slot, with the step read from memory when it runs.
  std::fill(f.y.mutable_data<float>(), f.y.mutable_data<float>() + f.y.num_elements(), 0.f);
  step = 4;
  ASSERT_TRUE((*g)->Launch(s.get()).ok());
  EXPECT_EQ(Values(f.y), Values((*ref4)[0]));
  // ... and the input buffer's current contents.
  for (int64_t i = 0; i < f.x.num_elements(); ++i) f.x.mutable_data<float>()[i] *= 2;
  ASSERT_TRUE((*g)->Launch(s.get()).ok());
  for (int64_t i = 0; i < f.y.num_elements(); ++i) EXPECT_EQ(f.y.data<float>()[i], 2 * (*ref4)[0].data<float>()[i]);
}

TEST(RecordingBackend, RefusesWhatACudaCaptureRefusesAndAFailedCaptureRunsNothing) {
  auto be = backend::MakeRecordingBackend(backend::MakeCpuBackend(), {ir::OpKind::kGather});
  std::unique_ptr<backend::Stream> s = be->CreateStream();
  DropoutFixture f;
  const ir::Tensor t(ir::DType::kF32, {2});
  ASSERT_TRUE(s->BeginCapture().ok());
  ASSERT_TRUE(be->Copy(f.x, f.y, s.get()).ok());  // recorded: undone when the capture fails
  EXPECT_FALSE(be->ToHost(t, s.get()).ok());
  EXPECT_FALSE(be->FromHost(t, t, s.get()).ok());
  EXPECT_FALSE(be->Zeros(ir::DType::kF32, {2}, s.get()).ok());
  EXPECT_FALSE(s->Synchronize().ok());
  EXPECT_FALSE(be->Run(f.node, {f.x}, backend::ExecContext{true, 1, 0, 0, 4, s.get()}, nullptr).ok());
  EXPECT_FALSE(s->BeginCapture().ok());
  absl::StatusOr<std::unique_ptr<backend::Graph>> failed = s->EndCapture();
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(std::string(failed.status().message()).find("invalidated"), std::string::npos) << failed.status();
  EXPECT_EQ(Values(f.y), std::vector<float>(f.y.num_elements(), 0.f));  // the copy did not happen
  EXPECT_FALSE(s->EndCapture().ok());
  EXPECT_TRUE(be->ToHost(t, s.get()).ok());  // capture over
  // A capture of legal calls succeeds and has run them once by then.
  ASSERT_TRUE(s->BeginCapture().ok());
  ASSERT_TRUE(be->Copy(f.x, f.y, s.get()).ok());
  ASSERT_TRUE(s->EndCapture().ok());
  EXPECT_EQ(Values(f.y), Values(f.x));
  ir::Node gather;
  gather.op = ir::OpKind::kGather;
  EXPECT_FALSE(be->Capturable(gather));
  EXPECT_TRUE(be->Capturable(f.node));
}

struct Case {
  PipelineCase run;
  std::set<ir::OpKind> not_capturable;
};

class PipelineGraphs : public ::testing::TestWithParam<Case> {};

void ExpectSameTraining(const RunResult& got, const RunResult& want) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_EQ(got.losses[i], want.losses[i]) << "step " << i;
    EXPECT_EQ(got.grad_norms[i], want.grad_norms[i]) << "step " << i;
  }
  ASSERT_EQ(got.params.size(), want.params.size());
  for (const auto& [name, t] : want.params) {
    ASSERT_TRUE(got.params.count(name)) << name;
    EXPECT_TRUE(got.params.at(name).BitwiseEquals(t)) << name;
  }
}

TEST_P(PipelineGraphs, ReplayedStepsTrainBitwiseAsEagerOnes) {
  const Case& k = GetParam();
  absl::StatusOr<std::unique_ptr<ModelFixture>> f = ModelFixture::Load(k.run.model);
  ASSERT_TRUE(f.ok()) << f.status();
  RunConfig c = k.run.Config();  // dropout on: the masks follow the step, a baked offset would repeat them
  c.steps = 4;                   // eager, recorded, two replays
  absl::StatusOr<ir::Graph> g = (*f)->MicrobatchTrainingGraph(c);
  ASSERT_TRUE(g.ok()) << g.status();
  absl::StatusOr<RunResult> eager = (*f)->Pipeline(c, &*g);
  ASSERT_TRUE(eager.ok()) << eager.status();
  c.graphs = true;
  c.backend = backend::MakeRecordingBackend(backend::MakeCpuBackend(), k.not_capturable);
  absl::StatusOr<RunResult> graphs = (*f)->Pipeline(c, &*g);
  ASSERT_TRUE(graphs.ok()) << graphs.status();
  ExpectSameTraining(*graphs, *eager);

  // The replays did replay: every micro-batch node of the last step, less the ones the backend
  // cannot capture, and (one stage: no receives) every optimizer node; none in the first two steps.
  for (int32_t s = 0; s < k.run.stages; ++s) {
    const StageProgram& sp = graphs->executor->program().stages[s];
    int64_t capturable = 0, post = 0;
    for (const std::vector<ir::NodeId>* list : {&sp.forward, &sp.backward})
      for (ir::NodeId id : *list) capturable += !k.not_capturable.count(sp.graph.node(id).op);
    for (ir::NodeId id : sp.post) post += !k.not_capturable.count(sp.graph.node(id).op);
    EXPECT_EQ(graphs->steps[0].stages[s].replayed_nodes, 0) << "stage " << s;
    EXPECT_EQ(graphs->steps[1].stages[s].replayed_nodes, 0) << "stage " << s;
    const int64_t replayed = graphs->steps[3].stages[s].replayed_nodes;
    if (k.run.stages == 1) {
      EXPECT_EQ(replayed, capturable * k.run.microbatches + post);
    } else {
      EXPECT_GE(replayed, capturable * k.run.microbatches) << "stage " << s;
    }
    EXPECT_GT(graphs->steps[3].stages[s].graph_launches, 0) << "stage " << s;
    // What the arena measured is the same as when the kernels allocated.
    EXPECT_EQ(graphs->steps[3].stages[s].arena_bytes, eager->steps[3].stages[s].arena_bytes) << "stage " << s;
    EXPECT_EQ(graphs->steps[3].stages[s].workspace_bytes, eager->steps[3].stages[s].workspace_bytes) << "stage " << s;
    EXPECT_EQ(graphs->steps[3].stages[s].optimizer_scratch_bytes, eager->steps[3].stages[s].optimizer_scratch_bytes)
        << "stage " << s;
  }

  // States set from outside move the parameters' storage: the stages record again, and training
  // goes on as the eager run's, with a learning rate that changes every step (read by replays).
  const std::map<std::string, ir::Tensor> set = eager->executor->Parameters();
  for (RunResult* r : {&*eager, &*graphs}) {
    for (const auto& [name, t] : set) ASSERT_TRUE(r->executor->SetState(name, t).ok()) << name;
    for (int32_t step = 4; step < 7; ++step) {
      absl::StatusOr<PipelineStepResult> st = r->executor->Step((*f)->Feeds(step, c.lr * (1 + 0.25 * step), c.dtype));
      ASSERT_TRUE(st.ok()) << st.status();
      r->losses.push_back(st->loss);
      r->grad_norms.push_back(st->grad_norm);
      r->steps.push_back(*std::move(st));
    }
    r->params = r->executor->Parameters();
  }
  ExpectSameTraining(*graphs, *eager);
  EXPECT_EQ(graphs->steps[4].stages[0].replayed_nodes, 0);  // recorded again
  EXPECT_GT(graphs->steps[5].stages[0].replayed_nodes, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, PipelineGraphs,
    ::testing::Values(Case{{"tiny_classifier", 1, 2, ScheduleKind::kGPipe, RecomputePolicy::kNone,
                            autodiff::OptimizerKind::kAdamW},
                           {}},
                      Case{{"tiny_gpt", 2, 2, ScheduleKind::k1F1B, RecomputePolicy::kSelective,
                            autodiff::OptimizerKind::kAdamW},
                           {ir::OpKind::kGather}},
                      Case{{"tiny_gpt", 3, 1, ScheduleKind::kGPipe, RecomputePolicy::kFull,
                            autodiff::OptimizerKind::kSGD},
                           {}},
                      Case{{"tiny_bert", 2, 4, ScheduleKind::k1F1B, RecomputePolicy::kNone,
                            autodiff::OptimizerKind::kSGD},
                           {ir::OpKind::kGather, ir::OpKind::kSoftmax}}),
    [](const ::testing::TestParamInfo<Case>& i) {
      return i.param.run.Name() + "_" + std::to_string(i.param.not_capturable.size()) + "_uncapturable_ops";
    });

// Kernels that claim to be capturable and are not (the recording backend refuses them while
// recording), or that fail a check of their own while recording (the capture stays valid, as with
// a GEMM first seen under capture): their recordings are dropped having run nothing (not even the
// nodes recorded before the failure, such as a gradient accumulation), their nodes run eagerly
// from then on, and training stays bitwise the eager run's. LayerNorm's segments are forward and
// backward ones; an AdamWUpdate's failure sends the optimizer phase back to eager.
TEST(PipelineGraphsFallback, FailedRecordingsRunEagerly) {
  absl::StatusOr<std::unique_ptr<ModelFixture>> f = ModelFixture::Load("tiny_gpt");
  ASSERT_TRUE(f.ok()) << f.status();
  RunConfig c =
      PipelineCase{"tiny_gpt", 2, 2, ScheduleKind::k1F1B, RecomputePolicy::kSelective, autodiff::OptimizerKind::kAdamW}
          .Config();
  c.steps = 4;
  absl::StatusOr<ir::Graph> g = (*f)->MicrobatchTrainingGraph(c);
  ASSERT_TRUE(g.ok()) << g.status();
  absl::StatusOr<RunResult> eager = (*f)->Pipeline(c, &*g);
  ASSERT_TRUE(eager.ok()) << eager.status();
  struct Failure {
    ir::OpKind op;
    bool invalidates;  // the capture (a refused call) or only the kernel (its own check)
  };
  for (const Failure& k : {Failure{ir::OpKind::kLayerNorm, true}, Failure{ir::OpKind::kAdamWUpdate, true},
                           Failure{ir::OpKind::kLayerNormGrad, false}, Failure{ir::OpKind::kAdamWUpdate, false}}) {
    const ir::OpKind refused = k.op;
    SCOPED_TRACE(k.invalidates ? "invalidating the capture" : "leaving the capture valid");
    c.graphs = true;
    c.backend = k.invalidates ? backend::MakeRecordingBackend(backend::MakeCpuBackend(), {}, {k.op})
                              : backend::MakeRecordingBackend(backend::MakeCpuBackend(), {}, {}, {k.op});
    absl::StatusOr<RunResult> graphs = (*f)->Pipeline(c, &*g);
    ASSERT_TRUE(graphs.ok()) << ir::OpName(refused) << ": " << graphs.status();
    ExpectSameTraining(*graphs, *eager);
    int32_t failed = 0;
    for (int32_t s = 0; s < c.stages; ++s) {
      failed += graphs->steps[1].stages[s].failed_recordings;
      EXPECT_EQ(graphs->steps[3].stages[s].failed_recordings, 0) << ir::OpName(refused);
      EXPECT_GT(graphs->steps[3].stages[s].replayed_nodes, 0) << ir::OpName(refused);
    }
    EXPECT_GT(failed, 0) << ir::OpName(refused);
  }
}

// Counts Allocate calls over the CPU backend.
class CountingBackend : public backend::Backend {
 public:
  std::string name() const override { return cpu_->name(); }
  ir::Placement placement() const override { return cpu_->placement(); }
  absl::StatusOr<std::shared_ptr<uint8_t>> Allocate(int64_t bytes) const override {
    ++allocations;
    return cpu_->Allocate(bytes);
  }
  absl::Status Fill(const ir::Tensor& dst, uint8_t byte, backend::Stream* s) const override {
    return cpu_->Fill(dst, byte, s);
  }
  absl::Status Copy(const ir::Tensor& src, const ir::Tensor& dst, backend::Stream* s) const override {
    return cpu_->Copy(src, dst, s);
  }
  absl::Status FromHost(const ir::Tensor& host, const ir::Tensor& dst, backend::Stream* s) const override {
    return cpu_->FromHost(host, dst, s);
  }
  absl::StatusOr<ir::Tensor> ToHost(const ir::Tensor& src, backend::Stream* s) const override {
    return cpu_->ToHost(src, s);
  }
  absl::StatusOr<std::vector<ir::Tensor>> Run(const ir::Node& node, const std::vector<ir::Tensor>& inputs,
                                              const backend::ExecContext& ctx,
                                              ir::OutputAllocator* outputs) const override {
    return cpu_->Run(node, inputs, ctx, outputs);
  }
  int64_t WorkspaceBytes(const ir::Graph& g, const ir::Node& node) const override {
    return cpu_->WorkspaceBytes(g, node);
  }
  absl::Status Accumulate(const ir::Tensor& acc, const ir::Tensor& x, backend::Stream* s) const override {
    return cpu_->Accumulate(acc, x, s);
  }
  absl::StatusOr<bool> AllFinite(const ir::Tensor& t, backend::Stream* s) const override {
    return cpu_->AllFinite(t, s);
  }
  std::unique_ptr<backend::Stream> CreateStream() const override { return cpu_->CreateStream(); }

  mutable std::atomic<int64_t> allocations{0};

 private:
  std::shared_ptr<const backend::Backend> cpu_ = backend::MakeCpuBackend();
};

// What a graph needs and what cudaMalloc/cudaFree in the loop would cost: a stage allocates nothing
// after its first step (step inputs, optimizer outputs and norms in buffers of its own, sends staged
// in the comm's kept buffers, a tied weight's gradient summed in one too), one stage or two.
TEST(PipelineSteps, AllocateNothingAfterTheFirst) {
  for (const PipelineCase& k :
       {PipelineCase{"tiny_gpt", 1, 2, ScheduleKind::k1F1B, RecomputePolicy::kNone, autodiff::OptimizerKind::kAdamW},
        PipelineCase{"tiny_classifier", 2, 2, ScheduleKind::k1F1B, RecomputePolicy::kSelective,
                     autodiff::OptimizerKind::kAdamW},
        PipelineCase{"tiny_gpt", 2, 2, ScheduleKind::kGPipe, RecomputePolicy::kNone, autodiff::OptimizerKind::kSGD}}) {
    absl::StatusOr<std::unique_ptr<ModelFixture>> f = ModelFixture::Load(k.model);
    ASSERT_TRUE(f.ok()) << f.status();
    RunConfig c = k.Config();
    c.steps = 1;
    auto be = std::make_shared<CountingBackend>();
    c.backend = be;
    absl::StatusOr<RunResult> r = (*f)->Pipeline(c);
    ASSERT_TRUE(r.ok()) << r.status();
    const int64_t after_first = be->allocations;
    EXPECT_GT(after_first, 0);
    for (int32_t step = 1; step < 6; ++step) {
      absl::StatusOr<PipelineStepResult> st = r->executor->Step((*f)->Feeds(step, c.lr, c.dtype));
      ASSERT_TRUE(st.ok()) << st.status();
      EXPECT_TRUE(std::isfinite(st->grad_norm));
    }
    // One stage: nothing at all. Two: only the staging pool may still grow, when the threads' timing
    // puts more messages in flight than before (the optimizer phase's scalars, sent all at once, as much
    // as the micro-batches' tensors); never a buffer per send (that would be 5 steps' worth of sends).
    int64_t sends = 0;
    for (const StageProgram& sp : r->executor->program().stages) {
      for (const partitioner::ValueLists* l : {&sp.send_forward, &sp.send_backward})
        for (const auto& [peer, vs] : *l) sends += static_cast<int64_t>(vs.size()) * k.microbatches;
      for (const auto& [peer, vs] : sp.send_post) sends += static_cast<int64_t>(vs.size());
    }
    if (k.stages == 1) {
      EXPECT_EQ(be->allocations, after_first) << k.Name();
    } else {
      EXPECT_GT(sends, 0);
      EXPECT_LE(be->allocations - after_first, sends) << k.Name() << ": " << sends << " sends a step";
    }
  }
}

TEST(PipelineGraphsOptions, RefuseCheckNumericsAndBackendsWithoutGraphs) {
  absl::StatusOr<std::unique_ptr<ModelFixture>> f = ModelFixture::Load("tiny_classifier");
  ASSERT_TRUE(f.ok()) << f.status();
  RunConfig c;
  c.graphs = true;
  c.check_numerics = true;
  c.backend = backend::MakeRecordingBackend(backend::MakeCpuBackend());
  absl::StatusOr<RunResult> r = (*f)->Pipeline(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("--check-numerics"), std::string::npos) << r.status();
  c.check_numerics = false;
  c.backend = backend::MakeCpuBackend();
  r = (*f)->Pipeline(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("need a backend that records them"), std::string::npos)
      << r.status();
}

}  // namespace
}  // namespace onnxpipe::pipeline::testing
