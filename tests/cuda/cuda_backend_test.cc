// The CUDA backend against the backend contract and the CPU backend: memory calls round-trip
// exactly, Gelu runs on the device within fp32 rounding of the CPU kernel, ops without a CUDA
// kernel fall back to the host and are counted, and a pipeline over the GPU trains as over the CPU
// (bit for bit in fp64, where every arithmetic op runs the CPU's kernel; within 1e-5 in fp32, where
// every op but attention runs on the device).
#include "executor/cuda/cuda_backend.h"

#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "executor/cuda/cuda_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/pipeline/pipeline_test_util.h"

namespace onnxpipe::cuda {
namespace {

using ::testing::HasSubstr;

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    absl::StatusOr<std::shared_ptr<CudaBackend>> be = CudaBackend::Create(0);
    ASSERT_TRUE(be.ok()) << be.status();
    be_ = *be;
  }
  std::shared_ptr<CudaBackend> be_;
};

TEST_F(CudaBackendTest, MemoryCallsRoundTripExactly) {
  const ir::Tensor host = ir::Tensor::FromVector<double>({5}, {1, -2, 3.25, 1e300, -0.0});
  absl::StatusOr<ir::Tensor> d = be_->Upload(host);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->on_host());
  absl::StatusOr<ir::Tensor> z = be_->Zeros(ir::DType::kF64, {5});
  ASSERT_TRUE(z.ok());
  ASSERT_TRUE(be_->Copy(*d, *z).ok());
  ASSERT_TRUE(be_->Accumulate(*z, *d).ok());
  absl::StatusOr<ir::Tensor> back = be_->ToHost(*z);
  ASSERT_TRUE(back.ok());
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(back->data<double>()[i], 2 * host.data<double>()[i]);
  EXPECT_TRUE(*be_->AllFinite(*d));
  absl::StatusOr<ir::Tensor> nan = be_->Upload(ir::Tensor::FromVector<float>({3}, {0, NAN, 1}));
  EXPECT_FALSE(*be_->AllFinite(*nan));
  ASSERT_TRUE(be_->Fill(*z, 0).ok());
  EXPECT_TRUE(be_->ToHost(*z)->BitwiseEquals(ir::Tensor(ir::DType::kF64, {5})));
  EXPECT_THAT(be_->Copy(host, *z).message(), HasSubstr("host"));
}

TEST_F(CudaBackendTest, GeluAndCumSumRunOnTheDeviceAndOtherOpsFallBackToTheHost) {
  ir::Graph g;
  const ir::ValueId x = g.AddValue("x", ir::DType::kF32, {ir::Dim(1000)});
  const ir::ValueId y = g.AddValue("y", ir::DType::kF32, {ir::Dim(1000)});
  const ir::ValueId z = g.AddValue("z", ir::DType::kF32, {ir::Dim(1000)});
  const ir::NodeId gelu = g.AddNode(ir::OpKind::kGelu, "gelu", {x}, {y});
  const ir::NodeId cumsum = g.AddNode(ir::OpKind::kCumSum, "cumsum", {y}, {z});
  std::vector<float> v(1000);
  for (int i = 0; i < 1000; ++i) v[i] = -5 + 0.01f * i;
  const ir::Tensor host = ir::Tensor::FromVector<float>({1000}, v);
  std::shared_ptr<const backend::Backend> cpu = backend::MakeCpuBackend();
  absl::StatusOr<std::vector<ir::Tensor>> want = cpu->Run(g.node(gelu), {host}, {});
  ASSERT_TRUE(want.ok());
  absl::StatusOr<ir::Tensor> d = be_->Upload(host);
  absl::StatusOr<std::vector<ir::Tensor>> got = be_->Run(g.node(gelu), {*d}, {});
  ASSERT_TRUE(got.ok()) << got.status();
  absl::StatusOr<std::vector<ir::Tensor>> got_sum = be_->Run(g.node(cumsum), {(*got)[0]}, {});
  ASSERT_TRUE(got_sum.ok()) << got_sum.status();
  EXPECT_FALSE((*got_sum)[0].on_host());
  absl::StatusOr<ir::Tensor> gh = be_->ToHost((*got)[0]);
  absl::StatusOr<ir::Tensor> eh = be_->ToHost((*got_sum)[0]);
  double running = 0;
  for (int i = 0; i < 1000; ++i) {
    EXPECT_NEAR(gh->data<float>()[i], (*want)[0].data<float>()[i], 2e-6) << i;
    running += gh->data<float>()[i];
    EXPECT_NEAR(eh->data<float>()[i], running, 1e-4 * (1 + std::abs(running))) << i;
  }
  EXPECT_EQ(be_->HostFallbacks().count("Gelu"), 0u);
  EXPECT_EQ(be_->HostFallbacks().count("CumSum"), 0u);
  // No CUDA CumSum for f64: it runs on the host and its result comes back on the device.
  const ir::ValueId a = g.AddValue("a", ir::DType::kF64, {ir::Dim(4)});
  const ir::ValueId b = g.AddValue("b", ir::DType::kF64, {ir::Dim(4)});
  const ir::NodeId cumsum64 = g.AddNode(ir::OpKind::kCumSum, "cumsum64", {a}, {b});
  absl::StatusOr<ir::Tensor> d64 = be_->Upload(ir::Tensor::FromVector<double>({4}, {1, 2, 3, 4}));
  ASSERT_TRUE(d64.ok());
  absl::StatusOr<std::vector<ir::Tensor>> got64 = be_->Run(g.node(cumsum64), {*d64}, {});
  ASSERT_TRUE(got64.ok()) << got64.status();
  EXPECT_FALSE((*got64)[0].on_host());
  absl::StatusOr<ir::Tensor> h64 = be_->ToHost((*got64)[0]);
  ASSERT_TRUE(h64.ok());
  EXPECT_EQ(h64->data<double>()[3], 10.0);
  EXPECT_EQ(be_->HostFallbacks().at("CumSum"), 1);
}

