// MatMul, FusedMatMul, Linear and Gemm in the CUDA backend's kernel table, through cuBLASLt (gemm.h): fp32 (exact, or
// TF32 under CudaOptions::allow_tf32), or bf16 operands and output with fp32 accumulation and one rounding of the
// result (Linear's bias and Gemm's C are bf16 then too). Batch dims broadcast as in the CPU kernels (matmul.cc): a
// batch-free B under an untransposed A is one tall GEMM, equal or single-sided batches one strided
// batched GEMM, anything else one GEMM per output matrix. FusedMatMul's KSum output (a bias gradient) comes from the
// GEMM's BGRADA/BGRADB epilogue, or from a reduction where cuBLASLt has no such algorithm.
#include <map>
#include <mutex>
#include <thread>

#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/elementwise.h"
#include "executor/cuda/gemm.h"
#include "executor/cuda/reduce.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {
namespace {

// One GemmContext per stream, and per thread on the default stream: a context serves one thread at
// a time, and a stage's stream is issued to by its thread only. Not per thread: a pipeline may run a
// stage on a new thread each step, and a recycled thread id would hand it another stage's context,
// whose plans have not seen its GEMMs (which cannot be chosen while a CUDA graph records). Owned by
// the kernel table, so it goes with the backend.
class GemmContexts {
 public:
  explicit GemmContexts(GemmContextOptions options) : options_(std::move(options)) {}
  absl::StatusOr<GemmContext*> For(cudaStream_t stream) {
    const Key key = stream != nullptr ? Key{reinterpret_cast<uintptr_t>(stream), std::thread::id()}
                                      : Key{0, std::this_thread::get_id()};
    std::lock_guard<std::mutex> lock(mu_);
    std::unique_ptr<GemmContext>& c = contexts_[key];
    if (c == nullptr) {
      absl::StatusOr<std::unique_ptr<GemmContext>> made = GemmContext::Create(options_);
      if (!made.ok()) return made.status();
      c = *std::move(made);
    }
    return c.get();
  }

 private:
  using Key = std::pair<uintptr_t, std::thread::id>;  // the stream, or the thread on the default stream
  const GemmContextOptions options_;
  std::mutex mu_;
  std::map<Key, std::unique_ptr<GemmContext>> contexts_;
};

int64_t WorkspaceForThisDevice() {
  int device = 0, major = 9;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    cudaGetLastError();
    major = 9;  // the larger workspace
  }
  return GemmWorkspaceBytes(major);
}

// The outputs' dtype of `node` over operands of `dtype`: FusedMatMul's `to` (f32) when set.
ir::DType OutputDType(const ir::Node& node, ir::DType dtype) { return node.attrs.Has("to") ? ir::DType::kF32 : dtype; }

struct Gemms {
  std::shared_ptr<GemmContexts> contexts;
  int64_t workspace_bytes = WorkspaceForThisDevice();

  // The node's workspace (the plan's, or a temporary one), to share among its GEMMs.
  absl::Status TakeWorkspace(const KernelContext& ctx, const ir::Node& node, GemmBuffers& buffers) const {
    absl::StatusOr<void*> ws = ctx.Workspace(node, workspace_bytes);
    if (!ws.ok()) return ws.status();
    buffers.workspace = *ws;
    buffers.workspace_bytes = workspace_bytes;
    return absl::OkStatus();
  }

  // Runs `desc` with operands of `dtype` and outputs of OutputDType over `buffers`, taking the node's workspace
  // unless `buffers` holds it.
  absl::Status Run(const KernelContext& ctx, const ir::Node& node, ir::DType dtype, GemmDesc desc,
                   GemmBuffers buffers) const {
    desc.input_type = dtype;
    desc.output_type = OutputDType(node, dtype);
    desc.allow_tf32 = dtype == ir::DType::kF32 && ctx.allow_tf32;
    if (buffers.workspace == nullptr) RETURN_IF_ERROR(TakeWorkspace(ctx, node, buffers));
    absl::StatusOr<GemmContext*> gc = contexts->For(ctx.stream);
    if (!gc.ok()) return gc.status();
    return (*gc)->Run(desc, buffers, ctx.stream);
  }
};

