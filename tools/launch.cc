// onnxpipe launch: starts the local ranks of a multi-process run and supervises them, as torchrun does for PyTorch:
// each rank is this binary running the given command with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR and MASTER_PORT set (tools/distributed.h reads them). SIGINT and SIGTERM are forwarded to every rank
// once (the ranks run in their own process group, so a terminal's Ctrl-C reaches them only through here); a rank
// that fails gives the others a grace period to stop on their own (they abort when a peer fails), then they are
// killed; the launcher exits with the first failing rank's code, naming it. Ranks die with the launcher.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "executor/comm/socket.h"
#include "tools/commands.h"
#include "tools/flags.h"

namespace onnxpipe::tools {
namespace {

volatile sig_atomic_t g_forward = 0;  // a signal to pass on to the ranks, or 0

void OnSignal(int sig) { g_forward = sig; }

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  bool done = false;
  int code = 0;  // exit code, or 128 + signal
};

pid_t StartRank(const std::vector<std::string>& command, const std::vector<std::pair<std::string, std::string>>& env) {
  const pid_t launcher = getpid();
  const pid_t pid = fork();
  if (pid != 0) return pid;
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(127);  // the launcher is already gone
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  std::vector<char*> argv;
  static char self[] = "onnxpipe";
  argv.push_back(self);
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execv("/proc/self/exe", argv.data());
  std::fprintf(stderr, "onnxpipe launch: cannot start a rank: %s\n", std::strerror(errno));
  _exit(127);
}

std::string Describe(const Rank& r) {
  if (r.code > 128) {
    return "rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + ") was killed by signal " +
           std::to_string(r.code - 128) + " (" + strsignal(r.code - 128) + ")";
  }
  return "rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + ") exited with code " +
         std::to_string(r.code);
}

int Supervise(std::vector<Rank>& ranks, double grace_s) {
  using Clock = std::chrono::steady_clock;
  std::optional<Rank> first_failure;
  bool killing = false;  // a rank failed: the others are killed at kill_at
  Clock::time_point kill_at = Clock::now();
  size_t running = ranks.size();
  while (running > 0) {
    if (const int sig = g_forward; sig != 0) {
      g_forward = 0;
      std::fprintf(stderr, "onnxpipe launch: passing %s on to the ranks\n", strsignal(sig));
      for (const Rank& r : ranks) {
        if (!r.done) kill(r.pid, sig);
      }
    }
    // Every rank that ended since the last poll. Of those that failed, one killed by a signal is named first: the
    // others usually exited because they lost it (a killed rank's peers notice within milliseconds).
    std::vector<Rank*> ended;
    for (int status = 0;;) {
      const pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      for (Rank& r : ranks) {
        if (r.pid != pid || r.done) continue;
        r.done = true;
        --running;
        r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        ended.push_back(&r);
      }
    }
    std::stable_sort(ended.begin(), ended.end(),
                     [](const Rank* a, const Rank* b) { return a->code > 128 && b->code <= 128; });
    for (const Rank* r : ended) {
      if (r->code == 0 || first_failure) continue;
      first_failure = *r;
      std::fprintf(stderr, "onnxpipe launch: %s; the other ranks get %.0f s to stop\n", Describe(*r).c_str(), grace_s);
      killing = true;
      kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_s));
    }
    if (!ended.empty()) continue;
    if (killing && Clock::now() >= kill_at) {
      for (const Rank& r : ranks) {
        if (r.done) continue;
        std::fprintf(stderr, "onnxpipe launch: rank %d (pid %d) did not stop; killing it\n", r.rank, r.pid);
        kill(r.pid, SIGKILL);
      }
      killing = false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!first_failure) return 0;
  std::fprintf(stderr, "onnxpipe launch: failed: %s\n", Describe(*first_failure).c_str());
  return first_failure->code > 128 ? 1 : first_failure->code;
}

}  // namespace

