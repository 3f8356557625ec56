// A test backend with graphs, over a host backend (the CPU's): what a CUDA stream capture does,
// checkable without a GPU. A stream records the calls issued on it between BeginCapture and
// EndCapture; Graph::Launch issues them again with exactly the recorded arguments: the same
// buffers, the same host values and ExecContext (a kernel sees a new step only through
// ExecContext::device_offset), its outputs and scratch at the addresses the recording got. A
// driver that bakes a per-step value into a graph, or lets a graph's buffers move, computes
// differently from the eager run here as it would on a GPU. As on a GPU, recording runs nothing:
// the kernels do run (to return their outputs) but EndCapture puts back every byte they wrote,
// then launches the graph once.
//
// While a stream records, the calls a CUDA capture refuses fail and invalidate the capture (its
// EndCapture fails, having run nothing): ToHost, FromHost, AllFinite on it, its
// Synchronize/Record/Wait, Allocate on the recording thread (so Zeros, Upload, Clone), a Run
// without planned outputs, a failing Run, and a Run of an op in `refused` (a kernel that claims
// to be capturable and is not). A Run of an op in `failing` fails without invalidating the capture
// (a kernel's own check, as a GEMM first seen while capturing): EndCapture would still launch
// what was recorded before it, so a driver must drop that recording (AbortCapture).
// Capturable: every node except those of `not_capturable`'s ops.
#pragma once

#include <memory>
#include <set>

#include "executor/backend/backend.h"

namespace onnxpipe::backend {

std::shared_ptr<const Backend> MakeRecordingBackend(std::shared_ptr<const Backend> inner,
                                                    std::set<ir::OpKind> not_capturable = {},
                                                    std::set<ir::OpKind> refused = {},
                                                    std::set<ir::OpKind> failing = {});

}  // namespace onnxpipe::backend
