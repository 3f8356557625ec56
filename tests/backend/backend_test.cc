// The backend interface's memory calls on the CPU and the checked backend (the same contract), and
// the checked backend's guarantee: its memory faults on any host access outside its own calls.
#include "executor/backend/backend.h"

#include <memory>
#include <vector>

#include "executor/backend/checked_backend.h"
#include "frontend/ir/graph.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onnxpipe::backend {
namespace {

using ::testing::HasSubstr;

class BackendContract : public ::testing::TestWithParam<bool> {
 protected:
  std::shared_ptr<const Backend> be_ = GetParam() ? MakeCheckedBackend() : MakeCpuBackend();
};

TEST_P(BackendContract, CopiesFillsAndReadsBackExactly) {
  const ir::Tensor host = ir::Tensor::FromVector<float>({2, 3}, {1, -2, 3.5f, 4, 5, -6});
  // Upload's result may share the host tensor's storage (the CPU backend's does): keep a copy.
  absl::StatusOr<ir::Tensor> dev = be_->Upload(host.Clone());
  ASSERT_TRUE(dev.ok()) << dev.status();
  EXPECT_EQ(dev->placement(), be_->placement());
  absl::StatusOr<ir::Tensor> zeros = be_->Zeros(ir::DType::kF32, {2, 3});
  ASSERT_TRUE(zeros.ok()) << zeros.status();
  ASSERT_TRUE(be_->Copy(*dev, *zeros).ok());
  absl::StatusOr<ir::Tensor> back = be_->ToHost(*zeros);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->on_host());
  EXPECT_TRUE(back->BitwiseEquals(host));
  // acc += x twice: 3 x.
  ASSERT_TRUE(be_->Accumulate(*zeros, *dev).ok());
  ASSERT_TRUE(be_->Accumulate(*zeros, *dev).ok());
  back = be_->ToHost(*zeros);
  ASSERT_TRUE(back.ok());
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(back->data<float>()[i], 3 * host.data<float>()[i]) << i;
  ASSERT_TRUE(be_->Fill(*zeros, 0).ok());
  back = be_->ToHost(*zeros);
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(back->data<float>()[i], 0.f) << i;
  // A clone owns its storage: writing the original leaves it.
  absl::StatusOr<ir::Tensor> clone = be_->Clone(*dev);
  ASSERT_TRUE(clone.ok());
  EXPECT_NE(clone->address(), dev->address());
  ASSERT_TRUE(be_->Fill(*dev, 0).ok());
  EXPECT_TRUE(be_->ToHost(*clone)->BitwiseEquals(host));
}

TEST_P(BackendContract, FindsNonFiniteValues) {
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    absl::StatusOr<ir::Tensor> t = be_->Upload(ir::Tensor::FromVector<float>({3}, {1, bad, 2}));
    ASSERT_TRUE(t.ok());
    EXPECT_FALSE(*be_->AllFinite(*t)) << bad;
  }
  absl::StatusOr<ir::Tensor> ok = be_->Upload(ir::Tensor::FromVector<double>({2}, {1e300, -1e-300}));
  EXPECT_TRUE(*be_->AllFinite(*ok));
}

TEST_P(BackendContract, RefusesMismatchedCopiesNamingBothTensors) {
  absl::StatusOr<ir::Tensor> a = be_->Zeros(ir::DType::kF32, {2, 3});
  absl::StatusOr<ir::Tensor> b = be_->Zeros(ir::DType::kF32, {3, 2});
  absl::StatusOr<ir::Tensor> c = be_->Zeros(ir::DType::kF64, {2, 3});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  absl::Status st = be_->Copy(*a, *b);
  EXPECT_THAT(st.message(), HasSubstr("f32[2,3]"));
  EXPECT_THAT(st.message(), HasSubstr("f32[3,2]"));
  EXPECT_FALSE(be_->Accumulate(*a, *c).ok());
  EXPECT_FALSE(be_->Allocate(-1).ok());
}

