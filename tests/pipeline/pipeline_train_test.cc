// Pipelined training against the unpartitioned full-batch run (train::Trainer) on the shipped
// models. Claims, and why:
// - At a fixed micro-batch count M, every stage count K, schedule and recompute policy gives
//   BITWISE the same per-step losses, gradient norms and final weights (fp64 and fp32): the stages
//   run the same kernels on the same operands, recompute re-runs them on the same inputs with the
//   same random stream, gradients accumulate in micro-batch order 0..M-1 for both schedules, the
//   global norm adds one double sum of squares per gradient in the graph's order, and a tied parameter's
//   contributions are added by the graph's own Sum node.
// - With M = 1 that run is the unpartitioned full-batch run itself: bitwise equal to train::Trainer.
// - With M > 1 the batch reductions of the gradients (dW = sum over rows) are split into M partial
//   sums: a different summation order, so equality holds to rounding. Checked: per-step losses and
//   gradient norms within 1e-12 (fp64) / 1e-6 (fp32) relative, final parameters within the same
//   bound as ||w - w_ref|| / ||w_ref|| per tensor, after three SGD steps with momentum, weight decay
//   and global-norm clipping.
#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/pipeline/pipeline_test_util.h"

namespace onnxpipe::pipeline::testing {
namespace {

const ModelFixture& Fixture(const std::string& name) {
  static std::map<std::string, std::unique_ptr<ModelFixture>> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    absl::StatusOr<std::unique_ptr<ModelFixture>> f = ModelFixture::Load(name);
    EXPECT_TRUE(f.ok()) << f.status();
    it = cache.emplace(name, std::move(*f)).first;
  }
  return *it->second;
}

void ExpectBitwise(const RunResult& got, const RunResult& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t k = 0; k < want.losses.size(); ++k) {
    EXPECT_EQ(got.losses[k], want.losses[k]) << what << " step " << k << " loss";
    EXPECT_EQ(got.grad_norms[k], want.grad_norms[k]) << what << " step " << k << " grad_norm";
  }
  ASSERT_EQ(got.params.size(), want.params.size()) << what;
  for (const auto& [name, t] : want.params) {
    ASSERT_TRUE(got.params.count(name)) << what << ": " << name;
    EXPECT_TRUE(got.params.at(name).BitwiseEquals(t)) << what << ": parameter " << name << " differs by "
                                                      << MaxRelDiff(got.params.at(name), t);
  }
}

// Losses and gradient norms relative to the reference; parameters by the norm of the difference
// relative to the parameter's norm (element-wise ratios blow up on entries that are ~0).
double ExpectClose(const RunResult& got, const RunResult& want, double tol, const std::string& what) {
  double worst = 0;
  EXPECT_EQ(got.losses.size(), want.losses.size());
  for (size_t k = 0; k < want.losses.size() && k < got.losses.size(); ++k) {
    const double dl = std::abs(got.losses[k] - want.losses[k]) / std::abs(want.losses[k]);
    const double dn = std::abs(got.grad_norms[k] - want.grad_norms[k]) / std::abs(want.grad_norms[k]);
    EXPECT_LE(dl, tol) << what << " step " << k << " loss " << got.losses[k] << " vs " << want.losses[k];
    EXPECT_LE(dn, tol) << what << " step " << k << " grad_norm";
    worst = std::max({worst, dl, dn});
  }
  EXPECT_EQ(got.params.size(), want.params.size()) << what;
  for (const auto& [name, t] : want.params) {
    if (!got.params.count(name)) {
      ADD_FAILURE() << what << ": no parameter " << name;
      continue;
    }
    const double d = NormRelDiff(got.params.at(name), t);
    EXPECT_LE(d, tol) << what << ": parameter " << name;
    worst = std::max(worst, d);
  }
  return worst;
}

TEST(PipelineTrain, SmokeGptTwoStagesTwoMicrobatches) {
  const ModelFixture& f = Fixture("tiny_gpt");
  RunConfig c;
  absl::StatusOr<RunResult> ref = f.Reference(c);
  ASSERT_TRUE(ref.ok()) << ref.status();
  absl::StatusOr<RunResult> one = f.Pipeline(c);
  ASSERT_TRUE(one.ok()) << one.status();
  ExpectBitwise(*one, *ref, "K=1 M=1");
  c.stages = 2;
  absl::StatusOr<RunResult> two = f.Pipeline(c);
  ASSERT_TRUE(two.ok()) << two.status();
  ExpectBitwise(*two, *ref, "K=2 M=1");
  c.microbatches = 2;
  absl::StatusOr<RunResult> mb = f.Pipeline(c);
  ASSERT_TRUE(mb.ok()) << mb.status();
  ExpectClose(*mb, *ref, 1e-12, "K=2 M=2");
  for (size_t k = 0; k < ref->losses.size(); ++k) {
    std::printf("step %zu: ref %.17g  K2M1 %.17g  K2M2 %.17g\n", k, ref->losses[k], two->losses[k], mb->losses[k]);
  }
}

}  // namespace
}  // namespace onnxpipe::pipeline::testing

