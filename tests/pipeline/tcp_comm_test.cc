// What only the TCP transport does: the rendezvous's errors (a rank that never arrives, a world size
// two ranks disagree on, a master nobody can reach), and peers that leave: one killed mid-run (a
// child process that exits without its goodbye) aborts the group naming it, one that said goodbye
// fails a receive from it instead of leaving it waiting.
#include "executor/comm/tcp_comm.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "executor/comm/rendezvous.h"
#include "executor/comm/socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onnxpipe::comm {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

int FreePort() {
  absl::StatusOr<Socket> s = Listen("127.0.0.1", 0);
  return s.ok() ? BoundPort(*s).value_or(0) : 0;
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(Rendezvous, ARankThatNeverArrivesIsNamedAtTheTimeout) {
  const int port = FreePort();
  std::vector<absl::StatusOr<std::vector<RendezvousPeer>>> got(3, absl::UnknownError(""));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r : {0, 1}) {  // rank 2 never comes
    threads.emplace_back([&, r] { got[r] = Rendezvous({"127.0.0.1", port, r, 3, /*timeout_s=*/1.0}, "x"); });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LT(SecondsSince(t0), 10);
  EXPECT_THAT(got[0].status().message(), AllOf(HasSubstr("rank(s) 2 of 3 did not arrive"), HasSubstr("1 s")));
  EXPECT_THAT(got[1].status().message(), HasSubstr("rank(s) 2 of 3 did not arrive"));
}

TEST(Rendezvous, GivesEveryRankTheSameTableAndRejectsADisagreement) {
  const int port = FreePort();
  std::vector<absl::StatusOr<std::vector<RendezvousPeer>>> got(3, absl::UnknownError(""));
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] { got[r] = Rendezvous({"127.0.0.1", port, r, 3, 10}, "blob" + std::to_string(r)); });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(got[r].ok()) << got[r].status();
    ASSERT_EQ(got[r]->size(), 3u);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ((*got[r])[k].blob, "blob" + std::to_string(k));
      EXPECT_EQ((*got[r])[k].host, "127.0.0.1");
    }
  }
  const int port2 = FreePort();
  threads.clear();
  threads.emplace_back([&] { got[0] = Rendezvous({"127.0.0.1", port2, 0, 2, 10}, ""); });
  threads.emplace_back([&] { got[1] = Rendezvous({"127.0.0.1", port2, 1, 3, 10}, ""); });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 2; ++r) EXPECT_THAT(got[r].status().message(), HasSubstr("world size is 3, rank 0 says 2"));
}

TEST(Rendezvous, AMasterNobodyCanReachIsAClearError) {
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<RendezvousPeer>> got = Rendezvous({"127.0.0.1", FreePort(), 1, 2, 0.5}, "");
  EXPECT_LT(SecondsSince(t0), 10);
  EXPECT_THAT(got.status().message(), AllOf(HasSubstr("rank 1 could not reach rank 0"), HasSubstr("MASTER_ADDR")));
  EXPECT_THAT(Rendezvous({"127.0.0.1", 0, 0, 2, 1}, "").status().message(), HasSubstr("not a TCP port"));
  EXPECT_THAT(Rendezvous({"127.0.0.1", 1234, 2, 2, 1}, "").status().message(), HasSubstr("not a rank"));
}

// Rank 1 is a child process that joins, sends one message and dies without a goodbye (as kill -9
// would leave it): rank 0, waiting for a second message, fails at once naming rank 1.
TEST(TcpComm, AKilledPeerAbortsTheGroupNamingIt) {
  const int port = FreePort();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    TcpCommOptions o;
    o.rendezvous = {"127.0.0.1", port, 1, 2, 10};
    absl::StatusOr<std::unique_ptr<TcpComm>> c = TcpComm::Create(o);
    if (c.ok()) (void)(*c)->Send(0, 1, ir::Tensor::Scalar<float>(7), nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    _exit(c.ok() ? 0 : 3);  // no destructor: no goodbye
  }
  TcpCommOptions o;
  o.rendezvous = {"127.0.0.1", port, 0, 2, 10};
  absl::StatusOr<std::unique_ptr<TcpComm>> c = TcpComm::Create(o);
  ASSERT_TRUE(c.ok()) << c.status();
  ir::Tensor x = ir::Tensor::Scalar<float>(0);
  ASSERT_TRUE((*c)->Recv(1, 1, x, nullptr).ok());
  EXPECT_EQ(x.data<float>()[0], 7.0f);
  const auto t0 = std::chrono::steady_clock::now();
  const absl::Status st = (*c)->Recv(1, 2, x, nullptr);
  EXPECT_LT(SecondsSince(t0), 10);
  EXPECT_TRUE(IsAbortedByPeer(st)) << st;
  EXPECT_THAT(st.message(), AllOf(HasSubstr("rank 1 is gone"), HasSubstr("without a goodbye")));
  int wstatus = 0;
  waitpid(child, &wstatus, 0);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
}

TEST(TcpComm, AReceiveFromAPeerThatLeftFailsInsteadOfWaiting) {
  const int port = FreePort();
  std::unique_ptr<TcpComm> c0;
  std::thread t1([&] {
    TcpCommOptions o;
    o.rendezvous = {"127.0.0.1", port, 1, 2, 10};
    absl::StatusOr<std::unique_ptr<TcpComm>> c1 = TcpComm::Create(o);
    ASSERT_TRUE(c1.ok()) << c1.status();
    // Goes out of scope: says goodbye.
  });
  TcpCommOptions o;
  o.rendezvous = {"127.0.0.1", port, 0, 2, 10};
  absl::StatusOr<std::unique_ptr<TcpComm>> c = TcpComm::Create(o);
  t1.join();
  ASSERT_TRUE(c.ok()) << c.status();
  ir::Tensor x = ir::Tensor::Scalar<float>(0);
  const absl::Status st = (*c)->Recv(1, 5, x, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(st.message(), HasSubstr("rank 1 has finished and left"));
}

}  // namespace
}  // namespace onnxpipe::comm
