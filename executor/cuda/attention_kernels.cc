// Attention and AttentionGrad in the CUDA backend's kernel table, by one of two fused
// implementations chosen per node config (CudaOptions::attention):
//
// flash (flash_attention.h), fp32 and bf16: the CPU kernels' attributes and random stream, so the
// dropout mask is the CPU's bit for bit (same node key, step offset and micro-batch counter base).
// AttentionGrad's scratch (row statistics, full-batch gradients of broadcast operands) is its
// planned workspace. A node's views (q_view, k_view, v_view, o_view: frontend/ir/attention_views.h)
// become the kernels' row and batch strides, so Q, K, V are read, and O, dO and the gradients
// accessed, in place in the viewed buffers, as the CPU kernels do. Cases the kernels do not cover
// (fp16; head dims over 128) and inputs the CPU kernel rejects run the CPU kernel on the host,
// which reports the error. fp64 (the gradient-check
// dtype) runs the CPU kernel: the fused kernels take fp64 through flash_attention.h, but cannot yet
// sum the gradient of a broadcast operand in fp64.
//
// cuDNN SDPA (attention.h; compiled in where cuDNN and its frontend were found,
// ONNXPIPE_CUDNN_ATTENTION), bf16 and fp16: Q, K, V of dims (B, H, S, D) (ranks 2 and 3 read with
// leading 1s), K and V with H heads or fewer (Hkv dividing H: 1 or grouped-query attention); no mask, causal, a bool key-padding mask (B, 1, 1, Sk)
// read as per-batch lengths (a right-padded prefix of trues: attention.h), or an additive bias
// (1|B, 1|H, Sq, Sk). `auto` takes it when the config maps and cuDNN builds its graphs (forward
// and backward, with and without dropout), else flash; `cudnn` makes a config it cannot take an
// error naming the node. The decision is made once per config, when the plan sizes the node's
// workspace (or at its first evaluation unplanned), and cached with the built graphs: both the
// Attention node and its AttentionGrad map to the same config, so they take the same path, which
// a dropout mask needs (the backward regenerates the forward's). `auto` leaves a bias with dropout
// to flash: its gradient dMask (a learned bias) comes from the flash kernels' recomputation with the
// CPU's stream, which cannot replay cuDNN's mask.
//
// Statistics. Attention's optional output Stats is each row's fp32 natural-log log-sum-exp (op.h),
// what cuDNN's forward computes; the flash forward writes it from its row maximum and sum. Autodiff
// gives AttentionGrad the forward's O and Stats (inputs 5 and 6): cuDNN's backward reads them and
// the forward is not run again. Without them (a graph built otherwise), AttentionGrad under cuDNN
// re-runs cuDNN's forward into its workspace (O and the stats, with the forward's dropout seed, so
// the same O): one forward per backward and O's bytes of workspace. The flash backward recomputes
// its own statistics (row maximum, 1 / sum, D_i) either way.
//
// Dropout under cuDNN: cuDNN draws its own Philox numbers from a device int64 seed and offset, so
// its mask is NOT the CPU's stream (same distribution, different elements; compare with the CPU at
// dropout 0). The seed mixes the run's seed, the node's random-stream key (cpu::NodeRngKey: the
// forward's rng_key or name, which AttentionGrad carries), the step offset and the micro-batch's
// first row; the offset is 0. A recompute and a resumed run (same ExecContext) replay the mask; a
// different micro-batch split draws different masks (the CPU's counter base keeps its masks
// split-invariant; cuDNN's element counter is its own). The two int64s are the first 16 bytes of
// the node's planned workspace, written by a one-thread kernel each evaluation, which reads the
// step from device memory under graphs (ExecContext::device_offset), so a replay draws its step's.
//
// The cuDNN graphs (AttentionGraphs, one cuDNN handle) are owned by the table's entries, one per
// backend, and shared by its streams under a mutex held while building and while enqueuing
// (AttentionGraphs is not thread-safe): a graph built when the plan is sized serves every stage's
// stream, with no build in the step loop.
#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "executor/cpu/dropout.h"
#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/cuda_status.h"
#include "executor/cuda/flash_attention.h"
#include "frontend/ir/align.h"
#include "frontend/ir/attention_views.h"
#include "frontend/ir/status.h"
#ifdef ONNXPIPE_CUDNN_ATTENTION
#include "executor/cuda/attention.h"
#endif

