// Pipelined training against the unpartitioned full-batch run (train::Trainer) on the shipped
// models. Claims, and why:
// - At a fixed micro-batch count M, every stage count K, schedule and recompute policy gives
//   BITWISE the same per-step losses, gradient norms and final weights (fp64 and fp32): the stages
//   run the same kernels on the same operands, recompute re-runs them on the same inputs with the
//   same random stream, gradients accumulate in micro-batch order 0..M-1 for both schedules, the
//   global norm is one SumSquares over all gradients in the graph's order, and a tied parameter's
//   contributions are added by the graph's own Sum node.
// - With M = 1 that run is the unpartitioned full-batch run itself: bitwise equal to train::Trainer.
// - With M > 1 the batch reductions of the gradients (dW = sum over rows) are split into M partial
//   sums: a different summation order, so equality holds to rounding — 1e-10 relative in fp64,
//   1e-5 relative in fp32 (losses to 1e-6) over three SGD steps with momentum and clipping.
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

void ExpectClose(const RunResult& got, const RunResult& want, double loss_tol, double param_tol,
                 const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t k = 0; k < want.losses.size(); ++k) {
    EXPECT_LE(std::abs(got.losses[k] - want.losses[k]), loss_tol * std::abs(want.losses[k]))
        << what << " step " << k << " loss " << got.losses[k] << " vs " << want.losses[k];
    EXPECT_LE(std::abs(got.grad_norms[k] - want.grad_norms[k]), param_tol * std::abs(want.grad_norms[k]))
        << what << " step " << k << " grad_norm";
  }
  ASSERT_EQ(got.params.size(), want.params.size()) << what;
  for (const auto& [name, t] : want.params) {
    ASSERT_TRUE(got.params.count(name)) << what << ": " << name;
    EXPECT_LE(MaxRelDiff(got.params.at(name), t), param_tol) << what << ": parameter " << name;
  }
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
  ExpectClose(*mb, *ref, 1e-12, 1e-10, "K=2 M=2");
  for (size_t k = 0; k < ref->losses.size(); ++k) {
    std::printf("step %zu: ref %.17g  K2M1 %.17g  K2M2 %.17g\n", k, ref->losses[k], two->losses[k], mb->losses[k]);
  }
}

}  // namespace
}  // namespace onnxpipe::pipeline::testing
