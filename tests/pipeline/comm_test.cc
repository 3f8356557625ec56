// In-process comm: receives into the caller's buffer, stream order (the receiver's stream waits for
// the sender's), tag matching, shape checks naming both sides, grouped send/receive without
// deadlock, all-reduce equal to the serial sum bit for bit on every rank, abort waking blocked
// receivers and all-reduces on every rank, timeouts, device-placed tensors, a many-thread exchange.
#include <atomic>
#include <cmath>
#include <random>
#include <thread>

#include "executor/backend/checked_backend.h"
#include "executor/comm/inprocess_comm.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onnxpipe::comm {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

ir::Tensor Vec(std::vector<float> v) { return ir::Tensor::FromVector<float>({static_cast<int64_t>(v.size())}, v); }
ir::Tensor Zeros(int64_t n) { return ir::Tensor(ir::DType::kF32, {n}); }

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
  ir::Tensor into = Zeros(1);
  ASSERT_TRUE(a->Send(1, 1, Vec({1}), &sender).ok());
  ASSERT_TRUE(a->Send(1, 2, Vec({2}), &sender).ok());
  EXPECT_EQ(sender.recorded, 2);
  ASSERT_TRUE(b->Recv(0, 2, into, &receiver).ok());
  ASSERT_TRUE(b->Recv(0, 1, into, &receiver).ok());
  EXPECT_EQ(receiver.waited, (std::vector<int>{2, 1}));  // each message's own event
  ASSERT_TRUE(a->Send(1, 3, Vec({3}), nullptr).ok());    // host order: nothing to wait for
  ASSERT_TRUE(b->Recv(0, 3, into, &receiver).ok());
  EXPECT_EQ(receiver.waited.size(), 2u);
}

// A staging pool serves later groups (one per pipeline step): a send reuses a buffer of its size once
// the receive that read it has finished, its stream waiting for the receiver's event; the bytes are
// each message's own.
TEST(InProcessComm, APoolStagesLaterSendsInTheBuffersOfEarlierOnes) {
  auto pool = std::make_shared<comm::StagingPool>();
  RecordingStream sender, receiver;
  for (int step = 0; step < 3; ++step) {
    auto group = InProcessGroup::Create(2, 0, nullptr, pool);
    std::unique_ptr<Comm> a = group->Endpoint(0), b = group->Endpoint(1);
    ir::Tensor into = Zeros(2), other = Zeros(3);
    ASSERT_TRUE(a->Send(1, 1, Vec({1.f + step, 2}), &sender).ok());
    ASSERT_TRUE(a->Send(1, 2, Vec({5, 6, 7.f + step}), &sender).ok());
    ASSERT_TRUE(b->Recv(0, 1, into, &receiver).ok());
    ASSERT_TRUE(b->Recv(0, 2, other, &receiver).ok());
    EXPECT_EQ(into.data<float>()[0], 1.f + step);
    EXPECT_EQ(other.data<float>()[2], 7.f + step);
    EXPECT_EQ(pool->allocations(), 2) << "step " << step;  // one per size, the first time
  }
  // From the second group on, each send waited for the receive of the buffer's previous message.
  EXPECT_EQ(sender.waited.size(), 4u);
}

// With a pool, all-reduces of later groups sum into the buffer of the first one: each sum waits for
// every member's copy of the previous sum out of it (3 ready + 3 done waits per all-reduce, and the
// 3 copies from the second on), and each step's sums are its own.
TEST(InProcessComm, APoolKeepsTheAllReducesSumBuffer) {
  auto pool = std::make_shared<comm::StagingPool>();
  constexpr int kRanks = 3, kSteps = 3;
  RecordingStream streams[kRanks];
  for (int step = 0; step < kSteps; ++step) {
    auto group = InProcessGroup::Create(kRanks, 10, nullptr, pool);
    std::vector<ir::Tensor> grads;
    for (int r = 0; r < kRanks; ++r) grads.push_back(Vec({1.f + r + 10.f * step, 2.f * r}));
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, r] {
        const absl::Status st = group->Endpoint(r)->AllReduce(grads[r], {0, 1, 2}, &streams[r]);
        EXPECT_TRUE(st.ok()) << st;
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_EQ(grads[r].data<float>()[0], 6.f + 30.f * step) << "step " << step << " rank " << r;
      EXPECT_EQ(grads[r].data<float>()[1], 6.f) << "step " << step << " rank " << r;
    }
    EXPECT_EQ(pool->allocations(), 1) << "step " << step;
  }
  size_t waits = 0;
  for (const RecordingStream& s : streams) waits += s.waited.size();
  EXPECT_EQ(waits, static_cast<size_t>(kSteps * 2 * kRanks + (kSteps - 1) * kRanks));
}