namespace onnxpipe::cuda {
namespace {

// --- Shapes -------------------------------------------------------------------------------------

// A node's Q, K, V (and mask) dtypes and dims as read (through its views), from its input tensors or
// from the graph; for operands (and O) read through views, their strides and offsets.
struct AttentionShapes {
  ir::DType dtype = ir::DType::kF32;
  std::vector<int64_t> q, k, v;
  std::optional<std::vector<int64_t>> mask;
  ir::DType mask_dtype = ir::DType::kBool;
  std::vector<int64_t> strides[4];  // Q, K, V, O; empty = contiguous
  int64_t offsets[4] = {0, 0, 0, 0};
};

// Replaces the buffers' dims in `s` by the dims the node reads through its views; false when a
// view does not fit.
bool ApplyViews(const ir::Node& node, AttentionShapes& s) {
  if (!ir::HasAttentionViews(node)) return true;
  std::vector<int64_t>* dims[3] = {&s.q, &s.k, &s.v};
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<ir::StridedView> v = ir::AttentionOperandView(node, i, *dims[i]);
    if (!v.ok()) return false;
    if (ir::HasAttentionView(node, i)) s.strides[i] = v->strides, s.offsets[i] = v->offset;
    *dims[i] = v->dims;
  }
  if (ir::HasAttentionView(node, 3)) {
    std::vector<int64_t> o = s.q;
    o.back() = s.v.back();
    absl::StatusOr<ir::StridedView> v = ir::AttentionOutputView(node, ir::AttentionOutputDims(node, o));
    if (!v.ok() || v->dims != o) return false;
    s.strides[3] = v->strides, s.offsets[3] = v->offset;
  }
  return true;
}

// Q, K, V at inputs first..first+2, the mask at first+3; nullopt when Q, K, V differ in dtype.
std::optional<AttentionShapes> ShapesOf(const ir::Node& node, const std::vector<ir::Tensor>& in, size_t first) {
  if (in.size() < first + 3) return std::nullopt;
  AttentionShapes s;
  s.dtype = in[first].dtype();
  if (!AllOfDType(in, {first, first + 1, first + 2}, s.dtype)) return std::nullopt;
  s.q = in[first].dims(), s.k = in[first + 1].dims(), s.v = in[first + 2].dims();
  if (HasInput(in, first + 3)) s.mask = in[first + 3].dims(), s.mask_dtype = in[first + 3].dtype();
  if (!ApplyViews(node, s)) return std::nullopt;
  return s;
}

// As above from the graph's (bound, concrete) shapes; nullopt where one is not known.
std::optional<AttentionShapes> ShapesOf(const ir::Graph& g, const ir::Node& node, size_t first) {
  std::optional<std::vector<int64_t>> dims[3];
  AttentionShapes s;
  for (size_t i = 0; i < 3; ++i) {
    dims[i] = InputDims(g, node, first + i);
    if (!dims[i]) return std::nullopt;
    const ir::DType t = g.value(node.inputs[first + i]).dtype;
    if (i == 0) s.dtype = t;
    if (t != s.dtype) return std::nullopt;
  }
  s.q = *dims[0], s.k = *dims[1], s.v = *dims[2];
  if (node.inputs.size() > first + 3 && node.inputs[first + 3] != ir::kNoValue) {
    s.mask = InputDims(g, node, first + 3);
    if (!s.mask) return std::nullopt;
    s.mask_dtype = g.value(node.inputs[first + 3]).dtype;
  }
  if (!ApplyViews(node, s)) return std::nullopt;
  return s;
}

// Attention's optional Stats output (f32, the attention's batch dims and Sq), allocated when the
// node has it; an undefined tensor otherwise.
absl::StatusOr<ir::Tensor> StatsOutput(const KernelContext& ctx, const ir::Node& node, std::vector<int64_t> batch,
                                       int64_t sq) {
  if (!WantsOutput(node, 1)) return ir::Tensor();
  batch.push_back(sq);
  return ctx.FullOutput(node, 1, ir::DType::kF32, batch);
}

// The forward's results as the node has outputs: O, and Stats when it has that output.
std::vector<ir::Tensor> ForwardOutputs(const ir::Node& node, ir::Tensor o, ir::Tensor stats) {
  std::vector<ir::Tensor> out = {std::move(o)};
  if (node.outputs.size() > 1) out.push_back(std::move(stats));
  return out;
}

// Whether an AttentionGrad node has the forward's O and Stats (inputs 5 and 6, op.h).
[[maybe_unused]] bool HasForwardStats(const ir::Node& node) {  // (the cuDNN path's)
  return node.inputs.size() > 6 && node.inputs[5] != ir::kNoValue && node.inputs[6] != ir::kNoValue;
}

// Element `offset` of `t` (a view's start).
void* At(const ir::Tensor& t, int64_t offset) {
  return static_cast<char*>(const_cast<void*>(t.device_raw())) +
         offset * static_cast<int64_t>(ir::DTypeSize(t.dtype()));
}

// --- Flash --------------------------------------------------------------------------------------

// The plan of `node` on shapes `s` (Q, K, V and O through the node's views: their dims and strides),
// without dropout; nullopt where the host should run it. `forward`: Attention (which also checks the
// mask_kind attribute, as its CPU kernel does).
std::optional<FlashAttentionPlan> PlanFor(const ir::Node& node, bool forward, const AttentionShapes& s) {
  const ir::DType dtype = s.dtype;
  if ((dtype != ir::DType::kF32 && dtype != ir::DType::kBF16) || s.q.size() < 2) return std::nullopt;
  FlashAttentionConfig c;
  c.dtype = dtype;
  c.q_dims = s.q, c.k_dims = s.k, c.v_dims = s.v;
  c.q_strides = s.strides[0], c.k_strides = s.strides[1], c.v_strides = s.strides[2], c.o_strides = s.strides[3];
  const int64_t dh = s.q.back();
  c.scale = node.attrs.Get<double>("scale", dh > 0 ? 1.0 / std::sqrt(static_cast<double>(dh)) : 1.0);
  c.causal = node.attrs.Get<int64_t>("causal", 0) != 0;
  c.dropout.ratio = node.attrs.Get<double>("dropout", 0.0);
  if (s.mask) {
    const std::string kind = node.attrs.Get<std::string>("mask_kind", "additive");
    if (forward && kind != "additive" && kind != "bool") return std::nullopt;
    if (s.mask_dtype == ir::DType::kBool) {
      c.mask = FlashMask::kBool;
    } else if (s.mask_dtype == dtype && !(forward && kind == "bool")) {
      c.mask = FlashMask::kAdditive;
    } else {
      return std::nullopt;
    }
    c.mask_dims = *s.mask;
  }
  absl::StatusOr<FlashAttentionPlan> p = PlanFlashAttention(c);
  if (!p.ok()) return std::nullopt;
  // ApplyViews gave O Q's batch dims; the CPU kernel wants o_view over the broadcast batch.
  if (ir::HasAttentionView(node, 3)) {
    std::vector<int64_t> o = s.q;
    o.back() = s.v.back();
    if (o != p->out_dims) return std::nullopt;
  }
  return *std::move(p);
}

// Adds the node's random stream under `ctx` to the plan: false when the CPU kernel would reject the
// micro-batch split (RandomCounterBase), with or without dropout.
bool AddDropout(const KernelContext& ctx, const ir::Node& node, FlashAttentionPlan& p) {
  const FlashGeometry& g = p.geometry;
  DropoutParams d;
  d.training = ctx.exec.training;
  d.ratio = p.config.dropout.ratio;
  d.seed = ctx.exec.seed;
  d.node_key = cpu::NodeRngKey(node);
  d.offset = ctx.exec.offset;
  d.device_offset = ctx.exec.device_offset;
  if (ctx.exec.rows > 0 && ctx.exec.row_offset != 0) {
    const int64_t numel = g.nbatch * g.sq * g.sk;
    if (numel % ctx.exec.rows != 0) return false;
    d.counter_base = static_cast<uint64_t>(ctx.exec.row_offset * (numel / ctx.exec.rows));
  }
  p.config.dropout = d;
  absl::StatusOr<FlashAttentionPlan> with = PlanFlashAttention(p.config);
  if (!with.ok()) return false;
  p = *std::move(with);
  return true;
}

// Whether the kernels may write the gradients through the node's views (ir::CheckAttentionViewGradients);
// false: the host runs the node and reports the error.
bool ViewGradientsFit(const ir::Node& node, const std::vector<ir::Tensor>& in, const std::vector<int64_t>& batch) {
  const std::vector<int64_t>* const buffers[3] = {&in[1].dims(), &in[2].dims(), &in[3].dims()};
  return ir::CheckAttentionViewGradients(node, buffers, batch).ok();
}

// Whether the backward computes operand i's gradient: its slot's output is wanted and it has elements.
bool WantsGradient(const ir::Node& node, const AttentionShapes& s, int i) {
  const std::vector<int64_t>* dims[3] = {&s.q, &s.k, &s.v};
  return ir::AttentionGradWanted(node, i) && ir::ElementCount(*dims[i]) > 0;
}

// O = Attention(Q, K, V, mask?) through the flash kernels; Q, K, V read and O written through the
// node's views.
KernelResult FlashForward(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const std::optional<AttentionShapes> s = ShapesOf(node, in, 0);
  if (!s) return std::nullopt;
  std::optional<FlashAttentionPlan> p = PlanFor(node, /*forward=*/true, *s);
  if (!p || !AddDropout(ctx, node, *p)) return std::nullopt;
  absl::StatusOr<ir::Tensor> o = ctx.Output(node, 0, s->dtype, ir::AttentionOutputDims(node, p->out_dims));
  if (!o.ok()) return o.status();
  absl::StatusOr<ir::Tensor> stats = StatsOutput(ctx, node, p->batch, p->geometry.sq);
  if (!stats.ok()) return stats.status();
  if (o->num_elements() == 0) return ForwardOutputs(node, *o, *stats);
  if (stats->defined()) p->geometry.lse = static_cast<float*>(stats->device_raw());
  const void* mask = HasInput(in, 3) ? in[3].device_raw() : nullptr;
  absl::Status st = FlashAttentionForward(*p, At(in[0], s->offsets[0]), At(in[1], s->offsets[1]),
                                          At(in[2], s->offsets[2]), mask, At(*o, s->offsets[3]), ctx.stream);
  if (!st.ok()) return st;
  return ForwardOutputs(node, *o, *stats);
}

// The scratch of FlashBackward: the flash kernels' (dQ, dK, dV), then, 256-byte aligned, dMask's.
struct FlashBackwardScratch {
  int64_t flash = 0, mask = 0;
  int64_t total() const { return mask > 0 ? (flash + 255) / 256 * 256 + mask : flash; }
};
FlashBackwardScratch ScratchOf(const ir::Node& node, const FlashAttentionPlan& p, const AttentionShapes& s) {
  FlashBackwardScratch b;
  b.flash = FlashAttentionBackwardWorkspaceBytes(p, WantsGradient(node, s, 0), WantsGradient(node, s, 1),
                                                 WantsGradient(node, s, 2));
  if (WantsOutput(node, 3)) b.mask = AttentionMaskGradientWorkspaceBytes(p);
  return b;
}

// dQ, dK, dV, dMask? = AttentionGrad(dO, Q, K, V, mask?) through the flash kernels; dMask (a learned
// additive bias, T5's: f32 or bf16) by attention_mask_grad.cu. Under views dO is read through o_view and each
// gradient written through its operand's view into its slot's output (ir::AttentionGradSlot), as the CPU kernel
// does.
KernelResult FlashBackward(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const std::optional<AttentionShapes> s = ShapesOf(node, in, 1);
  if (!s || in[0].dtype() != s->dtype) return std::nullopt;
  std::optional<FlashAttentionPlan> p = PlanFor(node, /*forward=*/false, *s);
  if (!p || in[0].dims() != ir::AttentionOutputDims(node, p->out_dims) || !ViewGradientsFit(node, in, p->batch) ||
      !AddDropout(ctx, node, *p)) {
    return std::nullopt;
  }
  const bool want_dmask = WantsOutput(node, 3);
  if (want_dmask && (p->geometry.mask != FlashMask::kAdditive ||
                     (s->dtype != ir::DType::kF32 && s->dtype != ir::DType::kBF16))) {
    return std::nullopt;
  }
  std::vector<ir::Tensor> out(want_dmask ? 4 : 3);
  void* grads[3] = {};
  for (int i = 0; i < 3; ++i) {
    const int slot = ir::AttentionGradSlot(node, i);
    if (!WantsOutput(node, slot)) continue;
    if (slot == i) {
      absl::StatusOr<ir::Tensor> t = ctx.Output(node, i, s->dtype, in[i + 1].dims());
      if (!t.ok()) return t.status();
      out[i] = *t;
    } else if (WantsOutput(node, i)) {
      out[i] = out[slot];  // one value read through several views: one gradient (as the CPU kernel)
    }
    // An empty gradient needs no kernel; its buffer may be null.
    if (WantsGradient(node, *s, i)) grads[i] = At(out[slot], s->offsets[i]);
  }
  FlashBackwardBuffers b;
  b.dq = grads[0], b.dk = grads[1], b.dv = grads[2];
  b.d_o = At(in[0], s->offsets[3]);
  b.q = At(in[1], s->offsets[0]);
  b.k = At(in[2], s->offsets[1]);
  b.v = At(in[3], s->offsets[2]);
  b.mask = HasInput(in, 4) ? in[4].device_raw() : nullptr;
  const FlashBackwardScratch scratch = ScratchOf(node, *p, *s);
  b.workspace_bytes = scratch.flash;
  absl::StatusOr<void*> ws = ctx.Workspace(node, scratch.total());
  if (!ws.ok()) return ws.status();
  b.workspace = *ws;
  absl::Status st = FlashAttentionBackward(*p, b, ctx.stream);
  if (!st.ok()) return st;
  if (want_dmask) {
    absl::StatusOr<ir::Tensor> dmask = ctx.Output(node, 3, s->dtype, in[4].dims());
    if (!dmask.ok()) return dmask.status();
    out[3] = *dmask;
    void* mask_ws = scratch.mask > 0 ? static_cast<uint8_t*>(*ws) + (scratch.total() - scratch.mask) : nullptr;
    st = AttentionMaskGradient(*p, b, out[3].device_raw(), mask_ws, scratch.mask, ctx.stream);
    if (!st.ok()) return st;
  }
  return out;
}

// The scratch FlashBackward takes for `node`, from the graph's shapes.
int64_t FlashBackwardWorkspace(const ir::Graph& g, const ir::Node& node) {
  const std::optional<AttentionShapes> s = ShapesOf(g, node, 1);
  if (!s) return 0;
  std::optional<FlashAttentionPlan> p = PlanFor(node, /*forward=*/false, *s);
  if (!p) return 0;
  return ScratchOf(node, *p, *s).total();
}

// --- Selection ------------------------------------------------------------------------------------

#ifdef ONNXPIPE_CUDNN_ATTENTION

std::string DimsString(const std::vector<int64_t>& d) { return absl::StrCat("(", absl::StrJoin(d, ", "), ")"); }

// The cuDNN config of `node` on shapes `s` with dropout ratio `ratio` (the node's attribute: the
// graphs with and without it are built together), or an Unimplemented error saying why SDPA does
// not take it.
absl::StatusOr<AttentionConfig> CudnnConfigFor(const ir::Node& node, const AttentionShapes& s, double ratio) {
  auto refuse = [](auto&&... why) { return absl::UnimplementedError(absl::StrCat(why...)); };
  if (s.dtype != ir::DType::kBF16 && s.dtype != ir::DType::kF16) {
    return refuse("dtype ", std::string(ir::DTypeName(s.dtype)), " (cuDNN SDPA runs bf16 and fp16)");
  }
  const size_t rank = s.q.size();
  if (rank < 2 || rank > 4 || s.k.size() != rank || s.v.size() != rank) {
    return refuse("Q ", DimsString(s.q), ", K ", DimsString(s.k), ", V ", DimsString(s.v),
                  " (cuDNN SDPA takes Q, K, V of one rank, 2 to 4: (B, H, S, D))");
  }
  auto four = [](std::vector<int64_t> d) {
    d.insert(d.begin(), 4 - d.size(), 1);
    return d;
  };
  const std::vector<int64_t> q = four(s.q), k = four(s.k), v = four(s.v);
  AttentionConfig c;
  c.batch = q[0], c.heads = q[1], c.seq_q = q[2], c.head_dim = q[3];
  c.kv_heads = k[1], c.seq_kv = k[2], c.value_dim = v[3];
  // K and V with H heads, 1 (broadcast) or a divisor of H (grouped-query attention): cuDNN's h_k, h_v.
  if (k[0] != c.batch || v[0] != c.batch || v[1] != k[1] || k[1] < 1 || c.heads % k[1] != 0 ||
      k[3] != c.head_dim || v[2] != c.seq_kv) {
    return refuse("Q ", DimsString(s.q), ", K ", DimsString(s.k), ", V ", DimsString(s.v),
                  " (cuDNN SDPA takes K (B, Hkv, Sk, Dh) and V (B, Hkv, Sk, Dv), Hkv dividing H, for Q (B, H, Sq, Dh))");
  }
  // Strides over (B, H, S, D): a missing leading dim (extent 1) steps over the whole operand.
  auto four_strides = [](const std::vector<int64_t>& dims, std::vector<int64_t> st) {
    if (st.empty()) return st;
    const int64_t outer = st.front() * dims.front();
    st.insert(st.begin(), 4 - st.size(), outer);
    return st;
  };
  c.q_strides = four_strides(s.q, s.strides[0]), c.k_strides = four_strides(s.k, s.strides[1]);
  c.v_strides = four_strides(s.v, s.strides[2]);
  std::vector<int64_t> o_dims = s.q;
  o_dims.back() = s.v.back();
  c.o_strides = four_strides(o_dims, s.strides[3]);
  c.dtype = s.dtype;
  const int64_t dh = s.q.back();
  c.scale = node.attrs.Get<double>("scale", dh > 0 ? 1.0 / std::sqrt(static_cast<double>(dh)) : 1.0);
  c.causal = node.attrs.Get<int64_t>("causal", 0) != 0;
  c.dropout = ratio;
  if (s.mask) {
    if (s.mask->size() > 4) return refuse("a mask of dims ", DimsString(*s.mask), " (rank over 4)");
    const std::vector<int64_t> m = four(*s.mask);
    const std::string kind = node.attrs.Get<std::string>("mask_kind", "additive");
    if (s.mask_dtype == ir::DType::kBool) {
      if (m[0] != c.batch || m[1] != 1 || m[2] != 1 || m[3] != c.seq_kv) {
        return refuse("a bool mask of dims ", DimsString(*s.mask),
                      " (cuDNN SDPA takes a key-padding mask (B, 1, 1, Sk), read as lengths)");
      }
      c.mask = AttentionMask::kKeyMask;
    } else if (s.mask_dtype == s.dtype && kind == "additive") {
      if ((m[0] != 1 && m[0] != c.batch) || (m[1] != 1 && m[1] != c.heads) || m[2] != c.seq_q || m[3] != c.seq_kv) {
        return refuse("an additive mask of dims ", DimsString(*s.mask),
                      " (cuDNN SDPA takes a bias (1 or B, 1 or H, Sq, Sk))");
      }
      c.mask = AttentionMask::kBias;
      c.bias_batch = m[0], c.bias_heads = m[1], c.bias_rows = m[2];
    } else {
      return refuse("a ", std::string(ir::DTypeName(s.mask_dtype)), " mask with mask_kind '", kind, "'");
    }
  }
  return c.Resolved();
}

// The graphs' bytes of cuDNN workspace for a config: its forward and its backward, each the larger
// of the graphs with and without dropout.
struct CudnnSizes {
  int64_t forward = 0, backward = 0;
};

// One backend's cuDNN SDPA graphs and the per-config decisions; every method is thread-safe.
class CudnnAttention {
 public:
  explicit CudnnAttention(int device) : device_(device) {}

