// cuBLASLt is opened on first use (dlopen), not linked: loading libcublasLt costs a process about 200 MB of
// resident memory before it runs anything (its relocations and static data), which every CPU-only process (a CPU
// training rank, `onnxpipe partition`) would otherwise pay. cublaslt_loader.cc defines the cublasLt* functions
// onnxpipe calls; each forwards to the library's own, resolved once.
#pragma once

#include <string>

namespace onnxpipe::cuda {

// The library's file name (libcublasLt.so.<major> of the headers built against).
const char* CublasLtLibraryName();

// Opens the library if not yet open. Empty when it is loaded; else what went wrong (dlerror), for the error a
// backend reports before its first cuBLASLt call.
std::string CublasLtLoadProblem();

// Whether this process has opened it (a test's check that CPU work does not).
bool CublasLtLoaded();

}  // namespace onnxpipe::cuda
