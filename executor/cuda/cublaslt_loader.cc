// The cublasLt* functions onnxpipe calls, forwarding to libcublasLt opened on first use (cublaslt_loader.h).
// A function whose library or symbol cannot be found returns CUBLAS_STATUS_NOT_INITIALIZED (the status names
// say why), so callers keep their one error path.
#include "executor/cuda/cublaslt_loader.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

namespace onnxpipe::cuda {
namespace {

#define ONNXPIPE_STR2(x) #x
#define ONNXPIPE_STR(x) ONNXPIPE_STR2(x)
constexpr const char* kLibrary = "libcublasLt.so." ONNXPIPE_STR(CUBLAS_VER_MAJOR);
#undef ONNXPIPE_STR
#undef ONNXPIPE_STR2

struct Library {
  void* handle = nullptr;
  std::string problem;
};

Library& Open() {
  static Library lib;
  static std::once_flag once;
  std::call_once(once, [] {
    lib.handle = ::dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
    if (lib.handle == nullptr) {
      const char* why = ::dlerror();
      lib.problem = std::string("cannot load ") + kLibrary + " (" + (why ? why : "unknown reason") +
                    "): put the CUDA toolkit's libraries on the loader's path (LD_LIBRARY_PATH)";
    }
  });
  return lib;
}

// `name` in the library as a pointer of type Fn, or null.
template <typename Fn>
Fn Find(const char* name) {
  Library& lib = Open();
  return lib.handle == nullptr ? nullptr : reinterpret_cast<Fn>(::dlsym(lib.handle, name));
}

constexpr cublasStatus_t kNotLoaded = CUBLAS_STATUS_NOT_INITIALIZED;

}  // namespace

const char* CublasLtLibraryName() { return kLibrary; }

std::string CublasLtLoadProblem() { return Open().problem; }

bool CublasLtLoaded() {
  void* h = ::dlopen(kLibrary, RTLD_NOW | RTLD_NOLOAD);
  if (h != nullptr) ::dlclose(h);
  return h != nullptr;
}

}  // namespace onnxpipe::cuda

using onnxpipe::cuda::Find;
using onnxpipe::cuda::kNotLoaded;

// Each function resolves its library symbol once; without it, the status above.
#define ONNXPIPE_LT_FORWARD(name, params, args)          \
  cublasStatus_t CUBLASWINAPI name params {              \
    static const auto fn = Find<decltype(&name)>(#name); \
    return fn != nullptr ? fn args : kNotLoaded;         \
  }

extern "C" {

ONNXPIPE_LT_FORWARD(cublasLtCreate, (cublasLtHandle_t * h), (h))
ONNXPIPE_LT_FORWARD(cublasLtDestroy, (cublasLtHandle_t h), (h))
ONNXPIPE_LT_FORWARD(cublasLtMatmul,
                    (cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void* alpha, const void* a,
                     cublasLtMatrixLayout_t a_desc, const void* b, cublasLtMatrixLayout_t b_desc, const void* beta,
                     const void* c, cublasLtMatrixLayout_t c_desc, void* d, cublasLtMatrixLayout_t d_desc,
                     const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes, cudaStream_t stream),
                    (h, desc, alpha, a, a_desc, b, b_desc, beta, c, c_desc, d, d_desc, algo, workspace, workspace_bytes,
                     stream))
ONNXPIPE_LT_FORWARD(cublasLtMatmulAlgoCheck,
                    (cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a_desc,
                     cublasLtMatrixLayout_t b_desc, cublasLtMatrixLayout_t c_desc, cublasLtMatrixLayout_t d_desc,
                     const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* result),
                    (h, desc, a_desc, b_desc, c_desc, d_desc, algo, result))
ONNXPIPE_LT_FORWARD(cublasLtMatmulAlgoConfigGetAttribute,
                    (const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, void* buf,
                     size_t bytes, size_t* written),
                    (algo, attr, buf, bytes, written))
ONNXPIPE_LT_FORWARD(cublasLtMatmulAlgoGetHeuristic,
                    (cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a_desc,
                     cublasLtMatrixLayout_t b_desc, cublasLtMatrixLayout_t c_desc, cublasLtMatrixLayout_t d_desc,
                     cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t results[],
                     int* returned),
                    (h, desc, a_desc, b_desc, c_desc, d_desc, pref, requested, results, returned))
ONNXPIPE_LT_FORWARD(cublasLtMatmulDescCreate,
                    (cublasLtMatmulDesc_t * desc, cublasComputeType_t compute, cudaDataType_t scale),
                    (desc, compute, scale))
ONNXPIPE_LT_FORWARD(cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc))
ONNXPIPE_LT_FORWARD(cublasLtMatmulDescSetAttribute,
                    (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf, size_t bytes),
                    (desc, attr, buf, bytes))
ONNXPIPE_LT_FORWARD(cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref), (pref))
ONNXPIPE_LT_FORWARD(cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref), (pref))
ONNXPIPE_LT_FORWARD(cublasLtMatmulPreferenceSetAttribute,
                    (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                     size_t bytes),
                    (pref, attr, buf, bytes))
ONNXPIPE_LT_FORWARD(cublasLtMatrixLayoutCreate,
                    (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld),
                    (layout, type, rows, cols, ld))
ONNXPIPE_LT_FORWARD(cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout))
ONNXPIPE_LT_FORWARD(cublasLtMatrixLayoutSetAttribute,
                    (cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, const void* buf,
                     size_t bytes),
                    (layout, attr, buf, bytes))

size_t CUBLASWINAPI cublasLtGetVersion(void) {
  static const auto fn = Find<decltype(&cublasLtGetVersion)>("cublasLtGetVersion");
  return fn != nullptr ? fn() : 0;
}

// The status names come from the library once it is loaded; before, ours (the load problem is reported apart).
const char* CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t status) {
  static const auto fn = Find<decltype(&cublasLtGetStatusName)>("cublasLtGetStatusName");
  return fn != nullptr ? fn(status) : "CUBLAS_STATUS_NOT_INITIALIZED";
}

const char* CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status) {
  static const auto fn = Find<decltype(&cublasLtGetStatusString)>("cublasLtGetStatusString");
  return fn != nullptr ? fn(status) : "libcublasLt could not be loaded";
}

}  // extern "C"

#undef ONNXPIPE_LT_FORWARD
