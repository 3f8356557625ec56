// Named tensors of several ranks collected on one (a multi-process run's checkpoint, --save and --eval: each stage's
// rank holds its own parameters and optimizer state; rank 0 writes the whole model). Built on Send/Recv, so it runs
// over every Comm. Collective: the root and every sender call it at the same point, with the same `senders`, `root`
// and `tag`; other ranks need not call it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/comm/comm.h"

namespace onnxpipe::comm {

using NamedTensors = std::map<std::string, ir::Tensor>;

// On `root`: `local` and the tensors of every rank in `senders` (host tensors; a name several ranks hold is taken
// from the first in `root`, `senders` order, as shared parameters' holders keep equal copies). On a sender: sends
// `local` to `root` and returns it. Messages use tags tag, tag + 1, ... (callers keep them apart from their own).
absl::StatusOr<NamedTensors> GatherNamedTensors(Comm& comm, const std::vector<int>& senders, int root, uint64_t tag,
                                                const NamedTensors& local);

// Every rank of `comm` waits until all have called it (an all-reduce of one value over the world).
absl::Status Barrier(Comm& comm, const std::string& what);

}  // namespace onnxpipe::comm
