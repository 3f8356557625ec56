// A test backend whose "device" memory the host must not touch: the CPU backend's kernels over
// buffers that stay mprotect(PROT_NONE) except while one of the backend's own calls runs. A driver
// that reads or writes device memory directly (instead of ToHost/FromHost/Copy/Fill) faults at
// once; a driver that reads a device tensor through ir::Tensor's host accessors aborts naming it.
// Results equal the CPU backend's bit for bit (the same kernels on the same bytes).
//
// Calls are serialised (one mutex for the process) and nest (a kernel's output allocation may
// fill its slot through this backend); only the buffers a call touches are opened, and all are
// closed again when the outermost call returns. For tests: every call costs mprotect system calls.
#pragma once

#include <memory>

#include "executor/backend/backend.h"

namespace onnxpipe::backend {

std::shared_ptr<const Backend> MakeCheckedBackend();

}  // namespace onnxpipe::backend
