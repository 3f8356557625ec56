// cuBLASLt GEMMs (contract in gemm.h). cuBLASLt is column-major. A row-major (M, N) matrix has the bytes of a
// column-major (N, M) one, so the row-major D = op(A) op(B) is computed as the column-major D^T = op(B)^T op(A)^T:
// cuBLASLt's "A" is our B, its "B" is our A, its (m, n) are our (N, M), and the transpose flags carry over as they
// are. Its epilogue vectors follow from that: bias and the dGELU bias gradient run along its rows (our N), its
// BGRADA reduces its A (our B) and its BGRADB its B (our A).
#include "executor/cuda/gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "executor/cuda/cublaslt_loader.h"
#include "executor/cuda/cuda_status.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {
namespace {

static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof(GemmTactic::algo), "tactic stores the opaque algo bytes");

absl::Status LtStatus(cublasStatus_t s, const char* call, const char* file, int line) {
  return absl::InternalError(absl::StrCat(call, " failed at ", file, ":", line, ": ", cublasLtGetStatusName(s),
                                          " (", cublasLtGetStatusString(s), ")"));
}

#define LT_RETURN_IF_ERROR(call)                                                      \
  do {                                                                                \
    cublasStatus_t _onnxpipe_lt_status = (call);                                      \
    if (_onnxpipe_lt_status != CUBLAS_STATUS_SUCCESS)                                 \
      return LtStatus(_onnxpipe_lt_status, #call, __FILE__, __LINE__);                \
  } while (0)

bool UsesBias(GemmEpilogue e) { return e == GemmEpilogue::kBias || e == GemmEpilogue::kBiasGeluTanh; }
bool UsesAux(GemmEpilogue e) {
  return e == GemmEpilogue::kBiasGeluTanh || e == GemmEpilogue::kDGeluTanh || e == GemmEpilogue::kDGeluTanhBGrad;
}
bool UsesBiasGrad(GemmEpilogue e) {
  return e == GemmEpilogue::kDGeluTanhBGrad || e == GemmEpilogue::kBGradA || e == GemmEpilogue::kBGradB;
}

cublasLtEpilogue_t LtEpilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kNone: return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::kBias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::kBiasGeluTanh: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::kDGeluTanh: return CUBLASLT_EPILOGUE_DGELU;
    case GemmEpilogue::kDGeluTanhBGrad: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case GemmEpilogue::kBGradA: return CUBLASLT_EPILOGUE_BGRADB;  // our A is cuBLASLt's B
    case GemmEpilogue::kBGradB: return CUBLASLT_EPILOGUE_BGRADA;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

cudaDataType_t LtType(ir::DType t) { return t == ir::DType::kF32 ? CUDA_R_32F : CUDA_R_16BF; }

// Largest power of two (up to 256) dividing `v`: the alignment a pointer or batch step guarantees.
int64_t AlignmentOf(uintptr_t v) {
  int64_t a = 256;
  while (a > 1 && v % static_cast<uintptr_t>(a) != 0) a /= 2;
  return a;
}

// The smallest alignment over every buffer cuBLASLt touches, batch steps included. Tactics are keyed by it.
int64_t BufferAlignment(const GemmDesc& d, const GemmBuffers& b) {
  const int64_t in_size = ir::DTypeSize(d.input_type), out_size = ir::DTypeSize(d.output_type);
  int64_t align = 256;
  for (const void* p : {b.a, b.b, static_cast<const void*>(b.c), b.bias, static_cast<const void*>(b.aux),
                        static_cast<const void*>(b.bias_grad)}) {
    if (p != nullptr) align = std::min(align, AlignmentOf(reinterpret_cast<uintptr_t>(p)));
  }
  if (d.batch > 1) {
    for (int64_t step : {d.stride_a * in_size, d.stride_b * in_size, d.stride_c * out_size}) {
      if (step != 0) align = std::min(align, AlignmentOf(static_cast<uintptr_t>(step)));
    }
  }
  return align;
}

std::string ProblemKey(const std::string& device_prefix, const GemmDesc& d, int64_t align, int64_t workspace) {
  std::string key = absl::StrCat(device_prefix, "|", std::string(ir::DTypeName(d.input_type)), "->",
                                 std::string(ir::DTypeName(d.output_type)),
                                 d.input_type == ir::DType::kF32 && d.allow_tf32 ? " tf32" : "", "|",
                                 d.trans_a ? "T" : "N", d.trans_b ? "T" : "N", "|M", d.m, " N", d.n, " K", d.k);
  if (d.batch > 1) absl::StrAppend(&key, "|batch ", d.batch, " sA", d.stride_a, " sB", d.stride_b, " sC", d.stride_c);
  absl::StrAppend(&key, "|", std::string(GemmEpilogueName(d.epilogue)), d.beta == 0 ? "|beta0" : "|beta", "|align", align,
                  "|ws", workspace);
  return key;
}

absl::Status ValidateBuffers(const GemmDesc& d, const GemmBuffers& b) {
  auto missing = [&](const char* what) -> absl::Status {
    return INVALID_ARGUMENT() << "GEMM (epilogue " << GemmEpilogueName(d.epilogue) << "): " << what
                              << " pointer is null";
  };
  if (b.a == nullptr) return missing("A");
  if (b.b == nullptr) return missing("B");
  if (b.c == nullptr) return missing("C/D");
  if (UsesBias(d.epilogue) && b.bias == nullptr) return missing("bias");
  if (UsesAux(d.epilogue) && b.aux == nullptr) return missing("aux");
  if (UsesBiasGrad(d.epilogue) && b.bias_grad == nullptr) return missing("bias_grad");
  if (b.workspace_bytes < 0 || (b.workspace == nullptr && b.workspace_bytes > 0)) {
    return INVALID_ARGUMENT() << "GEMM: workspace of " << b.workspace_bytes
                              << " bytes must be >= 0 and have a non-null pointer when > 0";
  }
  return absl::OkStatus();
}

// cuBLASLt descriptors of one problem: cuBLASLt's A (our B), its B (our A), and C = D.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  LtDescs() = default;
  LtDescs(const LtDescs&) = delete;
  LtDescs& operator=(const LtDescs&) = delete;
  ~LtDescs() {
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
    for (cublasLtMatrixLayout_t l : {a, b, c}) {
      if (l != nullptr) cublasLtMatrixLayoutDestroy(l);
    }
  }
};

