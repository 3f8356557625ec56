// In-process comm: delivery across threads, zero-copy hand-off, tag matching, abort waking blocked
// receivers on every rank, the receive timeout, and a many-thread exchange.
#include <atomic>
#include <random>
#include <thread>

#include "executor/comm/inprocess_comm.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onnxpipe::comm {
namespace {

using ::testing::HasSubstr;

ir::Tensor Vec(std::vector<float> v) { return ir::Tensor::FromVector<float>({static_cast<int64_t>(v.size())}, v); }

TEST(InProcessComm, DeliversAcrossThreadsWithoutCopying) {
  auto group = InProcessGroup::Create(2);
  std::unique_ptr<Comm> a = group->Endpoint(0), b = group->Endpoint(1);
  ir::Tensor t = Vec({1, 2, 3});
  const void* storage = t.raw();
  std::thread sender([&] { ASSERT_TRUE(a->Send(1, 42, t).ok()); });
  absl::StatusOr<ir::Tensor> got = b->Recv(0, 42);
  sender.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->raw(), storage);  // the receiver holds the sender's storage
  EXPECT_EQ(got->data<float>()[2], 3.0f);
  EXPECT_EQ(a->bytes_sent(), 12);
  EXPECT_EQ(b->bytes_received(), 12);
  EXPECT_EQ(group->pending_messages(), 0);
}

TEST(InProcessComm, MatchesTagsAndSourcesOutOfOrder) {
  auto group = InProcessGroup::Create(3);
  auto r0 = group->Endpoint(0), r1 = group->Endpoint(1), r2 = group->Endpoint(2);
  ASSERT_TRUE(r0->Send(2, 1, Vec({10})).ok());
  ASSERT_TRUE(r1->Send(2, 1, Vec({20})).ok());
  ASSERT_TRUE(r0->Send(2, 2, Vec({30})).ok());
  EXPECT_EQ(r2->Recv(0, 2)->data<float>()[0], 30.0f);
  EXPECT_EQ(r2->Recv(1, 1)->data<float>()[0], 20.0f);
  EXPECT_EQ(r2->Recv(0, 1)->data<float>()[0], 10.0f);
}

TEST(InProcessComm, RejectsBadRanks) {
  auto group = InProcessGroup::Create(2);
  auto r0 = group->Endpoint(0);
  EXPECT_EQ(group->Endpoint(2), nullptr);
  EXPECT_THAT(r0->Send(5, 0, Vec({1})).message(), HasSubstr("sends to rank 5"));
  EXPECT_THAT(r0->Send(0, 0, Vec({1})).message(), HasSubstr("sends to rank 0"));
  EXPECT_THAT(r0->Recv(-1, 0).status().message(), HasSubstr("receives from rank -1"));
}

TEST(InProcessComm, AbortWakesEveryBlockedReceiver) {
  constexpr int kRanks = 4;
  auto group = InProcessGroup::Create(kRanks);
  std::vector<absl::Status> got(kRanks);
  std::vector<std::thread> threads;
  for (int r = 1; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      auto c = group->Endpoint(r);
      got[r] = c->Recv(0, 7).status();  // nobody ever sends this
    });
  }
  // Rank 0 fails and aborts the group.
  auto c0 = group->Endpoint(0);
  c0->Abort(absl::InternalError("stage 0, micro-batch 2, node 'x' (MatMul): boom"));
  for (std::thread& t : threads) t.join();
  for (int r = 1; r < kRanks; ++r) {
    EXPECT_TRUE(IsAbortedByPeer(got[r])) << got[r];
    EXPECT_THAT(got[r].message(), HasSubstr("boom"));
  }
  // The first reason stays; later sends fail too.
  c0->Abort(absl::InternalError("second"));
  EXPECT_THAT(c0->abort_status().message(), HasSubstr("boom"));
  EXPECT_TRUE(IsAbortedByPeer(c0->Send(1, 0, Vec({1}))));
  EXPECT_FALSE(IsAbortedByPeer(absl::InternalError("boom")));
}

TEST(InProcessComm, ReceiveTimeoutReportsTheWait) {
  auto group = InProcessGroup::Create(2, /*recv_timeout_s=*/0.05);
  auto c = group->Endpoint(1);
  absl::StatusOr<ir::Tensor> r = c->Recv(0, 9);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(r.status().message(), HasSubstr("rank 1 waited"));
}

TEST(InProcessComm, ManyThreadsExchangeEveryMessage) {
  // Every rank sends 200 tagged messages to every other rank in a random order and receives all of
  // them in another random order; every value must arrive exactly once.
  constexpr int kRanks = 5, kPerPair = 200;
  auto group = InProcessGroup::Create(kRanks);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      auto c = group->Endpoint(r);
      std::mt19937 rng(r);
      std::vector<std::pair<int, int>> sends, recvs;
      for (int p = 0; p < kRanks; ++p) {
        if (p == r) continue;
        for (int i = 0; i < kPerPair; ++i) {
          sends.push_back({p, i});
          recvs.push_back({p, i});
        }
      }
      std::shuffle(sends.begin(), sends.end(), rng);
      std::shuffle(recvs.begin(), recvs.end(), rng);
      for (auto [p, i] : sends)
        if (!c->Send(p, i, Vec({static_cast<float>(r * 1000 + i)})).ok()) ++errors;
      for (auto [p, i] : recvs) {
        absl::StatusOr<ir::Tensor> t = c->Recv(p, i);
        if (!t.ok() || t->data<float>()[0] != static_cast<float>(p * 1000 + i)) ++errors;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(group->pending_messages(), 0);
}

}  // namespace
}  // namespace onnxpipe::comm