// The dtype shared by the present inputs among `indices` when the GEMMs cover it (f32, or bf16 with bf16 out).
std::optional<ir::DType> GemmDType(const std::vector<ir::Tensor>& in, std::initializer_list<size_t> indices) {
  for (ir::DType t : kKernelFloats)
    if (AllOfDType(in, indices, t)) return t;
  return std::nullopt;
}

// Element `i` of a device tensor's buffer.
void* At(const ir::Tensor& t, int64_t i) { return static_cast<char*>(t.device_raw()) + i * ir::DTypeSize(t.dtype()); }

int64_t Product(const std::vector<int64_t>& d, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= d[i];
  return p;
}

// out (batch..., m, n) = alpha op(A) op(B) with A (a_batch..., rows, cols) etc. (ranks >= 2
// after MatMul's 1-D promotion), batch dims broadcast. nullopt when the batch dims clash (the CPU
// kernel reports that).
KernelResult BatchedMatMul(const Gemms& gemms, const KernelContext& ctx, const ir::Node& node, const ir::Tensor& a,
                           const ir::Tensor& b, const std::vector<int64_t>& ad, const std::vector<int64_t>& bd, bool ta,
                           bool tb, float alpha, bool promoted_a, bool promoted_b) {
  const ir::DType t = a.dtype();
  const size_t ar = ad.size(), br = bd.size();
  const int64_t a_rows = ad[ar - 2], a_cols = ad[ar - 1], b_rows = bd[br - 2], b_cols = bd[br - 1];
  const int64_t m = ta ? a_cols : a_rows, k = ta ? a_rows : a_cols;
  const int64_t kb = tb ? b_cols : b_rows, n = tb ? b_rows : b_cols;
  if (k != kb) return std::nullopt;
  const std::vector<int64_t> a_batch(ad.begin(), ad.end() - 2), b_batch(bd.begin(), bd.end() - 2);
  absl::StatusOr<std::vector<int64_t>> batch = BroadcastShape({a_batch, b_batch});
  if (!batch.ok()) return std::nullopt;
  std::vector<int64_t> out_dims = *batch;
  if (!promoted_a) out_dims.push_back(m);
  if (!promoted_b) out_dims.push_back(n);
  const int64_t nbatch = Product(*batch, 0, batch->size());
  const int64_t a_count = Product(a_batch, 0, a_batch.size()), b_count = Product(b_batch, 0, b_batch.size());
  const ir::DType ot = OutputDType(node, t);
  absl::StatusOr<ir::Tensor> out = k == 0 ? ctx.Output(node, 0, ot, out_dims) : ctx.FullOutput(node, 0, ot, out_dims);
  if (!out.ok()) return out.status();
  if (out->num_elements() == 0 || k == 0) return std::vector<ir::Tensor>{*out};  // zero-filled
  GemmDesc d;
  d.m = m, d.n = n, d.k = k, d.trans_a = ta, d.trans_b = tb, d.alpha = alpha;
  GemmBuffers buf;
  buf.a = a.device_raw(), buf.b = b.device_raw(), buf.c = out->device_raw();
  const bool tall = b_count == 1 && a_count == nbatch && !ta;
  absl::Status st;
  if (tall) {
    d.m = a_count * m;
    st = gemms.Run(ctx, node, t, d, buf);
  } else if ((a_count == nbatch || a_count == 1) && (b_count == nbatch || b_count == 1)) {
    d.batch = nbatch;
    d.stride_a = a_count == 1 ? 0 : m * k;
    d.stride_b = b_count == 1 ? 0 : k * n;
    d.stride_c = m * n;
    st = gemms.Run(ctx, node, t, d, buf);
  } else {
    // General broadcast ((2, 1) with (1, 3), ...): one GEMM per output matrix, one workspace.
    st = gemms.TakeWorkspace(ctx, node, buf);
    const size_t rank = batch->size();
    std::vector<int64_t> as(rank, 0), bs(rank, 0);
    for (int64_t s = 1, i = static_cast<int64_t>(a_batch.size()) - 1; i >= 0; s *= a_batch[i--])
      if (a_batch[i] != 1) as[rank - a_batch.size() + i] = s;
    for (int64_t s = 1, i = static_cast<int64_t>(b_batch.size()) - 1; i >= 0; s *= b_batch[i--])
      if (b_batch[i] != 1) bs[rank - b_batch.size() + i] = s;
    for (int64_t i = 0; i < nbatch && st.ok(); ++i) {
      int64_t rem = i, ai = 0, bi = 0;
      for (int64_t dd = static_cast<int64_t>(rank) - 1; dd >= 0; --dd) {
        const int64_t idx = rem % (*batch)[dd];
        rem /= (*batch)[dd];
        ai += idx * as[dd];
        bi += idx * bs[dd];
      }
      GemmBuffers one = buf;
      one.a = At(a, ai * m * k);
      one.b = At(b, bi * k * n);
      one.c = At(*out, i * m * n);
      st = gemms.Run(ctx, node, t, d, one);
    }
  }
  if (!st.ok()) return st;
  return std::vector<ir::Tensor>{*out};
}