absl::Status SetBatch(cublasLtMatrixLayout_t layout, int64_t batch, int64_t stride) {
  const int32_t count = static_cast<int32_t>(batch);
  LT_RETURN_IF_ERROR(
      cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
  LT_RETURN_IF_ERROR(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                      sizeof(stride)));
  return absl::OkStatus();
}

absl::Status CreateDescs(const GemmDesc& d, LtDescs& out) {
  const cublasComputeType_t compute =
      d.input_type == ir::DType::kF32 && d.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  LT_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&out.op, compute, CUDA_R_32F));
  const int32_t trans_a = d.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our B
  const int32_t trans_b = d.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasLtEpilogue_t epilogue = LtEpilogue(d.epilogue);
  LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(out.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(out.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  LT_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(out.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  if (UsesAux(d.epilogue)) {
    const int64_t aux_ld = d.n;  // aux is (M, N) row-major like D
    LT_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(out.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
  }
  // Stored matrices in column-major terms: (rows, cols) = the row-major (cols, rows); dense, so ld = rows.
  const cudaDataType_t in = LtType(d.input_type), out_type = LtType(d.output_type);
  const uint64_t a_rows = d.trans_b ? d.k : d.n, a_cols = d.trans_b ? d.n : d.k;
  const uint64_t b_rows = d.trans_a ? d.m : d.k, b_cols = d.trans_a ? d.k : d.m;
  LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&out.a, in, a_rows, a_cols, static_cast<int64_t>(a_rows)));
  LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&out.b, in, b_rows, b_cols, static_cast<int64_t>(b_rows)));
  LT_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&out.c, out_type, d.n, d.m, d.n));
  if (d.batch > 1) {
    RETURN_IF_ERROR(SetBatch(out.a, d.batch, d.stride_b));
    RETURN_IF_ERROR(SetBatch(out.b, d.batch, d.stride_a));
    RETURN_IF_ERROR(SetBatch(out.c, d.batch, d.stride_c));
  }
  return absl::OkStatus();
}

