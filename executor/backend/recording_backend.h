// A test backend with graphs, over another backend (the CPU's): what a CUDA stream capture does,
// checkable without a GPU. A stream records the calls issued on it between BeginCapture and
// EndCapture while running them; Graph::Launch issues them again with exactly the recorded
// arguments: the same buffers, the same host values and ExecContext (a kernel sees a new step only
// through ExecContext::device_offset), its outputs and scratch at the addresses the recording got.
// A driver that bakes a per-step value into a graph, or lets a graph's buffers move, computes
// differently from the eager run here as it would on a GPU.
//
// While a stream records, the calls a CUDA capture refuses fail: ToHost, FromHost, AllFinite on
// it, its Synchronize/Record/Wait, Allocate on the recording thread (so Zeros, Upload, Clone) and
// a Run without planned outputs. Capturable: every node except those of `not_capturable`'s ops.
#pragma once

#include <memory>
#include <set>

#include "executor/backend/backend.h"

namespace onnxpipe::backend {

std::shared_ptr<const Backend> MakeRecordingBackend(std::shared_ptr<const Backend> inner,
                                                    std::set<ir::OpKind> not_capturable = {});

}  // namespace onnxpipe::backend