KernelResult MatMul(const Gemms& gemms, const KernelContext& ctx, const ir::Node& node,
                    const std::vector<ir::Tensor>& in) {
  if (!GemmDType(in, {0, 1}) || in[0].rank() == 0 || in[1].rank() == 0) return std::nullopt;
  std::vector<int64_t> ad = in[0].dims(), bd = in[1].dims();
  const bool a_vec = ad.size() == 1, b_vec = bd.size() == 1;
  if (a_vec) ad.insert(ad.begin(), 1);
  if (b_vec) bd.push_back(1);
  return BatchedMatMul(gemms, ctx, node, in[0], in[1], ad, bd, false, false, 1.f, a_vec, b_vec);
}

// FusedMatMul of rank-2 operands with its KSum output: sums over k of op(A) (k_sum 'a') or op(B) ('b').
KernelResult FusedMatMulWithKSum(const Gemms& gemms, const KernelContext& ctx, const ir::Node& node,
                                 const std::vector<ir::Tensor>& in, ir::DType t) {
  const bool ta = node.attrs.Get<int64_t>("trans_a", 0) != 0, tb = node.attrs.Get<int64_t>("trans_b", 0) != 0;
  const bool of_a = node.attrs.Get<std::string>("k_sum", "") == "a";
  const float alpha = static_cast<float>(node.attrs.Get<double>("alpha", 1.0));
  const std::vector<int64_t>&ad = in[0].dims(), &bd = in[1].dims();
  const int64_t m = ta ? ad[1] : ad[0], k = ta ? ad[0] : ad[1], n = tb ? bd[0] : bd[1];
  if (in[0].rank() != 2 || in[1].rank() != 2 || (tb ? bd[1] : bd[0]) != k) return std::nullopt;  // the CPU says why
  const bool full = k > 0 && m > 0 && n > 0;
  const ir::DType ot = OutputDType(node, t);
  absl::StatusOr<ir::Tensor> out = full ? ctx.FullOutput(node, 0, ot, {m, n}) : ctx.Output(node, 0, ot, {m, n});
  if (!out.ok()) return out.status();
  absl::StatusOr<ir::Tensor> sums =
      full ? ctx.FullOutput(node, 1, ot, {of_a ? m : n}) : ctx.Output(node, 1, ot, {of_a ? m : n});
  if (!sums.ok()) return sums.status();
  if (k == 0) return std::vector<ir::Tensor>{*out, *sums};  // zero-filled
  GemmDesc d;
  d.m = m, d.n = n, d.k = k, d.trans_a = ta, d.trans_b = tb, d.alpha = alpha;
  d.epilogue = of_a ? GemmEpilogue::kBGradA : GemmEpilogue::kBGradB;
  GemmBuffers buf;
  buf.a = in[0].device_raw(), buf.b = in[1].device_raw(), buf.c = out->device_raw(), buf.bias_grad = sums->device_raw();
  absl::Status st = full && alpha == 1.f ? gemms.Run(ctx, node, t, d, buf) : absl::UnimplementedError("");
  if (absl::IsUnimplemented(st)) {  // the plain GEMM, then the operand's sums over its k axis
    d.epilogue = GemmEpilogue::kNone;
    st = full ? gemms.Run(ctx, node, t, d, buf) : absl::OkStatus();
    const bool k_is_row = of_a ? ta : !tb;  // k indexes the stored operand's rows
    absl::StatusOr<ReducePlan> plan = MakeReducePlan(of_a ? ad : bd, {k_is_row ? 0 : 1});
    if (st.ok()) st = plan.status();
    if (st.ok()) st = Reduce(ReduceKind::kSum, *plan, t, of_a ? buf.a : buf.b, ot, buf.bias_grad, ctx.stream);
  }
  if (!st.ok()) return st;
  return std::vector<ir::Tensor>{*out, *sums};
}