  // Builds the graphs config `c` (dropout as the node's attribute) needs, once: OK with their
  // workspace sizes, or why cuDNN cannot run it (remembered too).
  absl::StatusOr<CudnnSizes> Prepare(const AttentionConfig& c) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string key = c.ToString();
    if (auto it = prepared_.find(key); it != prepared_.end()) return it->second;
    absl::StatusOr<CudnnSizes> sizes = Build(c);
    prepared_.emplace(key, sizes);
    return sizes;
  }

  absl::Status Forward(const AttentionConfig& c, const AttentionForwardArgs& a, void* ws, int64_t bytes,
                       cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(graphs_.status());
    return (*graphs_)->Forward(c, a, ws, bytes, stream);
  }
  absl::Status Backward(const AttentionConfig& c, const AttentionBackwardArgs& a, void* ws, int64_t bytes,
                        cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(graphs_.status());
    return (*graphs_)->Backward(c, a, ws, bytes, stream);
  }

 private:
  absl::StatusOr<CudnnSizes> Build(const AttentionConfig& c) {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    if (!created_) {
      graphs_ = AttentionGraphs::Create();
      created_ = true;
    }
    RETURN_IF_ERROR(graphs_.status());
    AttentionGraphs& g = **graphs_;
    CudnnSizes sizes;
    ASSIGN_OR_RETURN(sizes.forward, g.ForwardWorkspaceBytes(c));
    ASSIGN_OR_RETURN(sizes.backward, g.BackwardWorkspaceBytes(c));
    if (c.dropout > 0) {
      // The same node outside training (ExecContext::training false: inference, --no-dropout),
      // where AttentionGrad may still run.
      AttentionConfig off = c;
      off.dropout = 0;
      ASSIGN_OR_RETURN(const int64_t forward, g.ForwardWorkspaceBytes(off));
      ASSIGN_OR_RETURN(const int64_t backward, g.BackwardWorkspaceBytes(off));
      sizes.forward = std::max(sizes.forward, forward);
      sizes.backward = std::max(sizes.backward, backward);
    }
    return sizes;
  }