TEST_F(CudaBackendTest, NamesTheDeviceItCannotOpen) {
  absl::StatusOr<std::shared_ptr<CudaBackend>> bad = CudaBackend::Create(DeviceCount() + 3);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("--device"));
}

TEST_F(CudaBackendTest, PipelineOnTheGpuTrainsAsOnTheCpu) {
  absl::StatusOr<std::unique_ptr<pipeline::testing::ModelFixture>> f =
      pipeline::testing::ModelFixture::Load("tiny_gpt");
  ASSERT_TRUE(f.ok()) << f.status();
  for (ir::DType dtype : {ir::DType::kF64, ir::DType::kF32}) {
    pipeline::testing::RunConfig c;
    c.dtype = dtype;
    c.stages = 2;
    c.microbatches = 2;
    c.recompute = partitioner::RecomputePolicy::kSelective;
    // fp64 runs the same arithmetic on both sides (compared exactly) under AdamW; fp32 sums in another order on
    // the GPU, and AdamW would scale the rounding noise of a gradient that is zero in exact arithmetic (a key
    // bias's) up to lr-sized steps of either sign, so fp32 trains with SGD.
    const bool exact = dtype == ir::DType::kF64;
    c.optimizer = exact ? autodiff::OptimizerKind::kAdamW : autodiff::OptimizerKind::kSGD;
    c.lr = exact ? 1e-3 : 0.05;
    c.dropout = true;
    c.steps = 3;
    absl::StatusOr<pipeline::testing::RunResult> cpu = (*f)->Pipeline(c);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    c.backend = be_;
    const std::map<std::string, int64_t> before = be_->HostFallbacks();
    absl::StatusOr<pipeline::testing::RunResult> gpu = (*f)->Pipeline(c);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    if (dtype == ir::DType::kF32) {
      // Every op of the fp32 training graph runs on the device.
      for (const auto& [op, n] : be_->HostFallbacks()) {
        const int64_t ran = n - (before.count(op) ? before.at(op) : 0);
        EXPECT_EQ(ran, 0) << op << " ran on the host";
      }
    }
    const double tol = dtype == ir::DType::kF64 ? 0 : 1e-5;
    for (size_t i = 0; i < cpu->losses.size(); ++i) {
      EXPECT_NEAR(gpu->losses[i], cpu->losses[i], tol * std::abs(cpu->losses[i]))
          << ir::DTypeName(dtype) << " step " << i;
    }
    for (const auto& [name, t] : cpu->params) {
      EXPECT_LE(pipeline::testing::MaxRelDiff(gpu->params.at(name), t), dtype == ir::DType::kF64 ? 0 : 1e-4) << name;
    }
  }
}

// Graphs (ExecutorOptions::graphs) on the GPU: steps replayed from CUDA graphs train as eager GPU
// steps, with dropout (flash attention's, Dropout's: a replay reads its step from device memory) and
// pipelined (sends between graphs, accumulation inside them). fp64 compares to 1e-12: only the
// order of atomic adds (the embedding's scatter) may differ between two runs.
TEST_F(CudaBackendTest, GraphReplaysTrainAsEagerGpuSteps) {
  absl::StatusOr<std::shared_ptr<CudaBackend>> flash = CudaBackend::Create(0, {.attention = AttentionImpl::kFlash});
  ASSERT_TRUE(flash.ok()) << flash.status();
  for (const std::string model : {"tiny_gpt", "tiny_bert"}) {
    absl::StatusOr<std::unique_ptr<pipeline::testing::ModelFixture>> f = pipeline::testing::ModelFixture::Load(model);
    ASSERT_TRUE(f.ok()) << f.status();
    for (ir::DType dtype : {ir::DType::kF64, ir::DType::kF32}) {
      pipeline::testing::RunConfig c;
      c.dtype = dtype;
      c.stages = 2;
      c.microbatches = 2;
      c.recompute = partitioner::RecomputePolicy::kSelective;
      c.optimizer = autodiff::OptimizerKind::kSGD;
      c.dropout = true;
      c.steps = 5;
      c.backend = *flash;
      absl::StatusOr<pipeline::testing::RunResult> eager = (*f)->Pipeline(c);
      ASSERT_TRUE(eager.ok()) << eager.status();
      c.graphs = true;
      absl::StatusOr<pipeline::testing::RunResult> graphs = (*f)->Pipeline(c);
      ASSERT_TRUE(graphs.ok()) << model << " " << ir::DTypeName(dtype) << ": " << graphs.status();
      const double tol = dtype == ir::DType::kF64 ? 1e-12 : 1e-6;
      for (size_t i = 0; i < eager->losses.size(); ++i) {
        EXPECT_NEAR(graphs->losses[i], eager->losses[i], tol * std::abs(eager->losses[i]))
            << model << " " << ir::DTypeName(dtype) << " step " << i;
      }
      for (const auto& [name, t] : eager->params) {
        EXPECT_LE(pipeline::testing::MaxRelDiff(graphs->params.at(name), t), 100 * tol) << model << " " << name;
      }
      for (const pipeline::StageMeasure& s : graphs->steps.back().stages) EXPECT_GT(s.replayed_nodes, 0) << model;
      // Every kernel the backend calls capturable records (a failure would only cost speed: it runs eagerly).
      for (const pipeline::StageMeasure& s : graphs->steps[1].stages) EXPECT_EQ(s.failed_recordings, 0) << model;
    }
  }
}

}  // namespace
}  // namespace onnxpipe::cuda