KernelResult FusedMatMul(const Gemms& gemms, const KernelContext& ctx, const ir::Node& node,
                         const std::vector<ir::Tensor>& in) {
  if (!GemmDType(in, {0, 1}) || in[0].rank() < 2 || in[1].rank() < 2) return std::nullopt;
  if (WantsOutput(node, 1)) return FusedMatMulWithKSum(gemms, ctx, node, in, in[0].dtype());
  return BatchedMatMul(gemms, ctx, node, in[0], in[1], in[0].dims(), in[1].dims(),
                       node.attrs.Get<int64_t>("trans_a", 0) != 0, node.attrs.Get<int64_t>("trans_b", 0) != 0,
                       static_cast<float>(node.attrs.Get<double>("alpha", 1.0)), false, false);
}

// Linear: Y (..., N) = X (..., K) W (+ bias), one tall GEMM with the bias epilogue.
KernelResult Linear(const Gemms& gemms, const KernelContext& ctx, const ir::Node& node,
                    const std::vector<ir::Tensor>& in) {
  const std::optional<ir::DType> t = GemmDType(in, {0, 1, 2});
  if (!t || in[0].rank() < 1 || in[1].rank() != 2) return std::nullopt;
  const bool tb = node.attrs.Get<int64_t>("trans_b", 0) != 0;
  const std::vector<int64_t>& xd = in[0].dims();
  const std::vector<int64_t>& wd = in[1].dims();
  const int64_t k = xd.back(), n = tb ? wd[0] : wd[1];
  const bool has_bias = HasInput(in, 2);
  if ((tb ? wd[1] : wd[0]) != k || (has_bias && in[2].num_elements() != n)) return std::nullopt;
  std::vector<int64_t> out_dims(xd.begin(), xd.end() - 1);
  const int64_t m = Product(out_dims, 0, out_dims.size());
  out_dims.push_back(n);
  absl::StatusOr<ir::Tensor> out = k == 0 ? ctx.Output(node, 0, *t, out_dims) : ctx.FullOutput(node, 0, *t, out_dims);
  if (!out.ok()) return out.status();
  if (out->num_elements() == 0) return std::vector<ir::Tensor>{*out};
  if (k == 0) {  // Y = bias broadcast over the rows
    if (!has_bias) return std::vector<ir::Tensor>{*out};
    const absl::Status st =
        Binary(BinaryOp::kAdd, *t, out->device_raw(), {m, n}, in[2].device_raw(), {n}, out->device_raw(), ctx.stream);
    if (!st.ok()) return st;
    return std::vector<ir::Tensor>{*out};
  }
  GemmDesc d;
  d.m = m, d.n = n, d.k = k, d.trans_b = tb;
  d.epilogue = has_bias ? GemmEpilogue::kBias : GemmEpilogue::kNone;
  GemmBuffers buf;
  buf.a = in[0].device_raw(), buf.b = in[1].device_raw(), buf.c = out->device_raw();
  if (has_bias) buf.bias = in[2].device_raw();
  const absl::Status st = gemms.Run(ctx, node, *t, d, buf);
  if (!st.ok()) return st;
  return std::vector<ir::Tensor>{*out};
}