  const int device_;
  std::mutex mu_;
  bool created_ = false;
  absl::StatusOr<std::unique_ptr<AttentionGraphs>> graphs_ = absl::FailedPreconditionError("not created");
  std::map<std::string, absl::StatusOr<CudnnSizes>> prepared_;
};

// A node cuDNN runs: its config (dropout as the attribute) and the graphs' workspace sizes.
struct CudnnPlan {
  AttentionConfig config;
  CudnnSizes sizes;
};

#endif  // ONNXPIPE_CUDNN_ATTENTION

// The attention entries' shared state: one per kernel table, so per backend.
struct AttentionState {
  AttentionImpl mode = AttentionImpl::kAuto;
  std::shared_ptr<AttentionRunCounts> counts;
#ifdef ONNXPIPE_CUDNN_ATTENTION
  std::unique_ptr<CudnnAttention> cudnn;
#endif
};

#ifdef ONNXPIPE_CUDNN_ATTENTION
using MaybeCudnn = std::optional<CudnnPlan>;
#else
struct CudnnPlan {};
using MaybeCudnn = std::optional<CudnnPlan>;
#endif

// The implementation of `node` on shapes `s` (nullopt: not known, e.g. Q, K, V dtypes differ):
// cuDNN (its plan) or the flash path (nullopt); an error under AttentionImpl::kCudnn when cuDNN
// cannot run it.
absl::StatusOr<MaybeCudnn> Select(AttentionState& state, const ir::Node& node,
                                  const std::optional<AttentionShapes>& s) {
  if (state.mode == AttentionImpl::kFlash) return MaybeCudnn();
  const bool required = state.mode == AttentionImpl::kCudnn;
  auto cannot = [&](const absl::Status& why) -> absl::StatusOr<MaybeCudnn> {
    if (!required) return MaybeCudnn();
    return absl::FailedPreconditionError(
        absl::StrCat(std::string(ir::OpName(node.op)), " node '", node.name,
                     "': --cuda-attention cudnn, but cuDNN SDPA cannot run it: ", std::string(why.message())));
  };
#ifndef ONNXPIPE_CUDNN_ATTENTION
  (void)s;
  return cannot(absl::UnimplementedError("this onnxpipe was built without cuDNN or its frontend (scripts/setup.sh)"));
#else
  if (!s) return cannot(absl::UnimplementedError("Q, K and V differ in dtype"));
  // Empty operands: nothing to compute, whichever path.
  if (ir::ElementCount(s->q) == 0 || ir::ElementCount(s->k) == 0 || ir::ElementCount(s->v) == 0) return MaybeCudnn();
  const double ratio = node.attrs.Get<double>("dropout", 0.0);
  absl::StatusOr<AttentionConfig> c = CudnnConfigFor(node, *s, ratio);
  if (!c.ok()) return cannot(c.status());
  if (!required && c->mask == AttentionMask::kBias && c->dropout > 0) return MaybeCudnn();  // file comment
  absl::StatusOr<CudnnSizes> sizes = state.cudnn->Prepare(*c);
  if (!sizes.ok()) return cannot(sizes.status());
  return MaybeCudnn(CudnnPlan{*std::move(c), *sizes});
#endif
}