int RunLaunch(const Args& all) {
  int64_t nproc = 0, nnodes = 1, node_rank = 0, master_port = 0;
  std::string master_addr = "127.0.0.1";
  double grace = 10;
  FlagSet fs("launch", "--nproc N [--nnodes n --node-rank i --master-addr HOST --master-port P] -- COMMAND [flags]",
             "Starts N ranks of an onnxpipe command on this node and supervises them (as torchrun does): rank\n"
             "node_rank * N + i runs `onnxpipe COMMAND` with RANK, WORLD_SIZE (nnodes * N), LOCAL_RANK (i, the GPU\n"
             "of --backend cuda), LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set. Every node runs the same\n"
             "launch with its --node-rank; rank 0 (node 0) listens on MASTER_ADDR:MASTER_PORT. SIGINT/SIGTERM\n"
             "are passed on to every rank; when a rank fails the others get --grace seconds to stop before\n"
             "they are killed, and the launcher exits non-zero naming the rank. Example:\n"
             "  onnxpipe launch --nproc 4 -- train model.onnx --data d --batch 64 --steps 100 --lr 1e-3\n"
             "(4 stages, one process each; add --data-parallel D to train D replicas of N / D stages)");
  fs.Int("nproc", &nproc, "ranks to start on this node");
  fs.Int("nnodes", &nnodes, "nodes of the run (each runs one launch)");
  fs.Int("node-rank", &node_rank, "this node's index in 0..nnodes-1");
  fs.String("master-addr", &master_addr, "the address of node 0, where rank 0 listens");
  fs.Int("master-port", &master_port, "the port rank 0 listens on (default: a free one on one node, else 29500)");
  fs.Double("grace", &grace, "seconds the ranks get to stop after one fails, before they are killed");
  Args flags = all, command;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i] != "--") continue;
    flags.assign(all.begin(), all.begin() + i);
    command.assign(all.begin() + i + 1, all.end());
    break;
  }
  if (absl::Status st = fs.Parse(flags); !st.ok()) return Fail("launch", std::string(st.message()), 2);
  if (fs.help_requested()) {
    std::printf("%s", fs.Usage().c_str());
    return 0;
  }
  if (!fs.positional().empty()) {
    return Fail("launch", "unexpected '" + fs.positional()[0] + "': put the command after -- (see --help)", 2);
  }
  if (command.empty()) return Fail("launch", "no command: give it after --, e.g. -- train model.onnx ...", 2);
  if (command[0] == "launch") return Fail("launch", "the command after -- cannot be launch itself", 2);
  if (nproc < 1) return Fail("launch", "--nproc must be >= 1", 2);
  if (nnodes < 1) return Fail("launch", "--nnodes must be >= 1", 2);
  if (node_rank < 0 || node_rank >= nnodes) {
    return Fail("launch", "--node-rank must be in 0.." + std::to_string(nnodes - 1), 2);
  }
  if (grace < 0) return Fail("launch", "--grace must be >= 0", 2);
  if (!fs.WasSet("master-port")) {
    master_port = 29500;
    if (nnodes == 1) {  // a free port, so that runs on one machine do not collide
      absl::StatusOr<comm::Socket> s = comm::Listen("127.0.0.1", 0);
      if (s.ok()) master_port = comm::BoundPort(*s).value_or(29500);
    }
  }
  if (master_port < 1 || master_port > 65535) return Fail("launch", "--master-port must be in 1..65535", 2);

  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::vector<Rank> ranks;
  const int64_t world = nnodes * nproc;
  for (int64_t i = 0; i < nproc; ++i) {
    Rank r;
    r.rank = static_cast<int>(node_rank * nproc + i);
    r.pid = StartRank(command, {{"RANK", std::to_string(r.rank)},
                                {"WORLD_SIZE", std::to_string(world)},
                                {"LOCAL_RANK", std::to_string(i)},
                                {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
                                {"MASTER_ADDR", master_addr},
                                {"MASTER_PORT", std::to_string(master_port)}});
    if (r.pid < 0) {
      std::fprintf(stderr, "onnxpipe launch: fork failed: %s\n", std::strerror(errno));
      g_forward = SIGTERM;
      break;
    }
    std::fprintf(stderr, "onnxpipe launch: rank %d of %lld: pid %d\n", r.rank, static_cast<long long>(world), r.pid);
    ranks.push_back(r);
  }
  return Supervise(ranks, grace);
}

}  // namespace onnxpipe::tools