TEST(InProcessComm, ReceivesIntoTheCallersBufferAcrossThreads) {
  auto group = InProcessGroup::Create(2);
  std::unique_ptr<Comm> a = group->Endpoint(0), b = group->Endpoint(1);
  ir::Tensor into = Zeros(3);
  const void* slot = into.address();
  std::thread sender([&] {
    ir::Tensor t = Vec({1, 2, 3});
    ASSERT_TRUE(a->Send(1, 42, t, nullptr).ok());
    t.mutable_data<float>()[2] = 99;  // the message is what t held when it was sent
  });
  sender.join();
  ASSERT_TRUE(b->Recv(0, 42, into, nullptr).ok());
  EXPECT_EQ(into.address(), slot);
  EXPECT_EQ(into.data<float>()[0], 1.0f);
  EXPECT_EQ(into.data<float>()[2], 3.0f);
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
  ir::Tensor x = Zeros(1);
  ASSERT_TRUE(r2->Recv(0, 2, x, nullptr).ok());
  EXPECT_EQ(x.data<float>()[0], 30.0f);
  ASSERT_TRUE(r2->Recv(1, 1, x, nullptr).ok());
  EXPECT_EQ(x.data<float>()[0], 20.0f);
  ASSERT_TRUE(r2->Recv(0, 1, x, nullptr).ok());
  EXPECT_EQ(x.data<float>()[0], 10.0f);
}

TEST(InProcessComm, RejectsBadRanksAndBuffers) {
  auto group = InProcessGroup::Create(2);
  auto r0 = group->Endpoint(0);
  ir::Tensor x = Zeros(1);
  EXPECT_EQ(group->Endpoint(2), nullptr);
  EXPECT_THAT(r0->Send(5, 0, Vec({1}), nullptr).message(), HasSubstr("sends to rank 5"));
  EXPECT_THAT(r0->Send(0, 0, Vec({1}), nullptr).message(), HasSubstr("sends to rank 0"));
  EXPECT_THAT(r0->Recv(-1, 0, x, nullptr).message(), HasSubstr("receives from rank -1"));
  EXPECT_THAT(r0->Recv(1, 0, ir::Tensor(), nullptr).message(), HasSubstr("without storage"));
  EXPECT_THAT(r0->AllReduce(x, {1}, nullptr).message(), HasSubstr("does not include it"));
  EXPECT_THAT(r0->AllReduce(x, {0, 0}, nullptr).message(), HasSubstr("distinct"));
  EXPECT_THAT(r0->GroupEnd().message(), HasSubstr("GroupEnd without GroupStart"));
  ASSERT_TRUE(r0->GroupStart().ok());
  EXPECT_THAT(r0->AllReduce(x, {0, 1}, nullptr).message(), HasSubstr("between GroupStart and GroupEnd"));
  EXPECT_TRUE(r0->GroupEnd().ok());
}

TEST(InProcessComm, AShapeOrDTypeMismatchNamesTheSenderAndTheBuffer) {
  auto group = InProcessGroup::Create(2);
  auto a = group->Endpoint(0), b = group->Endpoint(1);
  ASSERT_TRUE(a->Send(1, 7, ir::Tensor(ir::DType::kF32, {2, 3}), nullptr).ok());
  absl::Status st = b->Recv(0, 7, ir::Tensor(ir::DType::kF32, {3, 2}), nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(),
              AllOf(HasSubstr("rank 1 receiving message 7 from rank 0"), HasSubstr("sender's tensor is f32 (2, 3)"),
                    HasSubstr("receive buffer is f32 (3, 2)")));
  ASSERT_TRUE(a->Send(1, 8, ir::Tensor(ir::DType::kF32, {4}), nullptr).ok());
  st = b->Recv(0, 8, ir::Tensor(ir::DType::kF64, {4}), nullptr);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("f32 (4)"), HasSubstr("f64 (4)")));
}

// Both ranks post the receive before the send: issued one by one, each would wait for a message
// the other has not sent yet. Grouped, they are issued together at GroupEnd.
TEST(InProcessComm, GroupedSendAndReceiveInBothDirectionsDoNotDeadlock) {
  auto group = InProcessGroup::Create(2, /*timeout_s=*/5);
  std::vector<absl::Status> st(2);
  std::vector<ir::Tensor> got = {Zeros(2), Zeros(2)};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto c = group->Endpoint(r);
      const int peer = 1 - r;
      for (int step = 0; step < 3; ++step) {  // e.g. 1F1B's send-forward + receive-backward
        absl::Status s = c->GroupStart();
        if (s.ok()) s = c->Recv(peer, step, got[r], nullptr);
        if (s.ok()) s = c->Send(peer, step, Vec({static_cast<float>(r), static_cast<float>(step)}), nullptr);
        absl::Status end = c->GroupEnd();
        if (st[r].ok()) st[r] = s.ok() ? end : s;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r];
    EXPECT_EQ(got[r].data<float>()[0], static_cast<float>(1 - r));
    EXPECT_EQ(got[r].data<float>()[1], 2.0f);
  }
  EXPECT_EQ(group->pending_messages(), 0);
}