#ifdef ONNXPIPE_CUDNN_ATTENTION

// --- cuDNN evaluation ---------------------------------------------------------------------------

constexpr int64_t kAlign = 256;

// Byte offsets into a cuDNN node's planned workspace (-1: absent), each part 256-byte aligned:
// [dropout seed, offset (int64 each) | backward without the forward's O and Stats: O (B, H, Sq, Dv) |
//  stats (B, H, Sq) fp32, unless the forward outputs them or the backward has them |
//  backward: dQ, dK, dV scratch for gradients the node does not want | cuDNN's workspace].
struct CudnnWorkspace {
  int64_t seed = 0, o = -1, stats = -1, grad[3] = {-1, -1, -1}, cudnn = 0, cudnn_bytes = 0, total = 0;

  CudnnWorkspace(const CudnnPlan& p, const ir::Node& node, bool backward) {
    const AttentionConfig& c = p.config;
    const int64_t elem = 2;                                 // bf16 / fp16
    const bool rerun = backward && !HasForwardStats(node);  // the backward re-runs the forward
    int64_t at = kAlign;
    if (rerun) {
      o = at;
      at += ir::AlignUp(c.batch * c.heads * c.seq_q * c.value_dim * elem, kAlign);
    }
    if (rerun || (!backward && !WantsOutput(node, 1))) {
      stats = at;
      at += ir::AlignUp(c.batch * c.heads * c.seq_q * 4, kAlign);
    }
    if (backward) {
      int64_t grad_elements[3] = {c.batch * c.heads * c.seq_q * c.head_dim,
                                  c.batch * c.kv_heads * c.seq_kv * c.head_dim,
                                  c.batch * c.kv_heads * c.seq_kv * c.value_dim};
      const std::vector<int64_t>* strides[3] = {&c.q_strides, &c.k_strides, &c.v_strides};
      const int64_t dims[3][4] = {{c.batch, c.heads, c.seq_q, c.head_dim},
                                  {c.batch, c.kv_heads, c.seq_kv, c.head_dim},
                                  {c.batch, c.kv_heads, c.seq_kv, c.value_dim}};
      for (int i = 0; i < 3; ++i) {
        if (ir::AttentionGradWanted(node, i)) continue;
        if (!strides[i]->empty()) {  // written through its strides: as far as they reach
          grad_elements[i] = 1;
          for (int d = 0; d < 4; ++d) grad_elements[i] += (dims[i][d] - 1) * (*strides[i])[d];
        }
        grad[i] = at;
        at += ir::AlignUp(grad_elements[i] * elem, kAlign);
      }
    }
    cudnn = at;
    cudnn_bytes = rerun ? std::max(p.sizes.forward, p.sizes.backward) : backward ? p.sizes.backward : p.sizes.forward;
    total = at + cudnn_bytes;
  }
};

