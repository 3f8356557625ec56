// What only the in-process comm does: stream order by events (the receiver's stream waits for the
// sender's), the staging pool kept across groups, and NCCL's semantics for tests (held sends, a send
// waiting for its receive). The behaviour every Comm shares is in comm_conformance_test.cc.
#include <thread>

#include "executor/backend/checked_backend.h"
#include "executor/comm/inprocess_comm.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onnxpipe::comm {
namespace {

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
  ASSERT_TRUE(b->Recv(0, 1, into, &receiver).ok());
  ASSERT_TRUE(b->Recv(0, 2, into, &receiver).ok());
  EXPECT_EQ(receiver.waited, (std::vector<int>{1, 2}));  // each message's own event
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

// NCCL's semantics: a send made outside a group is held (its tensor copied at once) and goes out with the rank's next
// receive, group or Flush, and a group returns once its sends are received. Two ranks that each send first and then
// receive, each in its own group, deadlock (here: both time out); held sends riding with the next receive complete.
TEST(InProcessComm, UnderNcclSemanticsSendsAreHeldAndGoOutWithTheNextReceive) {
  {
    auto group = InProcessGroup::Create(2, /*timeout_s=*/0.3);
    group->UseNcclSemantics();
    std::unique_ptr<Comm> a = group->Endpoint(0), b = group->Endpoint(1);
    ir::Tensor x = Vec({1, 2}), y = Vec({3, 4});
    ASSERT_TRUE(a->Send(1, 7, x, nullptr).ok());
    x.mutable_data<float>()[0] = 100;  // the message is x as it was at the Send
    EXPECT_EQ(group->pending_messages(), 0);  // held: nothing is posted yet
    ir::Tensor at_a = Zeros(2), at_b = Zeros(2);
    absl::Status sa, sb;
    std::thread ta([&] { sa = a->Recv(1, 8, at_a, nullptr); });  // a's held send goes out with this receive
    std::thread tb([&] {
      sb = b->Send(0, 8, y, nullptr);
      if (sb.ok()) sb = b->Recv(0, 7, at_b, nullptr);
    });
    ta.join();
    tb.join();
    ASSERT_TRUE(sa.ok()) << sa;
    ASSERT_TRUE(sb.ok()) << sb;
    EXPECT_EQ(at_a.data<float>()[1], 4.0f);
    EXPECT_EQ(at_b.data<float>()[0], 1.0f);
    EXPECT_EQ(group->pending_messages(), 0);
  }
  {
    // Each rank flushes its send before receiving: the sends wait for receives never posted.
    auto group = InProcessGroup::Create(2, /*timeout_s=*/0.3);
    group->UseNcclSemantics();
    std::unique_ptr<Comm> a = group->Endpoint(0), b = group->Endpoint(1);
    absl::Status st[2];
    std::thread t0([&] {
      st[0] = a->Send(1, 1, Vec({1}), nullptr);
      if (st[0].ok()) st[0] = a->Flush();
    });
    std::thread t1([&] {
      st[1] = b->Send(0, 2, Vec({2}), nullptr);
      if (st[1].ok()) st[1] = b->Flush();
    });
    t0.join();
    t1.join();
    for (const absl::Status& s : st) {
      EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
      EXPECT_THAT(s.message(), HasSubstr("waited for its sends to be received"));
    }
  }
}

TEST(InProcessComm, FlushIsANoOpWhereSendsGoOutAtOnce) {
  auto group = InProcessGroup::Create(2);
  std::unique_ptr<Comm> a = group->Endpoint(0), b = group->Endpoint(1);
  ASSERT_TRUE(a->Send(1, 1, Vec({5}), nullptr).ok());
  EXPECT_EQ(group->pending_messages(), 1);  // posted at once
  ASSERT_TRUE(a->Flush().ok());
  ir::Tensor into = Zeros(1);
  ASSERT_TRUE(b->Recv(0, 1, into, nullptr).ok());
  EXPECT_EQ(into.data<float>()[0], 5.0f);
}

}  // namespace
}  // namespace onnxpipe::comm