// Values whose sum depends on the order of the additions, so that only a left fold in the group's
// order matches bit for bit.
std::vector<ir::Tensor> OrderSensitive(int ranks, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<ir::Tensor> xs;
  for (int r = 0; r < ranks; ++r) {
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = u(rng) * std::pow(10.0f, static_cast<float>((r * 3 + i) % 9 - 4));
    xs.push_back(Vec(v));
  }
  return xs;
}

TEST(InProcessComm, AllReduceIsTheSerialSumInTheGroupsOrderOnEveryRank) {
  constexpr int64_t kN = 257;
  for (const std::vector<int>& order : std::vector<std::vector<int>>{{0, 1}, {1, 0}, {0, 1, 2}, {2, 0, 1}, {1, 2, 0}}) {
    const int world = 3;  // a group may be a subset of the ranks
    auto group = InProcessGroup::Create(world, /*timeout_s=*/5);
    const std::vector<ir::Tensor> inputs = OrderSensitive(world, kN, 17);
    std::vector<float> expected(kN);  // the serial left fold in the group's order
    for (int64_t i = 0; i < kN; ++i) {
      float acc = inputs[order[0]].data<float>()[i];
      for (size_t k = 1; k < order.size(); ++k) acc += inputs[order[k]].data<float>()[i];
      expected[i] = acc;
    }
    std::vector<ir::Tensor> t;
    for (const ir::Tensor& x : inputs) t.push_back(x.Clone());
    std::vector<absl::Status> st(world);
    std::vector<std::thread> threads;
    for (int r : order) {
      threads.emplace_back([&, r] {
        auto c = group->Endpoint(r);
        st[r] = c->AllReduce(t[r], order, nullptr);
      });
    }
    for (std::thread& th : threads) th.join();
    const std::string where = "group " + ::testing::PrintToString(order);
    for (int r : order) {
      ASSERT_TRUE(st[r].ok()) << where << ": " << st[r];
      EXPECT_TRUE(t[r].BitwiseEquals(Vec(expected))) << where << " rank " << r;
    }
    for (int r = 0; r < world; ++r) {
      if (std::find(order.begin(), order.end(), r) == order.end()) {
        EXPECT_TRUE(t[r].BitwiseEquals(inputs[r]));
      }
    }
  }
  // The test data tells the orders apart (else the checks above would not show a wrong order).
  const std::vector<ir::Tensor> x = OrderSensitive(3, kN, 17);
  bool differs = false;
  for (int64_t i = 0; i < kN; ++i) {
    const float a = (x[0].data<float>()[i] + x[1].data<float>()[i]) + x[2].data<float>()[i];
    const float b = (x[2].data<float>()[i] + x[0].data<float>()[i]) + x[1].data<float>()[i];
    differs |= a != b;
  }
  EXPECT_TRUE(differs);
}

TEST(InProcessComm, AllReducesOfAGroupMatchInCallOrder) {
  auto group = InProcessGroup::Create(2, /*timeout_s=*/5);
  std::vector<ir::Tensor> first = {Vec({1}), Vec({2})}, second = {Vec({10, 10}), Vec({20, 20})};
  std::vector<absl::Status> st(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto c = group->Endpoint(r);
      st[r] = c->AllReduce(first[r], {0, 1}, nullptr);
      if (st[r].ok()) st[r] = c->AllReduce(second[r], {0, 1}, nullptr);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r];
    EXPECT_EQ(first[r].data<float>()[0], 3.0f);
    EXPECT_EQ(second[r].data<float>()[1], 30.0f);
  }
}

TEST(InProcessComm, AllReduceShapeMismatchFailsEveryMemberNamingBoth) {
  auto group = InProcessGroup::Create(2, /*timeout_s=*/5);
  std::vector<ir::Tensor> t = {Zeros(3), Zeros(4)};
  std::vector<absl::Status> st(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] { st[r] = group->Endpoint(r)->AllReduce(t[r], {0, 1}, nullptr); });
  }
  for (std::thread& th : threads) th.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), absl::StatusCode::kInvalidArgument) << st[r];
    EXPECT_THAT(st[r].message(),
                AllOf(HasSubstr("f32 (3)"), HasSubstr("f32 (4)"), HasSubstr("rank 0"), HasSubstr("rank 1")));
  }
}