// cuDNN's dropout seed for `node` under `ctx` (file comment), written into `out` on the device:
// the same for the forward, its recompute and its AttentionGrad, different per node, step and
// micro-batch; the step read from device memory when the context has it there (graphs).
cudaError_t WriteCudnnDropoutSeed(const KernelContext& ctx, const ir::Node& node, int64_t* out) {
  const uint64_t keyed = Mix64(Mix64(ctx.exec.seed) ^ cpu::NodeRngKey(node));
  return LaunchWriteDropoutSeed(out, keyed, ctx.exec.offset, ctx.exec.device_offset,
                                static_cast<uint64_t>(ctx.exec.row_offset), ctx.stream);
}

// The config this evaluation runs (dropout only while training), its workspace, with the dropout
// seed and offset written into its first bytes.
struct CudnnCall {
  AttentionConfig config;
  char* workspace = nullptr;
  const int64_t* seed = nullptr;
  const int64_t* offset = nullptr;
};
absl::StatusOr<CudnnCall> StartCudnnCall(const KernelContext& ctx, const ir::Node& node, const CudnnPlan& p,
                                         const CudnnWorkspace& layout) {
  CudnnCall call;
  call.config = p.config;
  if (!ctx.exec.training) call.config.dropout = 0;
  ASSIGN_OR_RETURN(void* ws, ctx.Workspace(node, layout.total));
  call.workspace = static_cast<char*>(ws);
  if (call.config.dropout > 0) {
    auto* seed = reinterpret_cast<int64_t*>(call.workspace + layout.seed);
    CUDA_RETURN_IF_ERROR(WriteCudnnDropoutSeed(ctx, node, seed));
    call.seed = seed;
    call.offset = seed + 1;
  }
  return call;
}

