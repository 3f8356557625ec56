// The contract of comm/comm.h, run over every implementation (as the backend contract tests run
// over every backend): the in-process group (threads) and the TCP transport (each rank a TcpComm on
// loopback, after a real rendezvous). Receives land in the caller's buffer, matched by order per
// source with the tag checked, bad ranks and shapes are errors naming both sides, grouped
// send/receive cannot deadlock,
// all-reduce is the serial sum in the group's order bit for bit on every rank, abort wakes every
// blocked call on every rank, waits time out, device-placed tensors go through the backend.
#include <atomic>
#include <cmath>
#include <map>
#include <random>
#include <thread>

#include "executor/backend/checked_backend.h"
#include "executor/comm/gather.h"
#include "executor/comm/inprocess_comm.h"
#include "executor/comm/socket.h"
#include "executor/comm/tcp_comm.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onnxpipe::comm {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

ir::Tensor Vec(std::vector<float> v) { return ir::Tensor::FromVector<float>({static_cast<int64_t>(v.size())}, v); }
ir::Tensor Zeros(int64_t n) { return ir::Tensor(ir::DType::kF32, {n}); }

// A free TCP port on loopback (bound, read and released; the rendezvous binds it again).
int FreePort() {
  absl::StatusOr<Socket> s = Listen("127.0.0.1", 0);
  EXPECT_TRUE(s.ok()) << s.status();
  absl::StatusOr<int> port = s.ok() ? BoundPort(*s) : absl::StatusOr<int>(0);
  return port.ok() ? *port : 0;
}

enum class Impl { kInProcess, kTcp };

class CommConformance : public ::testing::TestWithParam<Impl> {
 protected:
  // One endpoint per rank of a world of `n`.
  // The ranks of one world; they are closed together, as processes that finish a job are (a TCP rank
  // waits briefly for its peers' goodbyes).
  struct Ranks : std::vector<std::unique_ptr<Comm>> {
    using std::vector<std::unique_ptr<Comm>>::vector;
    Ranks(Ranks&&) = default;
    ~Ranks() {
      std::vector<std::thread> closing;
      for (std::unique_ptr<Comm>& c : *this) closing.emplace_back([&c] { c.reset(); });
      for (std::thread& t : closing) t.join();
    }
  };

  Ranks World(int n, double timeout_s = 0, std::shared_ptr<const backend::Backend> be = nullptr) {
    Ranks w(n);
    if (GetParam() == Impl::kInProcess) {
      auto group = InProcessGroup::Create(n, timeout_s, be);
      for (int r = 0; r < n; ++r) w[r] = group->Endpoint(r);
      return w;
    }
    const int port = FreePort();
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        TcpCommOptions o;
        o.rendezvous = {"127.0.0.1", port, r, n, /*timeout_s=*/30};
        o.timeout_s = timeout_s;
        o.backend = be;
        absl::StatusOr<std::unique_ptr<TcpComm>> c = TcpComm::Create(o);
        if (c.ok()) {
          w[r] = *std::move(c);
        } else {
          ADD_FAILURE() << "rank " << r << ": " << c.status();
        }
      });
    }
    for (std::thread& t : threads) t.join();
    return w;
  }
};

INSTANTIATE_TEST_SUITE_P(Impls, CommConformance, ::testing::Values(Impl::kInProcess, Impl::kTcp),
                         [](const auto& info) { return info.param == Impl::kTcp ? "Tcp" : "InProcess"; });

TEST_P(CommConformance, ReceivesIntoTheCallersBufferAcrossThreads) {
  auto w = World(2);
  ir::Tensor into = Zeros(3);
  const void* slot = into.address();
  std::thread sender([&] {
    ir::Tensor t = Vec({1, 2, 3});
    ASSERT_TRUE(w[0]->Send(1, 42, t, nullptr).ok());
    t.mutable_data<float>()[2] = 99;  // the message is what t held when it was sent
  });
  sender.join();
  ASSERT_TRUE(w[1]->Recv(0, 42, into, nullptr).ok());
  EXPECT_EQ(into.address(), slot);
  EXPECT_EQ(into.data<float>()[0], 1.0f);
  EXPECT_EQ(into.data<float>()[2], 3.0f);
  EXPECT_EQ(w[0]->bytes_sent(), 12);
  EXPECT_EQ(w[1]->bytes_received(), 12);
}