// The epilogue's vector and aux pointers live in the operation descriptor: set on every call.
absl::Status SetEpiloguePointers(cublasLtMatmulDesc_t op, const GemmDesc& d, const GemmBuffers& b) {
  if (UsesBias(d.epilogue) || UsesBiasGrad(d.epilogue)) {
    const void* vec = UsesBiasGrad(d.epilogue) ? static_cast<const void*>(b.bias_grad) : b.bias;
    LT_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof(vec)));
  }
  if (UsesAux(d.epilogue)) {
    LT_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &b.aux, sizeof(b.aux)));
  }
  return absl::OkStatus();
}

struct Plan {
  std::string key;
  LtDescs descs;
  cublasLtMatmulAlgo_t algo;
  GemmTactic tactic;
};

cublasStatus_t Enqueue(cublasLtHandle_t handle, const Plan& plan, const cublasLtMatmulAlgo_t& algo,
                       const GemmDesc& d, const GemmBuffers& b, void* d_out, cudaStream_t stream) {
  return cublasLtMatmul(handle, plan.descs.op, &d.alpha, b.b, plan.descs.a, b.a, plan.descs.b, &d.beta, b.c,
                        plan.descs.c, d_out, plan.descs.c, &algo, b.workspace, static_cast<size_t>(b.workspace_bytes),
                        stream);
}

}  // namespace

std::string_view GemmEpilogueName(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kNone: return "none";
    case GemmEpilogue::kBias: return "bias";
    case GemmEpilogue::kBiasGeluTanh: return "bias_gelu_tanh";
    case GemmEpilogue::kDGeluTanh: return "dgelu_tanh";
    case GemmEpilogue::kDGeluTanhBGrad: return "dgelu_tanh_bgrad";
    case GemmEpilogue::kBGradA: return "bgrad_a";
    case GemmEpilogue::kBGradB: return "bgrad_b";
  }
  return "?";
}

absl::Status ValidateGemm(const GemmDesc& d) {
  if (d.m <= 0 || d.n <= 0 || d.k <= 0) {
    return INVALID_ARGUMENT() << "GEMM: M, N and K must be positive, got M=" << d.m << " N=" << d.n << " K=" << d.k;
  }
  if (d.batch < 1) return INVALID_ARGUMENT() << "GEMM: batch must be >= 1, got " << d.batch;
  if (d.batch > 1) {
    if (d.stride_a < 0 || d.stride_b < 0) {
      return INVALID_ARGUMENT() << "GEMM: batch strides of A and B must be >= 0 (0 shares one matrix), got "
                                << d.stride_a << " and " << d.stride_b;
    }
    if (d.stride_c < d.m * d.n) {
      return INVALID_ARGUMENT() << "GEMM: batch stride of C must be >= M*N = " << d.m * d.n
                                << " (outputs may not overlap), got " << d.stride_c;
    }
  }
  const ir::DType in = d.input_type, out = d.output_type;
  const bool supported = (in == ir::DType::kBF16 && (out == ir::DType::kBF16 || out == ir::DType::kF32)) ||
                         (in == ir::DType::kF32 && out == ir::DType::kF32);
  if (!supported) {
    return UNIMPLEMENTED() << "GEMM: inputs " << ir::DTypeName(in) << " with output " << ir::DTypeName(out)
                           << " are not supported (expected bf16->bf16, bf16->f32 or f32->f32)";
  }
  const std::string_view epilogue = GemmEpilogueName(d.epilogue);
  if (d.epilogue != GemmEpilogue::kNone && d.batch != 1) {
    return UNIMPLEMENTED() << "GEMM epilogue " << epilogue << " needs batch 1 (flatten leading dims into M), got batch "
                           << d.batch;
  }
  if (UsesAux(d.epilogue)) {
    if (d.beta != 0) return INVALID_ARGUMENT() << "GEMM epilogue " << epilogue << " needs beta = 0, got " << d.beta;
    if (d.n % 8 != 0) {
      return UNIMPLEMENTED() << "GEMM epilogue " << epilogue
                             << " needs N divisible by 8 (cuBLASLt's GELU aux leading dimension), got N=" << d.n;
    }
  }
  if ((d.epilogue == GemmEpilogue::kBGradA || d.epilogue == GemmEpilogue::kBGradB) && d.alpha != 1) {
    return INVALID_ARGUMENT() << "GEMM epilogue " << epilogue << " needs alpha = 1, got " << d.alpha;
  }
  return absl::OkStatus();
}