// The mask pointer cuDNN reads: the bool key mask or the bias, as the node's input.
const void* MaskPointer(const std::vector<ir::Tensor>& in, size_t i) {
  return HasInput(in, i) ? in[i].device_raw() : nullptr;
}

KernelResult CudnnForward(AttentionState& state, const CudnnPlan& p, const KernelContext& ctx, const ir::Node& node,
                          const std::vector<ir::Tensor>& in) {
  const CudnnWorkspace layout(p, node, /*backward=*/false);
  const AttentionShapes s = *ShapesOf(node, in, 0);
  std::vector<int64_t> o_dims = s.q;
  o_dims.back() = s.v.back();
  ASSIGN_OR_RETURN(ir::Tensor o, ctx.FullOutput(node, 0, in[0].dtype(), ir::AttentionOutputDims(node, o_dims)));
  // cuDNN's Q has the attention's batch dims (K and V match them, have 1 head or fewer: grouped).
  ASSIGN_OR_RETURN(ir::Tensor stats,
                   StatsOutput(ctx, node, std::vector<int64_t>(s.q.begin(), s.q.end() - 2), s.q[s.q.size() - 2]));
  ASSIGN_OR_RETURN(const CudnnCall call, StartCudnnCall(ctx, node, p, layout));
  AttentionForwardArgs a;
  a.q = At(in[0], s.offsets[0]), a.k = At(in[1], s.offsets[1]), a.v = At(in[2], s.offsets[2]);
  a.mask = MaskPointer(in, 3);
  a.dropout_seed = call.seed, a.dropout_offset = call.offset;
  a.o = At(o, s.offsets[3]);
  a.stats = stats.defined() ? static_cast<float*>(stats.device_raw())
                            : reinterpret_cast<float*>(call.workspace + layout.stats);
  RETURN_IF_ERROR(state.cudnn->Forward(call.config, a, call.workspace + layout.cudnn, layout.cudnn_bytes, ctx.stream));
  ++state.counts->cudnn;
  return ForwardOutputs(node, o, stats);
}

