// In-process comm: delivery across threads, zero-copy hand-off, stream order (the receiver's stream
// waits for the sender's), tag matching, abort waking blocked receivers on every rank, the receive
// timeout, and a many-thread exchange.
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

// A stream that numbers the events it records and lists the events it was made to wait for.
class RecordingStream : public backend::Stream {
 public:
  struct Mark : backend::Event {
    explicit Mark(int i) : id(i) {}
    int id;
  };
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::StatusOr<std::shared_ptr<backend::Event>> Record() override { return std::make_shared<Mark>(++recorded); }
  absl::Status Wait(const backend::Event& e) override {
    waited.push_back(dynamic_cast<const Mark&>(e).id);
    return absl::OkStatus();
  }
  int recorded = 0;
  std::vector<int> waited;
};

TEST(InProcessComm, TheReceiversStreamWaitsForTheSendersWork) {
  auto group = InProcessGroup::Create(2);
  std::unique_ptr<Comm> a = group->Endpoint(0), b = group->Endpoint(1);
  RecordingStream sender, receiver;
  ASSERT_TRUE(a->Send(1, 1, Vec({1}), &sender).ok());
  ASSERT_TRUE(a->Send(1, 2, Vec({2}), &sender).ok());
  EXPECT_EQ(sender.recorded, 2);
  ASSERT_TRUE(b->Recv(0, 2, &receiver).ok());
  ASSERT_TRUE(b->Recv(0, 1, &receiver).ok());
  EXPECT_EQ(receiver.waited, (std::vector<int>{2, 1}));  // each message's own event
  ASSERT_TRUE(a->Send(1, 3, Vec({3}), nullptr).ok());  // host order: nothing to wait for
  ASSERT_TRUE(b->Recv(0, 3, &receiver).ok());
  EXPECT_EQ(receiver.waited.size(), 2u);
}

TEST(InProcessComm, DeliversAcrossThreadsWithoutCopying) {
  auto group = InProcessGroup::Create(2);
  std::unique_ptr<Comm> a = group->Endpoint(0), b = group->Endpoint(1);
  ir::Tensor t = Vec({1, 2, 3});
  const void* storage = t.raw();
  std::thread sender([&] { ASSERT_TRUE(a->Send(1, 42, t, nullptr).ok()); });
  absl::StatusOr<ir::Tensor> got = b->Recv(0, 42, nullptr);
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
  ASSERT_TRUE(r0->Send(2, 1, Vec({10}), nullptr).ok());
  ASSERT_TRUE(r1->Send(2, 1, Vec({20}), nullptr).ok());
  ASSERT_TRUE(r0->Send(2, 2, Vec({30}), nullptr).ok());
  EXPECT_EQ(r2->Recv(0, 2, nullptr)->data<float>()[0], 30.0f);
  EXPECT_EQ(r2->Recv(1, 1, nullptr)->data<float>()[0], 20.0f);
  EXPECT_EQ(r2->Recv(0, 1, nullptr)->data<float>()[0], 10.0f);
}

TEST(InProcessComm, RejectsBadRanks) {
  auto group = InProcessGroup::Create(2);
  auto r0 = group->Endpoint(0);
  EXPECT_EQ(group->Endpoint(2), nullptr);
  EXPECT_THAT(r0->Send(5, 0, Vec({1}), nullptr).message(), HasSubstr("sends to rank 5"));
  EXPECT_THAT(r0->Send(0, 0, Vec({1}), nullptr).message(), HasSubstr("sends to rank 0"));
  EXPECT_THAT(r0->Recv(-1, 0, nullptr).status().message(), HasSubstr("receives from rank -1"));
}

TEST(InProcessComm, AbortWakesEveryBlockedReceiver) {
  constexpr int kRanks = 4;
  auto group = InProcessGroup::Create(kRanks);
  std::vector<absl::Status> got(kRanks);
  std::vector<std::thread> threads;
  for (int r = 1; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      auto c = group->Endpoint(r);
      got[r] = c->Recv(0, 7, nullptr).status();  // nobody ever sends this
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
  EXPECT_TRUE(IsAbortedByPeer(c0->Send(1, 0, Vec({1}), nullptr)));
  EXPECT_FALSE(IsAbortedByPeer(absl::InternalError("boom")));
}

TEST(InProcessComm, ReceiveTimeoutReportsTheWait) {
  auto group = InProcessGroup::Create(2, /*recv_timeout_s=*/0.05);
  auto c = group->Endpoint(1);
  absl::StatusOr<ir::Tensor> r = c->Recv(0, 9, nullptr);
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
        if (!c->Send(p, i, Vec({static_cast<float>(r * 1000 + i)}), nullptr).ok()) ++errors;
      for (auto [p, i] : recvs) {
        absl::StatusOr<ir::Tensor> t = c->Recv(p, i, nullptr);
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