int64_t GemmWorkspaceBytes(int compute_major) { return compute_major >= 9 ? (int64_t{32} << 20) : (int64_t{4} << 20); }

struct GemmContext::Impl {
  GemmContextOptions options;
  cublasLtHandle_t handle = nullptr;
  std::string device_prefix;  // "<device name>|cublasLt <version>": the start of every key
  GemmTacticCache tactics;    // the file's tactics plus those timed here: what the file is rewritten with
  absl::Status load_status;
  std::unordered_map<std::string, std::unique_ptr<Plan>> plans;
  int timed = 0;

  ~Impl() {
    plans.clear();
    if (handle != nullptr) cublasLtDestroy(handle);
  }

  absl::StatusOr<Plan*> GetPlan(const GemmDesc& d, const GemmBuffers& b, cudaStream_t stream);
  bool UseFileTactic(Plan& plan, int64_t workspace_bytes);
  absl::Status Choose(Plan& plan, const GemmDesc& d, const GemmBuffers& b, cudaStream_t stream);
  absl::StatusOr<double> TimeUs(const Plan& plan, const cublasLtMatmulAlgo_t& algo, const GemmDesc& d,
                                const GemmBuffers& b, void* d_out, cudaStream_t stream);
};

absl::StatusOr<Plan*> GemmContext::Impl::GetPlan(const GemmDesc& d, const GemmBuffers& b, cudaStream_t stream) {
  RETURN_IF_ERROR(ValidateGemm(d));
  RETURN_IF_ERROR(ValidateBuffers(d, b));
  const int64_t align = BufferAlignment(d, b);
  std::string key = ProblemKey(device_prefix, d, align, b.workspace_bytes);
  if (auto it = plans.find(key); it != plans.end()) return it->second.get();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    // No choosing under capture; a tactic chosen for weaker alignment serves (the alignment is a minimum).
    for (int64_t weaker = align / 2; weaker >= 1; weaker /= 2)
      if (auto it = plans.find(ProblemKey(device_prefix, d, weaker, b.workspace_bytes)); it != plans.end())
        return it->second.get();
  }

  auto plan = std::make_unique<Plan>();
  plan->key = std::move(key);
  RETURN_IF_ERROR(CreateDescs(d, plan->descs));
  RETURN_IF_ERROR(SetEpiloguePointers(plan->descs.op, d, b));  // the heuristic reads their alignment
  if (!UseFileTactic(*plan, b.workspace_bytes)) RETURN_IF_ERROR(Annotate(Choose(*plan, d, b, stream), plan->key));
  Plan* raw = plan.get();
  plans.emplace(raw->key, std::move(plan));
  return raw;
}