KernelResult CudnnBackward(AttentionState& state, const CudnnPlan& p, const KernelContext& ctx, const ir::Node& node,
                           const std::vector<ir::Tensor>& in) {
  const CudnnWorkspace layout(p, node, /*backward=*/true);
  const AttentionShapes s = *ShapesOf(node, in, 1);
  std::vector<ir::Tensor> out(3);
  void* grads[3] = {};
  ASSIGN_OR_RETURN(const CudnnCall call, StartCudnnCall(ctx, node, p, layout));
  for (int i = 0; i < 3; ++i) {
    // Operands read through views of one value write their gradients into its slot's output.
    const int slot = ir::AttentionGradSlot(node, i);
    if (!WantsOutput(node, slot)) {
      grads[i] = call.workspace + layout.grad[i];
      continue;
    }
    if (slot == i) {
      ASSIGN_OR_RETURN(out[i], ctx.FullOutput(node, i, in[1].dtype(), in[i + 1].dims()));
    }
    grads[i] = At(out[slot], s.offsets[i]);
  }
  // O and the stats cuDNN's backward reads: the forward's (inputs 5, 6), else the forward again
  // (file comment).
  AttentionForwardArgs f;
  f.q = At(in[1], s.offsets[0]), f.k = At(in[2], s.offsets[1]), f.v = At(in[3], s.offsets[2]);
  f.mask = MaskPointer(in, 4);
  f.dropout_seed = call.seed, f.dropout_offset = call.offset;
  char* cudnn_ws = call.workspace + layout.cudnn;
  if (HasForwardStats(node)) {
    f.o = At(in[5], s.offsets[3]);
    f.stats = static_cast<float*>(const_cast<void*>(in[6].device_raw()));
  } else {
    f.o = call.workspace + layout.o;
    f.stats = reinterpret_cast<float*>(call.workspace + layout.stats);
    RETURN_IF_ERROR(state.cudnn->Forward(call.config, f, cudnn_ws, layout.cudnn_bytes, ctx.stream));
  }
  AttentionBackwardArgs b;
  b.q = f.q, b.k = f.k, b.v = f.v, b.o = f.o, b.stats = f.stats;
  b.d_o = At(in[0], s.offsets[3]);
  b.mask = f.mask;
  b.dropout_seed = call.seed, b.dropout_offset = call.offset;
  b.dq = grads[0], b.dk = grads[1], b.dv = grads[2];
  RETURN_IF_ERROR(state.cudnn->Backward(call.config, b, cudnn_ws, layout.cudnn_bytes, ctx.stream));
  ++state.counts->cudnn;
  return out;
}

#endif  // ONNXPIPE_CUDNN_ATTENTION

// --- Table entries ------------------------------------------------------------------------------

KernelResult Attention(AttentionState& state, const KernelContext& ctx, const ir::Node& node,
                       const std::vector<ir::Tensor>& in) {
  ASSIGN_OR_RETURN(const MaybeCudnn cudnn, Select(state, node, ShapesOf(node, in, 0)));
#ifdef ONNXPIPE_CUDNN_ATTENTION
  if (cudnn) return CudnnForward(state, *cudnn, ctx, node, in);
#else
  (void)cudnn;
#endif
  KernelResult r = FlashForward(ctx, node, in);
  if (r && r->ok()) ++state.counts->flash;
  return r;
}

KernelResult AttentionGrad(AttentionState& state, const KernelContext& ctx, const ir::Node& node,
                           const std::vector<ir::Tensor>& in) {
  ASSIGN_OR_RETURN(const MaybeCudnn cudnn, Select(state, node, ShapesOf(node, in, 1)));
#ifdef ONNXPIPE_CUDNN_ATTENTION
  if (cudnn) {
    // dMask (a learned bias) comes from the flash kernels, which recompute the probabilities with the CPU's
    // dropout stream: the same as cuDNN's only without dropout.
    if (!WantsOutput(node, 3)) return CudnnBackward(state, *cudnn, ctx, node, in);
    if (ctx.exec.training && cudnn->config.dropout > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "AttentionGrad node '", node.name,
          "': --cuda-attention cudnn cannot give a learned bias's gradient (dMask) with dropout: the flash kernels "
          "compute it, whose dropout mask is not cuDNN's; use --cuda-attention auto or flash"));
    }
  }
#else
  (void)cudnn;
#endif
  KernelResult r = FlashBackward(ctx, node, in);
  if (r && r->ok()) ++state.counts->flash;
  return r;
}

// Workspaces: a config's errors are reported when the node runs; here they size nothing.
int64_t AttentionWorkspace(AttentionState& state, const ir::Graph& g, const ir::Node& node) {
  absl::StatusOr<MaybeCudnn> cudnn = Select(state, node, ShapesOf(g, node, 0));
#ifdef ONNXPIPE_CUDNN_ATTENTION
  if (cudnn.ok() && *cudnn) return CudnnWorkspace(**cudnn, node, /*backward=*/false).total;
#endif
  return 0;  // the flash forward takes none
}

int64_t AttentionGradWorkspace(AttentionState& state, const ir::Graph& g, const ir::Node& node) {
  absl::StatusOr<MaybeCudnn> cudnn = Select(state, node, ShapesOf(g, node, 1));
  if (!cudnn.ok()) return 0;
#ifdef ONNXPIPE_CUDNN_ATTENTION
  if (*cudnn && !WantsOutput(node, 3)) return CudnnWorkspace(**cudnn, node, /*backward=*/true).total;
#endif
  return FlashBackwardWorkspace(g, node);
}

}  // namespace

void RegisterAttentionKernels(KernelTable& table, const CudaOptions& options, int device,
                              std::shared_ptr<AttentionRunCounts> counts) {
  auto state = std::make_shared<AttentionState>();
  state->mode = options.attention;
  state->counts = counts != nullptr ? std::move(counts) : std::make_shared<AttentionRunCounts>();
#ifdef ONNXPIPE_CUDNN_ATTENTION
  state->cudnn = std::make_unique<CudnnAttention>(device);
#else
  (void)device;
#endif
  table[ir::OpKind::kAttention] = {
      [state](const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
        return Attention(*state, ctx, node, in);
      },
      [state](const ir::Graph& g, const ir::Node& node) { return AttentionWorkspace(*state, g, node); }};
  table[ir::OpKind::kAttentionGrad] = {
      [state](const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
        return AttentionGrad(*state, ctx, node, in);
      },
      [state](const ir::Graph& g, const ir::Node& node) { return AttentionGradWorkspace(*state, g, node); }};
}

}  // namespace onnxpipe::cuda