TEST(InProcessComm, AbortWakesEveryBlockedReceiveAndAllReduce) {
  constexpr int kRanks = 5;
  auto group = InProcessGroup::Create(kRanks);
  std::vector<absl::Status> got(kRanks);
  std::vector<std::thread> threads;
  for (int r = 1; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      auto c = group->Endpoint(r);
      if (r % 2 == 1) {
        got[r] = c->Recv(0, 7, Zeros(1), nullptr);  // nobody ever sends this
      } else {
        got[r] = c->AllReduce(Zeros(1), {0, 2, 4}, nullptr);  // rank 0 never joins
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let them block
  auto c0 = group->Endpoint(0);
  c0->Abort(absl::InternalError("stage 0, micro-batch 2, node 'x' (MatMul): boom"));
  for (std::thread& t : threads) t.join();
  for (int r = 1; r < kRanks; ++r) {
    EXPECT_TRUE(IsAbortedByPeer(got[r])) << r << ": " << got[r];
    EXPECT_THAT(got[r].message(), HasSubstr("boom"));
  }
  // The first reason stays; later calls fail too.
  c0->Abort(absl::InternalError("second"));
  EXPECT_THAT(c0->abort_status().message(), HasSubstr("boom"));
  EXPECT_TRUE(IsAbortedByPeer(c0->Send(1, 0, Vec({1}), nullptr)));
  EXPECT_TRUE(IsAbortedByPeer(c0->AllReduce(Zeros(1), {0, 1}, nullptr)));
  EXPECT_FALSE(IsAbortedByPeer(absl::InternalError("boom")));
}

TEST(InProcessComm, TimeoutsReportTheWait) {
  auto group = InProcessGroup::Create(2, /*timeout_s=*/0.05);
  auto c = group->Endpoint(1);
  absl::Status r = c->Recv(0, 9, Zeros(1), nullptr);
  EXPECT_EQ(r.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(r.message(), HasSubstr("rank 1 waited for message 9 from rank 0"));
  r = c->AllReduce(Zeros(1), {0, 1}, nullptr);
  EXPECT_EQ(r.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(r.message(), HasSubstr("rank 1: all-reduce over ranks {0, 1} waited"));
}

// Device-placed tensors (the checked backend's memory, which the host must not touch): a host
// tensor sent into a device buffer, device to device, and an all-reduce of device tensors.
TEST(InProcessComm, CopiesPlacedTensorsThroughTheBackend) {
  std::shared_ptr<const backend::Backend> be = backend::MakeCheckedBackend();
  auto group = InProcessGroup::Create(2, /*timeout_s=*/5, be);
  auto a = group->Endpoint(0), b = group->Endpoint(1);
  std::unique_ptr<backend::Stream> sa = be->CreateStream(), sb = be->CreateStream();
  absl::StatusOr<ir::Tensor> into = be->Zeros(ir::DType::kF32, {2}, sb.get());
  absl::StatusOr<ir::Tensor> dev = be->Upload(Vec({5, 6}), sa.get());
  ASSERT_TRUE(into.ok() && dev.ok());
  ASSERT_TRUE(a->Send(1, 1, Vec({1, 2}), sa.get()).ok());
  ASSERT_TRUE(a->Send(1, 2, *dev, sa.get()).ok());
  ASSERT_TRUE(b->Recv(0, 1, *into, sb.get()).ok());
  EXPECT_TRUE(be->ToHost(*into, sb.get())->BitwiseEquals(Vec({1, 2})));
  ASSERT_TRUE(b->Recv(0, 2, *into, sb.get()).ok());
  EXPECT_TRUE(be->ToHost(*into, sb.get())->BitwiseEquals(Vec({5, 6})));
  absl::Status st0;
  std::thread t0([&] { st0 = a->AllReduce(*dev, {0, 1}, sa.get()); });
  const absl::Status st1 = b->AllReduce(*into, {0, 1}, sb.get());
  t0.join();
  ASSERT_TRUE(st0.ok() && st1.ok()) << st0 << " " << st1;
  EXPECT_TRUE(be->ToHost(*dev, sa.get())->BitwiseEquals(Vec({10, 12})));
  EXPECT_TRUE(be->ToHost(*into, sb.get())->BitwiseEquals(Vec({10, 12})));
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
      ir::Tensor x = Zeros(1);
      for (auto [p, i] : recvs) {
        if (!c->Recv(p, i, x, nullptr).ok() || x.data<float>()[0] != static_cast<float>(p * 1000 + i)) ++errors;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(group->pending_messages(), 0);
}

}  // namespace
}  // namespace onnxpipe::comm