bool GemmContext::Impl::UseFileTactic(Plan& plan, int64_t workspace_bytes) {
  const GemmTactic* t = tactics.Find(plan.key);
  if (t == nullptr) return false;
  std::memcpy(&plan.algo, t->algo.data(), sizeof(plan.algo));
  cublasLtMatmulHeuristicResult_t check{};
  const cublasStatus_t s = cublasLtMatmulAlgoCheck(handle, plan.descs.op, plan.descs.a, plan.descs.b, plan.descs.c,
                                                   plan.descs.c, &plan.algo, &check);
  if (s != CUBLAS_STATUS_SUCCESS || check.workspaceSize > static_cast<size_t>(workspace_bytes)) {
    std::fprintf(stderr, "warning: GEMM tactic for %s from %s is not usable (%s, workspace %zu bytes): timing again\n",
                 plan.key.c_str(), options.tactic_cache_path.c_str(), cublasLtGetStatusName(s), check.workspaceSize);
    return false;
  }
  plan.tactic = *t;
  return true;
}

absl::Status GemmContext::Impl::Choose(Plan& plan, const GemmDesc& d, const GemmBuffers& b, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    // Choosing calls the heuristic (which may fail under capture) and may synchronise the stream.
    return FAILED_PRECONDITION() << "GEMM first seen while its stream is capturing a CUDA graph: Prepare or Run "
                                    "it once before capture";
  }
  const bool timing = !options.tactic_cache_path.empty();

  cublasLtMatmulPreference_t pref;
  LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, cublasStatus_t (*)(cublasLtMatmulPreference_t)> pref_owner(
      pref, cublasLtMatmulPreferenceDestroy);
  const uint64_t workspace = static_cast<uint64_t>(b.workspace_bytes);
  const uint32_t align = static_cast<uint32_t>(BufferAlignment(d, b));
  LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                          sizeof(workspace)));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    LT_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)));
  }
  std::vector<cublasLtMatmulHeuristicResult_t> results(timing ? options.candidates : 1);
  int found = 0;
  const cublasStatus_t s =
      cublasLtMatmulAlgoGetHeuristic(handle, plan.descs.op, plan.descs.a, plan.descs.b, plan.descs.c, plan.descs.c,
                                     pref, static_cast<int>(results.size()), results.data(), &found);
  if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
    return UNIMPLEMENTED() << "cuBLASLt has no algorithm for this GEMM (" << cublasLtGetStatusName(s)
                           << "): shape, type, epilogue or pointer alignment not supported";
  }
  results.resize(found);

  int best = 0;
  if (timing) {
    // beta != 0 reads C: candidates write a temporary D so that C survives the timing runs.
    void* d_out = b.c;
    const int64_t out_elems = d.batch > 1 ? d.stride_c * (d.batch - 1) + d.m * d.n : d.m * d.n;
    if (d.beta != 0) CUDA_RETURN_IF_ERROR(cudaMalloc(&d_out, out_elems * ir::DTypeSize(d.output_type)));
    double best_us = -1;
    absl::Status first_error;
    for (int i = 0; i < found; ++i) {
      absl::StatusOr<double> us = TimeUs(plan, results[i].algo, d, b, d_out, stream);
      if (!us.ok()) {
        if (first_error.ok()) first_error = us.status();
        continue;
      }
      if (best_us < 0 || *us < best_us) best_us = *us, best = i;
    }
    if (d_out != b.c) CUDA_RETURN_IF_ERROR(cudaFree(d_out));
    if (best_us < 0) return first_error;
    plan.tactic.time_us = best_us;
  }
  plan.algo = results[best].algo;
  std::memcpy(plan.tactic.algo.data(), &plan.algo, sizeof(plan.algo));
  int32_t id = -1;
  size_t written = 0;
  LT_RETURN_IF_ERROR(
      cublasLtMatmulAlgoConfigGetAttribute(&plan.algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &written));
  plan.tactic.algo_id = id;
  if (timing) {
    ++timed;
    tactics.Insert(plan.key, plan.tactic);
    if (absl::Status saved = tactics.SaveMerged(options.tactic_cache_path); !saved.ok()) {
      std::fprintf(stderr, "warning: GEMM tactic cache not saved: %s\n", std::string(saved.message()).c_str());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<double> GemmContext::Impl::TimeUs(const Plan& plan, const cublasLtMatmulAlgo_t& algo,
                                                 const GemmDesc& d, const GemmBuffers& b, void* d_out,
                                                 cudaStream_t stream) {
  LT_RETURN_IF_ERROR(Enqueue(handle, plan, algo, d, b, d_out, stream));  // warm-up; rejects unusable candidates
  cudaEvent_t start, stop;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  if (cudaError_t e = cudaEventCreate(&stop); e != cudaSuccess) {
    cudaEventDestroy(start);
    return CudaStatus(e, "cudaEventCreate", __FILE__, __LINE__);
  }
  cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
  cudaEventRecord(start, stream);
  for (int i = 0; i < options.timing_iterations && s == CUBLAS_STATUS_SUCCESS; ++i) {
    s = Enqueue(handle, plan, algo, d, b, d_out, stream);
  }
  cudaEventRecord(stop, stream);
  const cudaError_t sync = cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  LT_RETURN_IF_ERROR(s);
  CUDA_RETURN_IF_ERROR(sync);
  return 1000.0 * ms / options.timing_iterations;
}

GemmContext::GemmContext(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GemmContext::~GemmContext() = default;

absl::StatusOr<std::unique_ptr<GemmContext>> GemmContext::Create(const GemmContextOptions& options) {
  if (options.candidates < 1 || options.timing_iterations < 1) {
    return INVALID_ARGUMENT() << "GemmContext: candidates and timing_iterations must be >= 1, got "
                              << options.candidates << " and " << options.timing_iterations;
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  int device = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  ASSIGN_OR_RETURN(DeviceInfo info, GetDeviceInfo(device));
  if (const std::string problem = CublasLtLoadProblem(); !problem.empty()) {
    return FAILED_PRECONDITION() << "cuBLASLt: " << problem;
  }
  LT_RETURN_IF_ERROR(cublasLtCreate(&impl->handle));
  impl->device_prefix = absl::StrCat(info.name, "|cublasLt ", cublasLtGetVersion());
  if (!options.tactic_cache_path.empty()) {
    absl::StatusOr<GemmTacticCache> cache = GemmTacticCache::Load(options.tactic_cache_path);
    if (cache.ok()) {
      impl->tactics = *std::move(cache);
    } else if (!absl::IsNotFound(cache.status())) {
      impl->load_status = cache.status();
      std::fprintf(stderr, "warning: ignoring the GEMM tactic cache (tactics will be timed again): %s\n",
                   std::string(cache.status().message()).c_str());
    }
  }
  return std::unique_ptr<GemmContext>(new GemmContext(std::move(impl)));
}

absl::StatusOr<GemmTactic> GemmContext::Prepare(const GemmDesc& desc, const GemmBuffers& buffers,
                                                cudaStream_t stream) {
  ASSIGN_OR_RETURN(Plan * plan, impl_->GetPlan(desc, buffers, stream));
  return plan->tactic;
}

absl::Status GemmContext::Run(const GemmDesc& desc, const GemmBuffers& buffers, cudaStream_t stream) {
  ASSIGN_OR_RETURN(Plan * plan, impl_->GetPlan(desc, buffers, stream));
  RETURN_IF_ERROR(SetEpiloguePointers(plan->descs.op, desc, buffers));
  const cublasStatus_t s = Enqueue(impl_->handle, *plan, plan->algo, desc, buffers, buffers.c, stream);
  if (s != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError(absl::StrCat("cublasLtMatmul failed for GEMM ", plan->key, ": ",
                                            cublasLtGetStatusName(s), " (", cublasLtGetStatusString(s), ")"));
  }
  return absl::OkStatus();
}

const absl::Status& GemmContext::cache_load_status() const { return impl_->load_status; }
int GemmContext::timed_problems() const { return impl_->timed; }

}  // namespace onnxpipe::cuda