TEST_P(BackendContract, RunsKernelsIntoItsOwnMemory) {
  ir::Graph g;
  const ir::ValueId x = g.AddValue("x", ir::DType::kF32, {ir::Dim(3)});
  const ir::ValueId y = g.AddValue("y", ir::DType::kF32, {ir::Dim(3)});
  const ir::ValueId z = g.AddValue("z", ir::DType::kF32, {ir::Dim(3)});
  const ir::NodeId add = g.AddNode(ir::OpKind::kAdd, "add", {x, y}, {z});
  absl::StatusOr<ir::Tensor> a = be_->Upload(ir::Tensor::FromVector<float>({3}, {1, 2, 3}));
  absl::StatusOr<ir::Tensor> b = be_->Upload(ir::Tensor::FromVector<float>({3}, {10, 20, 30}));
  ASSERT_TRUE(a.ok() && b.ok());
  absl::StatusOr<std::vector<ir::Tensor>> out = be_->Run(g.node(add), {*a, *b}, ExecContext{});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 1u);
  EXPECT_EQ((*out)[0].placement(), be_->placement());
  absl::StatusOr<ir::Tensor> host = be_->ToHost((*out)[0]);
  ASSERT_TRUE(host.ok());
  EXPECT_TRUE(host->BitwiseEquals(ir::Tensor::FromVector<float>({3}, {11, 22, 33})));
}

// RunGroup: each node's outputs as its own Run gives them (hand-computed sums); a failing node is
// named in the error.
TEST_P(BackendContract, RunsAGroupAsItsNodesOneByOne) {
  ir::Graph g;
  const ir::ValueId x = g.AddValue("x", ir::DType::kF32, {ir::Dim(2)});
  const ir::ValueId y = g.AddValue("y", ir::DType::kF32, {ir::Dim(2)});
  const ir::ValueId s = g.AddValue("s", ir::DType::kF32, {ir::Dim(2)});
  const ir::ValueId p = g.AddValue("p", ir::DType::kF32, {ir::Dim(2)});
  const ir::NodeId add = g.AddNode(ir::OpKind::kAdd, "add", {x, y}, {s});
  const ir::NodeId mul = g.AddNode(ir::OpKind::kMul, "mul", {x, y}, {p});
  absl::StatusOr<ir::Tensor> a = be_->Upload(ir::Tensor::FromVector<float>({2}, {1.5f, -2}));
  absl::StatusOr<ir::Tensor> b = be_->Upload(ir::Tensor::FromVector<float>({2}, {4, 3}));
  ASSERT_TRUE(a.ok() && b.ok());
  absl::StatusOr<std::vector<std::vector<ir::Tensor>>> out =
      be_->RunGroup({&g.node(add), &g.node(mul)}, {{*a, *b}, {*a, *b}}, ExecContext{});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 2u);
  const std::vector<std::vector<float>> want = {{5.5f, 1}, {6, -6}};
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_EQ((*out)[i].size(), 1u);
    absl::StatusOr<ir::Tensor> host = be_->ToHost((*out)[i][0]);
    ASSERT_TRUE(host.ok());
    EXPECT_TRUE(host->BitwiseEquals(ir::Tensor::FromVector<float>({2}, want[i]))) << i;
  }
  // The second node's operands do not broadcast: its error names it.
  absl::StatusOr<ir::Tensor> c = be_->Upload(ir::Tensor::FromVector<float>({3}, {1, 2, 3}));
  ASSERT_TRUE(c.ok());
  out = be_->RunGroup({&g.node(add), &g.node(mul)}, {{*a, *b}, {*a, *c}}, ExecContext{});
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("node 'mul' (Mul)"));
  EXPECT_FALSE(be_->RunGroup({&g.node(add)}, {}, ExecContext{}).ok()) << "one input list per node";
}

INSTANTIATE_TEST_SUITE_P(CpuAndChecked, BackendContract, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "checked" : "cpu"; });

TEST(CheckedBackendDeathTest, HostReadOfDeviceMemoryFaults) {
  std::shared_ptr<const Backend> be = MakeCheckedBackend();
  absl::StatusOr<ir::Tensor> t = be->Upload(ir::Tensor::FromVector<float>({4}, {1, 2, 3, 4}));
  ASSERT_TRUE(t.ok());
  const volatile float* p = static_cast<const float*>(t->device_raw());
  EXPECT_DEATH({ [[maybe_unused]] float v = p[0]; }, "");
  EXPECT_DEATH({ static_cast<float*>(t->device_raw())[1] = 0; }, "");
  // Through the host accessors: a clear message instead of a fault.
  EXPECT_DEATH({ [[maybe_unused]] double v = t->GetAsDouble(0); }, "host access to a tensor on device");
  // After all that, the backend still reads it back unchanged.
  EXPECT_TRUE(be->ToHost(*t)->BitwiseEquals(ir::Tensor::FromVector<float>({4}, {1, 2, 3, 4})));
}

}  // namespace
}  // namespace onnxpipe::backend