TEST_P(CommConformance, MatchesByOrderPerSourceAndChecksTheTag) {
  auto w = World(3);
  ASSERT_TRUE(w[0]->Send(2, 1, Vec({10}), nullptr).ok());
  ASSERT_TRUE(w[1]->Send(2, 1, Vec({20}), nullptr).ok());
  ASSERT_TRUE(w[0]->Send(2, 2, Vec({30}), nullptr).ok());
  ir::Tensor x = Zeros(1);
  // Sources in any order; one source's messages in the order it sent them.
  ASSERT_TRUE(w[2]->Recv(1, 1, x, nullptr).ok());
  EXPECT_EQ(x.data<float>()[0], 20.0f);
  // Asking for rank 0's second message first is two sides posting in different orders: an error naming both tags.
  const absl::Status st = w[2]->Recv(0, 2, x, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(st.message(), ::testing::AllOf(::testing::HasSubstr("receiving message 2 from rank 0"),
                                             ::testing::HasSubstr("the next message from rank 0 is message 1")));
  ASSERT_TRUE(w[2]->Recv(0, 1, x, nullptr).ok());
  EXPECT_EQ(x.data<float>()[0], 10.0f);
  ASSERT_TRUE(w[2]->Recv(0, 2, x, nullptr).ok());
  EXPECT_EQ(x.data<float>()[0], 30.0f);
}

TEST_P(CommConformance, RejectsBadRanksAndBuffers) {
  auto w = World(2);
  Comm& r0 = *w[0];
  ir::Tensor x = Zeros(1);
  EXPECT_EQ(r0.rank(), 0);
  EXPECT_EQ(r0.size(), 2);
  EXPECT_THAT(r0.Send(5, 0, Vec({1}), nullptr).message(), HasSubstr("sends to rank 5"));
  EXPECT_THAT(r0.Send(0, 0, Vec({1}), nullptr).message(), HasSubstr("sends to rank 0"));
  EXPECT_THAT(r0.Recv(-1, 0, x, nullptr).message(), HasSubstr("receives from rank -1"));
  EXPECT_THAT(r0.Recv(1, 0, ir::Tensor(), nullptr).message(), HasSubstr("without storage"));
  EXPECT_THAT(r0.AllReduce(x, {1}, nullptr).message(), HasSubstr("does not include it"));
  EXPECT_THAT(r0.AllReduce(x, {0, 0}, nullptr).message(), HasSubstr("distinct"));
  EXPECT_THAT(r0.GroupEnd().message(), HasSubstr("GroupEnd without GroupStart"));
  ASSERT_TRUE(r0.GroupStart().ok());
  EXPECT_THAT(r0.AllReduce(x, {0, 1}, nullptr).message(), HasSubstr("between GroupStart and GroupEnd"));
  EXPECT_TRUE(r0.GroupEnd().ok());
}

TEST_P(CommConformance, AShapeOrDTypeMismatchNamesTheSenderAndTheBuffer) {
  auto w = World(2);
  ASSERT_TRUE(w[0]->Send(1, 7, ir::Tensor(ir::DType::kF32, {2, 3}), nullptr).ok());
  absl::Status st = w[1]->Recv(0, 7, ir::Tensor(ir::DType::kF32, {3, 2}), nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(),
              AllOf(HasSubstr("rank 1 receiving message 7 from rank 0"), HasSubstr("sender's tensor is f32 (2, 3)"),
                    HasSubstr("receive buffer is f32 (3, 2)")));
  ASSERT_TRUE(w[0]->Send(1, 8, ir::Tensor(ir::DType::kF32, {4}), nullptr).ok());
  st = w[1]->Recv(0, 8, ir::Tensor(ir::DType::kF64, {4}), nullptr);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("f32 (4)"), HasSubstr("f64 (4)")));
}

