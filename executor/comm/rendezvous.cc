// Wire format (little-endian u64 and length-prefixed strings, socket.h): a rank sends
// [magic][rank][world_size][blob]; rank 0 answers [verdict] and, when the verdict is empty (all
// is well), world_size x [host][blob]. A non-empty verdict is the error every rank reports, so a
// misconfigured launch fails the same way everywhere.
#include "executor/comm/rendezvous.h"

#include <algorithm>
#include <map>
#include <set>

#include "executor/comm/socket.h"

namespace onnxpipe::comm {
namespace {

constexpr char kMagic[] = "onnxpipe-rendezvous-1";

std::string Where(const RendezvousOptions& o) {
  return "rendezvous at " + o.master_addr + ":" + std::to_string(o.master_port);
}

std::string Missing(const std::map<int, Socket>& arrived, int world) {
  std::string s;
  int listed = 0;
  for (int r = 1; r < world; ++r) {
    if (arrived.count(r)) continue;
    if (listed++ == 8) {
      s += ", ...";
      break;
    }
    s += (s.empty() ? "" : ", ") + std::to_string(r);
  }
  return s;
}

absl::StatusOr<std::vector<RendezvousPeer>> Master(const RendezvousOptions& o, const std::string& blob) {
  const Deadline deadline = DeadlineIn(o.timeout_s);
  std::vector<RendezvousPeer> peers(o.world_size);
  peers[0].blob = blob;
  peers[0].host = "127.0.0.1";
  if (o.world_size == 1) return peers;
  absl::StatusOr<Socket> listener = Listen("", o.master_port);
  if (!listener.ok()) {
    return COMM_ERROR(kUnavailable) << Where(o) << ": rank 0 " << listener.status().message()
                                    << " (is another job using --master-port " << o.master_port << "?)";
  }
  std::map<int, Socket> arrived;
  std::string verdict;
  while (static_cast<int>(arrived.size()) < o.world_size - 1 && verdict.empty()) {
    absl::StatusOr<Socket> c = Accept(*listener, deadline);
    if (!c.ok()) {
      verdict = Where(o) + ": rank(s) " + Missing(arrived, o.world_size) + " of " + std::to_string(o.world_size) +
                " did not arrive within " + std::to_string(static_cast<int>(o.timeout_s)) +
                " s (see --rendezvous-timeout)";
      break;
    }
    const std::string what = Where(o) + ": a rank's greeting";
    absl::StatusOr<std::string> magic = ReadString(*c, what, deadline, 64);
    if (!magic.ok() || *magic != kMagic) continue;  // not one of ours: ignore it
    char nums[16];
    if (!ReadAll(*c, nums, 16, what, deadline).ok()) continue;
    absl::StatusOr<std::string> their_blob = ReadString(*c, what, deadline);
    if (!their_blob.ok()) continue;
    const int rank = static_cast<int>(GetU64(nums)), world = static_cast<int>(GetU64(nums + 8));
    if (world != o.world_size) {
      verdict = Where(o) + ": rank " + std::to_string(rank) + " says the world size is " + std::to_string(world) +
                ", rank 0 says " + std::to_string(o.world_size);
    } else if (rank <= 0 || rank >= world) {
      verdict = Where(o) + ": a rank numbered " + std::to_string(rank) + " arrived; ranks are 1.." +
                std::to_string(world - 1) + " besides rank 0";
    } else if (arrived.count(rank)) {
      verdict = Where(o) + ": two processes claim rank " + std::to_string(rank);
    }
    absl::StatusOr<std::string> host = PeerAddress(*c);
    if (host.ok()) peers[std::max(0, std::min(rank, world - 1))].host = *host;
    if (absl::StatusOr<std::string> self = LocalAddress(*c); self.ok()) peers[0].host = *self;
    if (verdict.empty()) {
      peers[rank].blob = *their_blob;
      arrived.emplace(rank, *std::move(c));
    } else {
      (void)WriteString(*c, verdict, "");
    }
  }
  for (auto& [rank, c] : arrived) {
    absl::Status st = WriteString(c, verdict, Where(o) + ": answering rank " + std::to_string(rank));
    for (size_t i = 0; st.ok() && verdict.empty() && i < peers.size(); ++i) {
      st = WriteString(c, peers[i].host, "answering");
      if (st.ok()) st = WriteString(c, peers[i].blob, "answering");
    }
  }
  if (!verdict.empty()) return COMM_ERROR(kDeadlineExceeded) << verdict;
  return peers;
}

absl::StatusOr<std::vector<RendezvousPeer>> Member(const RendezvousOptions& o, const std::string& blob) {
  const Deadline deadline = DeadlineIn(o.timeout_s);
  absl::StatusOr<Socket> c = Connect(o.master_addr, o.master_port, deadline);
  if (!c.ok()) {
    return COMM_ERROR(kDeadlineExceeded) << Where(o) << ": rank " << o.rank << " could not reach rank 0 within "
                                         << o.timeout_s << " s (" << c.status().message()
                                         << "); check MASTER_ADDR/MASTER_PORT and that rank 0 started";
  }
  std::string hello;
  PutU64(hello, sizeof(kMagic) - 1);
  hello += kMagic;
  PutU64(hello, static_cast<uint64_t>(o.rank));
  PutU64(hello, static_cast<uint64_t>(o.world_size));
  PutU64(hello, blob.size());
  hello += blob;
  const std::string what = Where(o) + ": rank " + std::to_string(o.rank);
  RETURN_IF_ERROR(WriteAll(*c, hello.data(), hello.size(), what + " greeting rank 0"));
  // Rank 0 answers by its own deadline: wait a little past ours for its verdict, which names who is missing.
  absl::StatusOr<std::string> verdict =
      ReadString(*c, what + " waiting for the other ranks", DeadlineIn(o.timeout_s + 5));
  if (!verdict.ok()) {
    return COMM_ERROR(kDeadlineExceeded) << what << ": rank 0 did not complete the rendezvous ("
                                         << verdict.status().message() << ")";
  }
  if (!verdict->empty()) return COMM_ERROR(kDeadlineExceeded) << *verdict;
  std::vector<RendezvousPeer> peers(o.world_size);
  for (RendezvousPeer& p : peers) {
    ASSIGN_OR_RETURN(p.host, ReadString(*c, what + " reading the peers", deadline));
    ASSIGN_OR_RETURN(p.blob, ReadString(*c, what + " reading the peers", deadline));
  }
  return peers;
}

}  // namespace

absl::StatusOr<std::vector<RendezvousPeer>> Rendezvous(const RendezvousOptions& o, const std::string& blob) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return INVALID_ARGUMENT() << "rank " << o.rank << " is not a rank of a world of " << o.world_size;
  }
  if (o.master_port <= 0 || o.master_port > 65535) {
    return INVALID_ARGUMENT() << "master port " << o.master_port << " is not a TCP port (1..65535)";
  }
  return o.rank == 0 ? Master(o, blob) : Member(o, blob);
}

}  // namespace onnxpipe::comm