namespace onnxpipe::pipeline::testing {
namespace {

struct MatrixCase {
  std::string model;
  ir::DType dtype;
};

class PipelineMatrix : public ::testing::TestWithParam<MatrixCase> {};

// Every K in {1,2,3,4}, M in {1,2,4}, schedule and recompute policy (none, full, selective; auto
// comes from a partition plan, see PipelinePlan) against the full-batch run.
// Over a comm with NCCL's semantics (a send waits for its receive; sends held until the stage's next receive or the end
// of its action) every schedule runs to the end and trains bitwise as over the buffered comm: the transfers post in
// the order ProveTransferOrder proved. A deadlock would fail at the receive timeout instead of hanging.
TEST(PipelineTrain, UnderNcclSemanticsEveryScheduleTrainsAsOverTheBufferedComm) {
  for (const std::string model : {"tiny_gpt", "tiny_bert"}) {
    const ModelFixture& f = Fixture(model);
    RunConfig c;
    c.dtype = ir::DType::kF32;
    c.microbatches = 4;
    c.recv_timeout_s = 30;
    absl::StatusOr<ir::Graph> g = f.MicrobatchTrainingGraph(c);
    ASSERT_TRUE(g.ok()) << g.status();
    for (int32_t K : {2, 3, 4}) {
      for (ScheduleKind sched : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
        for (RecomputePolicy rp : {RecomputePolicy::kNone, RecomputePolicy::kFull}) {
          c.stages = K;
          c.schedule = sched;
          c.recompute = rp;
          c.nccl_semantics = false;
          absl::StatusOr<RunResult> buffered = f.Pipeline(c, &*g);
          ASSERT_TRUE(buffered.ok()) << Describe(c) << ": " << buffered.status();
          c.nccl_semantics = true;
          absl::StatusOr<RunResult> nccl = f.Pipeline(c, &*g);
          ASSERT_TRUE(nccl.ok()) << model << " " << Describe(c) << " under NCCL's semantics: " << nccl.status();
          ExpectBitwise(*nccl, *buffered, model + " " + Describe(c) + " under NCCL's semantics");
        }
      }
    }
  }
}

TEST_P(PipelineMatrix, EveryConfigurationMatchesTheUnpartitionedRun) {
  const MatrixCase& mc = GetParam();
  const ModelFixture& f = Fixture(mc.model);
  RunConfig c0;
  c0.dtype = mc.dtype;
  absl::StatusOr<RunResult> ref = f.Reference(c0);
  ASSERT_TRUE(ref.ok()) << ref.status();
  const bool fp64 = mc.dtype == ir::DType::kF64;
  for (int32_t M : {1, 2, 4}) {
    RunConfig cm = c0;
    cm.microbatches = M;
    absl::StatusOr<ir::Graph> g = f.MicrobatchTrainingGraph(cm);
    ASSERT_TRUE(g.ok()) << g.status();
    std::optional<RunResult> base;
    for (int32_t K : {1, 2, 3, 4}) {
      for (ScheduleKind sched : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
        for (RecomputePolicy rp : {RecomputePolicy::kNone, RecomputePolicy::kFull, RecomputePolicy::kSelective}) {
          RunConfig c = cm;
          c.stages = K;
          c.schedule = sched;
          c.recompute = rp;
          absl::StatusOr<RunResult> r = f.Pipeline(c, &*g);
          ASSERT_TRUE(r.ok()) << Describe(c) << ": " << r.status();
          const PipelineProgram& p = r->executor->program();
          ASSERT_EQ(p.num_stages, K);
          int32_t clones = 0;
          for (const StageProgram& sp : p.stages) clones += static_cast<int32_t>(sp.recompute_clones.size());
          if (rp == RecomputePolicy::kNone) {
            EXPECT_EQ(clones, 0) << Describe(c);
          } else {
            EXPECT_GT(clones, 0) << Describe(c);
          }
          if (!base) {
            base = std::move(*r);
            if (M == 1) {
              ExpectBitwise(*base, *ref, Describe(c) + " vs the unpartitioned run");
            } else {
              const double worst = ExpectClose(*base, *ref, fp64 ? 1e-12 : 1e-6, Describe(c) + " vs the unpartitioned run");
              std::printf("%s M=%d: largest relative difference to the full-batch run %.3g\n", mc.model.c_str(), M, worst);
            }
            continue;
          }
          ExpectBitwise(*r, *base, Describe(c) + " vs K=1 gpipe none at the same M");
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, PipelineMatrix,
                         ::testing::Values(MatrixCase{"tiny_gpt", ir::DType::kF64}, MatrixCase{"tiny_gpt", ir::DType::kF32},
                                           MatrixCase{"tiny_bert", ir::DType::kF64}, MatrixCase{"tiny_bert", ir::DType::kF32},
                                           MatrixCase{"tiny_classifier", ir::DType::kF64},
                                           MatrixCase{"tiny_classifier", ir::DType::kF32}),
                         [](const ::testing::TestParamInfo<MatrixCase>& i) {
                           return i.param.model + "_" + std::string(ir::DTypeName(i.param.dtype));
                         });

}  // namespace
}  // namespace onnxpipe::pipeline::testing

namespace onnxpipe::pipeline::testing {
namespace {

// AdamW: the same bitwise claims. Against the full batch with M > 1 only the losses are compared:
// AdamW divides by sqrt(v), so a gradient that is zero in exact arithmetic (the attention key bias:
// softmax ignores it) and only rounding noise in floating point moves by about lr either way, and
// the noise depends on the summation order.
TEST(PipelineTrain, AdamWIsBitwiseAcrossStagesAtFixedMicrobatches) {
  const ModelFixture& f = Fixture("tiny_gpt");
  for (ir::DType dtype : {ir::DType::kF64, ir::DType::kF32}) {
    RunConfig c;
    c.dtype = dtype;
    c.optimizer = autodiff::OptimizerKind::kAdamW;
    c.lr = 1e-3;
    absl::StatusOr<RunResult> ref = f.Reference(c);
    ASSERT_TRUE(ref.ok()) << ref.status();
    for (int32_t M : {1, 2}) {
      c.microbatches = M;
      std::optional<RunResult> base;
      for (int32_t K : {1, 2, 4}) {
        c.stages = K;
        c.recompute = K == 4 ? RecomputePolicy::kSelective : RecomputePolicy::kNone;
        absl::StatusOr<RunResult> r = f.Pipeline(c);
        ASSERT_TRUE(r.ok()) << r.status();
        if (!base) {
          base = std::move(*r);
          if (M == 1) ExpectBitwise(*base, *ref, Describe(c) + " adamw vs the unpartitioned run");
          for (size_t k = 0; M > 1 && k < ref->losses.size(); ++k) {
            EXPECT_LE(std::abs(base->losses[k] - ref->losses[k]), 1e-6 * std::abs(ref->losses[k])) << Describe(c);
          }
          continue;
        }
        ExpectBitwise(*r, *base, Describe(c) + " adamw vs K=1 at the same M");
      }
    }
  }
}

// Dropout on: every micro-batch draws its rows of the full batch's masks (EvalContext row_offset),
// so with M > 1 the run still equals the unpartitioned full-batch run (to the rounding of the split
// gradient sums, as without dropout: 1e-12 relative in fp64, whereas masks drawn per micro-batch
// differ from it by O(1)), and at each M every K, schedule and recompute policy is bitwise the
// one-stage run.
TEST(PipelineTrain, DropoutMicrobatchesEqualTheFullBatchRun) {
  for (const char* model : {"tiny_gpt", "tiny_bert"}) {
    const ModelFixture& f = Fixture(model);
    RunConfig c0;
    c0.dropout = true;
    c0.steps = 2;
    absl::StatusOr<RunResult> ref = f.Reference(c0);
    ASSERT_TRUE(ref.ok()) << ref.status();
    RunConfig off = c0;
    off.dropout = false;
    absl::StatusOr<RunResult> ref_off = f.Reference(off);
    ASSERT_TRUE(ref_off.ok()) << ref_off.status();
    ASSERT_GT(std::abs(ref_off->losses[0] - ref->losses[0]), 1e-6 * std::abs(ref->losses[0]))
        << model << ": dropout must change the loss for this test to mean anything";
    for (int32_t M : {1, 2, 4}) {
      RunConfig c = c0;
      c.microbatches = M;
      absl::StatusOr<ir::Graph> g = f.MicrobatchTrainingGraph(c);
      ASSERT_TRUE(g.ok()) << g.status();
      absl::StatusOr<RunResult> base = f.Pipeline(c, &*g);
      ASSERT_TRUE(base.ok()) << base.status();
      ExpectClose(*base, *ref, 1e-12, std::string(model) + " " + Describe(c) + " vs the full batch");
      if (M == 1) ExpectBitwise(*base, *ref, std::string(model) + " M=1 vs the full batch");
      for (int32_t K : {2, 3, 4}) {
        for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
          for (RecomputePolicy rp : {RecomputePolicy::kNone, RecomputePolicy::kFull, RecomputePolicy::kSelective}) {
            c.stages = K;
            c.schedule = kind;
            c.recompute = rp;
            absl::StatusOr<RunResult> r = f.Pipeline(c, &*g);
            ASSERT_TRUE(r.ok()) << Describe(c) << ": " << r.status();
            ExpectBitwise(*r, *base, std::string(model) + " " + Describe(c));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace onnxpipe::pipeline::testing