// Both ranks post the receive before the send: issued one by one, each would wait for a message
// the other has not sent yet. Grouped, they are issued together at GroupEnd.
TEST_P(CommConformance, GroupedSendAndReceiveInBothDirectionsDoNotDeadlock) {
  auto w = World(2, /*timeout_s=*/5);
  std::vector<absl::Status> st(2);
  std::vector<ir::Tensor> got = {Zeros(2), Zeros(2)};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      Comm& c = *w[r];
      const int peer = 1 - r;
      for (int step = 0; step < 3; ++step) {  // e.g. 1F1B's send-forward + receive-backward
        absl::Status s = c.GroupStart();
        if (s.ok()) s = c.Recv(peer, step, got[r], nullptr);
        if (s.ok()) s = c.Send(peer, step, Vec({static_cast<float>(r), static_cast<float>(step)}), nullptr);
        absl::Status end = c.GroupEnd();
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

TEST_P(CommConformance, AllReduceIsTheSerialSumInTheGroupsOrderOnEveryRank) {
  constexpr int64_t kN = 257;
  const int world = 3;  // a group may be a subset of the ranks
  auto w = World(world, /*timeout_s=*/5);
  for (const std::vector<int>& order : std::vector<std::vector<int>>{{0, 1}, {1, 0}, {0, 1, 2}, {2, 0, 1}, {1, 2, 0}}) {
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
    for (int r : order) threads.emplace_back([&, r] { st[r] = w[r]->AllReduce(t[r], order, nullptr); });
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

TEST_P(CommConformance, AllReducesOfAGroupMatchInCallOrder) {
  auto w = World(2, /*timeout_s=*/5);
  std::vector<ir::Tensor> first = {Vec({1}), Vec({2})}, second = {Vec({10, 10}), Vec({20, 20})};
  std::vector<absl::Status> st(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      st[r] = w[r]->AllReduce(first[r], {0, 1}, nullptr);
      if (st[r].ok()) st[r] = w[r]->AllReduce(second[r], {0, 1}, nullptr);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r];
    EXPECT_EQ(first[r].data<float>()[0], 3.0f);
    EXPECT_EQ(second[r].data<float>()[1], 30.0f);
  }
}

TEST_P(CommConformance, AllReduceShapeMismatchFailsEveryMemberNamingBoth) {
  auto w = World(2, /*timeout_s=*/5);
  std::vector<ir::Tensor> t = {Zeros(3), Zeros(4)};
  std::vector<absl::Status> st(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) threads.emplace_back([&, r] { st[r] = w[r]->AllReduce(t[r], {0, 1}, nullptr); });
  for (std::thread& th : threads) th.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), absl::StatusCode::kInvalidArgument) << st[r];
    EXPECT_THAT(st[r].message(),
                AllOf(HasSubstr("f32 (3)"), HasSubstr("f32 (4)"), HasSubstr("rank 0"), HasSubstr("rank 1")));
  }
}

