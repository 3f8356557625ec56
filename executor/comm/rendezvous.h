// The rendezvous every multi-process run starts with (torch's TCPStore plays this role): rank 0
// listens on the master address and port, every other rank connects to it and says who it is, and
// once all `world_size` ranks have arrived rank 0 answers each with everyone's address and blob
// (a rank's listening port for the CPU transport; NCCL's unique id from rank 0). Nothing waits
// without limit: a rank that never arrives, a master that never answers, two ranks claiming one
// rank number or disagreeing on the world size end every arrived rank with an error saying so.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace onnxpipe::comm {

struct RendezvousOptions {
  std::string master_addr = "127.0.0.1";  // where rank 0 listens (it binds every interface)
  int master_port = 29500;
  int rank = 0;
  int world_size = 1;
  double timeout_s = 300;  // for the whole rendezvous
};

struct RendezvousPeer {
  std::string host;  // the address the peer reached rank 0 from (rank 0: its address seen by the others)
  std::string blob;
};

// Every rank calls it once with its own blob; every rank gets the same list, by rank.
absl::StatusOr<std::vector<RendezvousPeer>> Rendezvous(const RendezvousOptions& options, const std::string& blob);

}  // namespace onnxpipe::comm