// Gemm: Y (M, N) = alpha op(A) op(B) + beta C, C broadcast into Y first.
KernelResult Gemm(const Gemms& gemms, const KernelContext& ctx, const ir::Node& node,
                  const std::vector<ir::Tensor>& in) {
  const std::optional<ir::DType> t = GemmDType(in, {0, 1, 2});
  if (!t || in[0].rank() != 2 || in[1].rank() != 2) return std::nullopt;
  const bool ta = node.attrs.Get<int64_t>("transA", 0) != 0, tb = node.attrs.Get<int64_t>("transB", 0) != 0;
  const float alpha = static_cast<float>(node.attrs.Get<double>("alpha", 1.0));
  const float beta = static_cast<float>(node.attrs.Get<double>("beta", 1.0));
  const std::vector<int64_t>& ad = in[0].dims();
  const std::vector<int64_t>& bd = in[1].dims();
  const int64_t m = ta ? ad[1] : ad[0], k = ta ? ad[0] : ad[1], n = tb ? bd[0] : bd[1];
  if ((tb ? bd[1] : bd[0]) != k) return std::nullopt;
  const bool has_c = HasInput(in, 2) && beta != 0.f;
  if (has_c) {
    absl::StatusOr<std::vector<int64_t>> cb = BroadcastShape({in[2].dims(), {m, n}});
    if (!cb.ok() || *cb != std::vector<int64_t>{m, n}) return std::nullopt;
  }
  absl::StatusOr<ir::Tensor> out = ctx.Output(node, 0, *t, {m, n});
  if (!out.ok()) return out.status();
  if (out->num_elements() == 0) return std::vector<ir::Tensor>{*out};
  if (has_c) {  // Y = 0 + C: the broadcast copy of C
    const absl::Status st = Binary(BinaryOp::kAdd, *t, out->device_raw(), {m, n}, in[2].device_raw(), in[2].dims(),
                                   out->device_raw(), ctx.stream);
    if (!st.ok()) return st;
  }
  if (k == 0) {  // op(A) op(B) = 0: Y = beta C
    if (!has_c || beta == 1.f) return std::vector<ir::Tensor>{*out};
    return std::nullopt;  // scaling C alone: the host kernel does it (rare)
  }
  GemmDesc d;
  d.m = m, d.n = n, d.k = k, d.trans_a = ta, d.trans_b = tb, d.alpha = alpha, d.beta = has_c ? beta : 0.f;
  GemmBuffers buf;
  buf.a = in[0].device_raw(), buf.b = in[1].device_raw(), buf.c = out->device_raw();
  const absl::Status st = gemms.Run(ctx, node, *t, d, buf);
  if (!st.ok()) return st;
  return std::vector<ir::Tensor>{*out};
}

}  // namespace

void RegisterGemmKernels(KernelTable& table, const CudaOptions& options) {
  const auto gemms = std::make_shared<const Gemms>(
      Gemms{.contexts = std::make_shared<GemmContexts>(GemmContextOptions{.tactic_cache_path = options.gemm_tactics})});
  const CudaWorkspaceFn workspace = [gemms](const ir::Graph&, const ir::Node&) { return gemms->workspace_bytes; };
  using Fn = KernelResult (*)(const Gemms&, const KernelContext&, const ir::Node&, const std::vector<ir::Tensor>&);
  const std::pair<ir::OpKind, Fn> ops[] = {{ir::OpKind::kMatMul, MatMul},
                                           {ir::OpKind::kFusedMatMul, FusedMatMul},
                                           {ir::OpKind::kLinear, Linear},
                                           {ir::OpKind::kGemm, Gemm}};
  for (const auto& [op, fn] : ops) {
    table[op].run = [gemms, fn](const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
      return fn(*gemms, ctx, node, in);
    };
    table[op].workspace = workspace;
  }
}

}  // namespace onnxpipe::cuda