TEST_P(CommConformance, AbortWakesEveryBlockedReceiveAndAllReduce) {
  constexpr int kRanks = 5;
  auto w = World(kRanks);
  std::vector<absl::Status> got(kRanks);
  std::vector<std::thread> threads;
  for (int r = 1; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      if (r % 2 == 1) {
        got[r] = w[r]->Recv(0, 7, Zeros(1), nullptr);  // nobody ever sends this
      } else {
        got[r] = w[r]->AllReduce(Zeros(1), {0, 2, 4}, nullptr);  // rank 0 never joins
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let them block
  w[0]->Abort(absl::InternalError("stage 0, micro-batch 2, node 'x' (MatMul): boom"));
  for (std::thread& t : threads) t.join();
  for (int r = 1; r < kRanks; ++r) {
    EXPECT_TRUE(IsAbortedByPeer(got[r])) << r << ": " << got[r];
    EXPECT_THAT(got[r].message(), HasSubstr("boom"));
  }
  // The first reason stays; later calls fail too.
  w[0]->Abort(absl::InternalError("second"));
  EXPECT_THAT(w[0]->abort_status().message(), HasSubstr("boom"));
  EXPECT_TRUE(IsAbortedByPeer(w[0]->Send(1, 0, Vec({1}), nullptr)));
  EXPECT_TRUE(IsAbortedByPeer(w[0]->AllReduce(Zeros(1), {0, 1}, nullptr)));
  EXPECT_FALSE(IsAbortedByPeer(absl::InternalError("boom")));
}

TEST_P(CommConformance, TimeoutsReportTheWait) {
  auto w = World(2, /*timeout_s=*/0.05);
  absl::Status r = w[1]->Recv(0, 9, Zeros(1), nullptr);
  EXPECT_EQ(r.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(r.message(), AllOf(HasSubstr("rank 1"), HasSubstr("message 9 from rank 0"), HasSubstr("waited")));
  r = w[1]->AllReduce(Zeros(1), {0, 1}, nullptr);
  EXPECT_EQ(r.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(r.message(), AllOf(HasSubstr("rank 1: all-reduce over ranks {0, 1}"), HasSubstr("waited")));
}

// Device-placed tensors (the checked backend's memory, which the host must not touch): a host
// tensor sent into a device buffer, device to device, and an all-reduce of device tensors.
TEST_P(CommConformance, CopiesPlacedTensorsThroughTheBackend) {
  std::shared_ptr<const backend::Backend> be = backend::MakeCheckedBackend();
  auto w = World(2, /*timeout_s=*/5, be);
  Comm &a = *w[0], &b = *w[1];
  std::unique_ptr<backend::Stream> sa = be->CreateStream(), sb = be->CreateStream();
  absl::StatusOr<ir::Tensor> into = be->Zeros(ir::DType::kF32, {2}, sb.get());
  absl::StatusOr<ir::Tensor> dev = be->Upload(Vec({5, 6}), sa.get());
  ASSERT_TRUE(into.ok() && dev.ok());
  ASSERT_TRUE(a.Send(1, 1, Vec({1, 2}), sa.get()).ok());
  ASSERT_TRUE(a.Send(1, 2, *dev, sa.get()).ok());
  ASSERT_TRUE(b.Recv(0, 1, *into, sb.get()).ok());
  EXPECT_TRUE(be->ToHost(*into, sb.get())->BitwiseEquals(Vec({1, 2})));
  ASSERT_TRUE(b.Recv(0, 2, *into, sb.get()).ok());
  EXPECT_TRUE(be->ToHost(*into, sb.get())->BitwiseEquals(Vec({5, 6})));
  absl::Status st0;
  std::thread t0([&] { st0 = a.AllReduce(*dev, {0, 1}, sa.get()); });
  const absl::Status st1 = b.AllReduce(*into, {0, 1}, sb.get());
  t0.join();
  ASSERT_TRUE(st0.ok() && st1.ok()) << st0 << " " << st1;
  EXPECT_TRUE(be->ToHost(*dev, sa.get())->BitwiseEquals(Vec({10, 12})));
  EXPECT_TRUE(be->ToHost(*into, sb.get())->BitwiseEquals(Vec({10, 12})));
}

TEST_P(CommConformance, ManyThreadsExchangeEveryMessage) {
  // Every rank sends 200 tagged messages to every other rank, the peers interleaved at random, and
  // receives them with the peers interleaved in another random order (each peer's in its order); every
  // value must arrive exactly once, in order.
  constexpr int kRanks = 5, kPerPair = 200;
  auto w = World(kRanks);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      Comm& c = *w[r];
      std::mt19937 rng(r);
      std::vector<std::pair<int, int>> sends, recvs;
      for (int p = 0; p < kRanks; ++p) {
        if (p == r) continue;
        for (int i = 0; i < kPerPair; ++i) {
          sends.push_back({p, i});
          recvs.push_back({p, i});
        }
      }
      // A random interleaving of the peers that keeps each peer's messages in order.
      auto interleave = [&](std::vector<std::pair<int, int>>& v) {
        std::vector<int> peers;
        for (auto [p, i] : v) peers.push_back(p);
        std::shuffle(peers.begin(), peers.end(), rng);
        std::map<int, int> next;
        for (size_t k = 0; k < v.size(); ++k) v[k] = {peers[k], next[peers[k]]++};
      };
      interleave(sends);
      interleave(recvs);
      for (auto [p, i] : sends)
        if (!c.Send(p, i, Vec({static_cast<float>(r * 1000 + i)}), nullptr).ok()) ++errors;
      ir::Tensor x = Zeros(1);
      for (auto [p, i] : recvs) {
        if (!c.Recv(p, i, x, nullptr).ok() || x.data<float>()[0] != static_cast<float>(p * 1000 + i)) ++errors;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
}

// Rank 0 collects every rank's named tensors (a multi-process checkpoint); the first holder of a shared name wins.
TEST_P(CommConformance, GatherCollectsNamedTensorsOnTheRoot) {
  auto w = World(3, /*timeout_s=*/10);
  std::vector<NamedTensors> local(3);
  local[0]["a"] = Vec({1, 2});
  local[1]["b"] = ir::Tensor::FromVector<int64_t>({2, 2}, {1, 2, 3, 4});
  local[1]["shared"] = Vec({7});
  local[2]["shared"] = Vec({8});
  local[2]["c"] = ir::Tensor::Scalar<double>(0.5);
  std::vector<absl::StatusOr<NamedTensors>> got(3, absl::UnknownError(""));
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] { got[r] = GatherNamedTensors(*w[r], {1, 2}, 0, 1000, local[r]); });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(got[0].ok()) << got[0].status();
  ASSERT_EQ(got[0]->size(), 4u);
  EXPECT_TRUE(got[0]->at("a").BitwiseEquals(local[0]["a"]));
  EXPECT_TRUE(got[0]->at("b").BitwiseEquals(local[1]["b"]));
  EXPECT_TRUE(got[0]->at("c").BitwiseEquals(local[2]["c"]));
  EXPECT_TRUE(got[0]->at("shared").BitwiseEquals(Vec({7})));
  for (int r : {1, 2}) {
    ASSERT_TRUE(got[r].ok()) << got[r].status();
    EXPECT_EQ(got[r]->size(), local[r].size());
  }
}

}  // namespace
}  // namespace onnxpipe::comm
