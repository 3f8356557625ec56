// comm::Comm over NCCL on the one GPU a test machine has: a world of one rank (NCCL refuses two ranks on one GPU).
// The all-reduce runs through NCCL even for one rank (its sum of one tensor is that tensor, bit for bit), host tensors
// through device staging; the contract's errors and the abort as the other comms give them. Multi-rank NCCL runs
// need several GPUs (the multi-GPU issue). Skips where no GPU is visible.
#include "executor/cuda/nccl_comm.h"

#include <cuda_runtime.h>

#include "executor/comm/socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onnxpipe::cuda {
namespace {

using ::testing::HasSubstr;

class NcclCommTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
    absl::StatusOr<std::shared_ptr<CudaBackend>> be = CudaBackend::Create(0);
    ASSERT_TRUE(be.ok()) << be.status();
    be_ = *be;
    absl::StatusOr<comm::Socket> s = comm::Listen("127.0.0.1", 0);
    ASSERT_TRUE(s.ok());
    NcclCommOptions o;
    o.rendezvous = {"127.0.0.1", comm::BoundPort(*s).value_or(29500), 0, 1, 10};
    o.backend = be_;
    absl::StatusOr<std::unique_ptr<NcclComm>> c = NcclComm::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    comm_ = *std::move(c);
  }

  std::shared_ptr<CudaBackend> be_;
  std::unique_ptr<NcclComm> comm_;
};

TEST_F(NcclCommTest, AWorldOfOneAllReducesDeviceAndHostTensorsToThemselves) {
  EXPECT_EQ(comm_->rank(), 0);
  EXPECT_EQ(comm_->size(), 1);
  const ir::Tensor x = ir::Tensor::FromVector<float>({4}, {1.5f, -2.25f, 3e-8f, 1e30f});
  std::unique_ptr<backend::Stream> s = be_->CreateStream();
  absl::StatusOr<ir::Tensor> dev = be_->Upload(x, s.get());
  ASSERT_TRUE(dev.ok()) << dev.status();
  ASSERT_TRUE(comm_->AllReduce(*dev, {0}, s.get()).ok());
  absl::StatusOr<ir::Tensor> back = be_->ToHost(*dev, s.get());
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->BitwiseEquals(x));
  ir::Tensor host = ir::Tensor::FromVector<double>({2}, {0.1, -7.0});
  ASSERT_TRUE(comm_->AllReduce(host, {0}, nullptr).ok());
  EXPECT_TRUE(host.BitwiseEquals(ir::Tensor::FromVector<double>({2}, {0.1, -7.0})));
  const ir::Tensor bf = ir::Tensor::FromVector<float>({3}, {1, 2, 3}).CastTo(ir::DType::kBF16);
  absl::StatusOr<ir::Tensor> dbf = be_->Upload(bf, s.get());
  ASSERT_TRUE(dbf.ok());
  ASSERT_TRUE(comm_->AllReduce(*dbf, {0}, s.get()).ok());
  EXPECT_TRUE(be_->ToHost(*dbf, s.get())->BitwiseEquals(bf));
}

// Point-to-point on one GPU: a rank sending to itself (an NCCL send completes only with its receive in the same
// group here). Sends are held (copied at once, so the caller may overwrite them) and issued with the next group
// as one ncclGroupStart/End; a group posting its receives before its sends still completes. Device tensors on a
// stream and host tensors both.
TEST_F(NcclCommTest, HeldSendsAndGroupsReachTheirReceivesInOrder) {
  std::unique_ptr<backend::Stream> s = be_->CreateStream();
  const ir::Tensor a = ir::Tensor::FromVector<float>({3}, {1, 2, 3}), b = ir::Tensor::FromVector<float>({2}, {-4, 5});
  absl::StatusOr<ir::Tensor> da = be_->Upload(a, s.get()), db = be_->Upload(b, s.get());
  absl::StatusOr<ir::Tensor> ra = be_->Zeros(ir::DType::kF32, {3}, s.get()), rb = be_->Zeros(ir::DType::kF32, {2}, s.get());
  ASSERT_TRUE(da.ok() && db.ok() && ra.ok() && rb.ok());
  ASSERT_TRUE(comm_->Send(0, 7, *da, s.get()).ok());
  ASSERT_TRUE(comm_->Send(0, 8, *db, s.get()).ok());
  ASSERT_TRUE(be_->Fill(*da, 0, s.get()).ok());  // the held copy, not this buffer, is sent
  ASSERT_TRUE(comm_->GroupStart().ok());
  ASSERT_TRUE(comm_->Recv(0, 7, *ra, s.get()).ok());
  ASSERT_TRUE(comm_->Recv(0, 8, *rb, s.get()).ok());
  ASSERT_TRUE(comm_->GroupEnd().ok());
  EXPECT_TRUE(be_->ToHost(*ra, s.get())->BitwiseEquals(a));
  EXPECT_TRUE(be_->ToHost(*rb, s.get())->BitwiseEquals(b));
  // Receives posted before the sends, host buffers.
  ir::Tensor host_in = ir::Tensor::FromVector<double>({2}, {0, 0});
  const ir::Tensor host_out = ir::Tensor::FromVector<double>({2}, {0.5, -1e300});
  ASSERT_TRUE(comm_->GroupStart().ok());
  ASSERT_TRUE(comm_->Recv(0, 9, host_in, nullptr).ok());
  ASSERT_TRUE(comm_->Send(0, 9, host_out, nullptr).ok());
  ASSERT_TRUE(comm_->GroupEnd().ok());
  EXPECT_TRUE(host_in.BitwiseEquals(host_out));
  // A held send goes out with the next receive, as one group.
  ASSERT_TRUE(comm_->Send(0, 10, b, nullptr).ok());
  ir::Tensor late = ir::Tensor::FromVector<float>({2}, {0, 0});
  ASSERT_TRUE(comm_->Recv(0, 10, late, nullptr).ok());
  EXPECT_TRUE(late.BitwiseEquals(b));
  EXPECT_TRUE(comm_->Flush().ok());
  EXPECT_EQ(comm_->bytes_sent(), comm_->bytes_received());
}

TEST_F(NcclCommTest, RefusesWhatTheContractRefusesAndStopsOnAbort) {
  const ir::Tensor x = ir::Tensor::FromVector<float>({1}, {1});
  absl::Status st = comm_->Send(1, 1, x, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("not a rank of a world of 1"));
  // Groups must be sets of ranks; the world needs no communicator of its own.
  EXPECT_THAT(comm_->PrepareGroups({{1}}).message(), HasSubstr("not a set of ranks"));
  EXPECT_THAT(comm_->PrepareGroups({{0, 0}}).message(), HasSubstr("not a set of ranks"));
  EXPECT_TRUE(comm_->PrepareGroups({{0}}).ok());
  EXPECT_EQ(comm_->AllReduce(ir::Tensor::FromVector<bool>({1}, {true}), {0}, nullptr).code(),
            absl::StatusCode::kUnimplemented);
  ASSERT_TRUE(comm_->GroupStart().ok());
  EXPECT_EQ(comm_->AllReduce(x, {0}, nullptr).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(comm_->GroupEnd().ok());
  comm_->Abort(absl::InternalError("stage 0: boom"));
  EXPECT_THAT(comm_->abort_status().message(), HasSubstr("boom"));
  st = comm_->AllReduce(ir::Tensor::FromVector<float>({1}, {1}), {0}, nullptr);
  EXPECT_TRUE(comm::IsAbortedByPeer(st)) << st;
}

}  // namespace
}  // namespace onnxpipe::cuda
