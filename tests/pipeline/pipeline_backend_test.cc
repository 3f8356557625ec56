// The pipeline driver touches device memory only through its backend: run over the checked backend
// (buffers mprotect'ed PROT_NONE outside the backend's own calls, so any direct read or write by
// the driver faults, and ir::Tensor's host accessors abort on device tensors), every configuration
// trains bit for bit as over the CPU backend, whose kernels it runs.
#include <string>

#include "executor/backend/checked_backend.h"
#include "gtest/gtest.h"
#include "tests/pipeline/pipeline_test_util.h"

namespace onnxpipe::pipeline::testing {
namespace {

class PipelineBackend : public ::testing::TestWithParam<PipelineCase> {};

TEST_P(PipelineBackend, CheckedDeviceMemoryTrainsBitwiseAsTheCpuBackend) {
  const PipelineCase& k = GetParam();
  absl::StatusOr<std::unique_ptr<ModelFixture>> f = ModelFixture::Load(k.model);
  ASSERT_TRUE(f.ok()) << f.status();
  RunConfig c = k.Config();
  c.check_numerics = true;  // the non-finite check runs on the backend too
  c.steps = 2;
  absl::StatusOr<RunResult> cpu = (*f)->Pipeline(c);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  c.backend = backend::MakeCheckedBackend();
  absl::StatusOr<RunResult> checked = (*f)->Pipeline(c);
  ASSERT_TRUE(checked.ok()) << checked.status();
  ASSERT_EQ(checked->losses.size(), cpu->losses.size());
  for (size_t i = 0; i < cpu->losses.size(); ++i) {
    EXPECT_EQ(checked->losses[i], cpu->losses[i]) << "step " << i;
    EXPECT_EQ(checked->grad_norms[i], cpu->grad_norms[i]) << "step " << i;
  }
  ASSERT_EQ(checked->params.size(), cpu->params.size());
  for (const auto& [name, t] : cpu->params) {
    ASSERT_TRUE(checked->params.count(name)) << name;
    EXPECT_TRUE(checked->params.at(name).on_host()) << name;
    EXPECT_TRUE(checked->params.at(name).BitwiseEquals(t)) << name;
  }
  // Memory is measured the same way on both.
  for (size_t s = 0; s < cpu->steps.back().stages.size(); ++s) {
    EXPECT_EQ(checked->steps.back().stages[s].arena_bytes, cpu->steps.back().stages[s].arena_bytes) << "stage " << s;
  }
  // State moves in and out through the backend.
  const std::map<std::string, ir::Tensor> state = checked->executor->State();
  for (const auto& [name, t] : state) ASSERT_TRUE(checked->executor->SetState(name, t).ok()) << name;
}

INSTANTIATE_TEST_SUITE_P(
    Configs, PipelineBackend,
    ::testing::Values(
        PipelineCase{"tiny_gpt", 2, 2, ScheduleKind::k1F1B, RecomputePolicy::kSelective,
                     autodiff::OptimizerKind::kAdamW},
        PipelineCase{"tiny_gpt", 3, 1, ScheduleKind::kGPipe, RecomputePolicy::kFull, autodiff::OptimizerKind::kSGD},
        PipelineCase{"tiny_classifier", 1, 2, ScheduleKind::kGPipe, RecomputePolicy::kNone,
                     autodiff::OptimizerKind::kAdamW},
        PipelineCase{"tiny_bert", 2, 4, ScheduleKind::k1F1B, RecomputePolicy::kNone, autodiff::OptimizerKind::kSGD}),
    [](const ::testing::TestParamInfo<PipelineCase>& i) { return i.param.Name(); });

}  // namespace
}  // namespace onnxpipe::pipeline::testing
