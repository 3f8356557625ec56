// Attention and AttentionGrad (fp32 and bf16) in the CUDA backend's kernel table, through the fused
// kernels of flash_attention.h, with the CPU kernels' attributes and random stream: the dropout mask
// is the CPU's bit for bit (same node key, step offset and micro-batch counter base). AttentionGrad's
// scratch (row statistics, full-batch gradients of broadcast operands) is its planned workspace.
// Cases the kernels do not cover (fp16, which cuDNN's attention.h serves to its own callers; head
// dims over 128) and inputs the CPU kernel rejects run the CPU kernel on the host, which reports
// the error. fp64 (the gradient-check dtype) runs the CPU kernel: the fused kernels take
// fp64 through flash_attention.h, but cannot yet sum the gradient of a broadcast operand in fp64.
#include <cmath>
#include <string>

#include "executor/cpu/dropout.h"
#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/flash_attention.h"

namespace onnxpipe::cuda {
namespace {

int64_t Product(const std::vector<int64_t>& d) {
  int64_t p = 1;
  for (int64_t x : d) p *= x;
  return p;
}

// The plan of `node` on Q, K, V of these dims and an optional mask (`mask_dtype` kBool or the
// inputs' dtype), without dropout; nullopt where the host should run it. `forward`: Attention
// (which also checks the mask_kind attribute, as its CPU kernel does).
std::optional<FlashAttentionPlan> PlanFor(const ir::Node& node, bool forward, ir::DType dtype,
                                          const std::vector<int64_t>& q, const std::vector<int64_t>& k,
                                          const std::vector<int64_t>& v, const std::vector<int64_t>* mask_dims,
                                          ir::DType mask_dtype) {
  if ((dtype != ir::DType::kF32 && dtype != ir::DType::kBF16) || q.size() < 2) return std::nullopt;
  FlashAttentionConfig c;
  c.dtype = dtype;
  c.q_dims = q, c.k_dims = k, c.v_dims = v;
  const int64_t dh = q.back();
  c.scale = node.attrs.Get<double>("scale", dh > 0 ? 1.0 / std::sqrt(static_cast<double>(dh)) : 1.0);
  c.causal = node.attrs.Get<int64_t>("causal", 0) != 0;
  c.dropout.ratio = node.attrs.Get<double>("dropout", 0.0);
  if (mask_dims != nullptr) {
    const std::string kind = node.attrs.Get<std::string>("mask_kind", "additive");
    if (forward && kind != "additive" && kind != "bool") return std::nullopt;
    if (mask_dtype == ir::DType::kBool) {
      c.mask = FlashMask::kBool;
    } else if (mask_dtype == dtype && !(forward && kind == "bool")) {
      c.mask = FlashMask::kAdditive;
    } else {
      return std::nullopt;
    }
    c.mask_dims = *mask_dims;
  }
  absl::StatusOr<FlashAttentionPlan> p = PlanFlashAttention(c);
  if (!p.ok()) return std::nullopt;
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

const std::vector<int64_t>* MaskDims(const std::vector<ir::Tensor>& in, size_t i) {
  return HasInput(in, i) ? &in[i].dims() : nullptr;
}
ir::DType MaskDType(const std::vector<ir::Tensor>& in, size_t i) {
  return HasInput(in, i) ? in[i].dtype() : ir::DType::kBool;
}

// O = Attention(Q, K, V, mask?).
KernelResult Attention(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const ir::DType dtype = in[0].dtype();
  if (!AllOfDType(in, {0, 1, 2}, dtype)) return std::nullopt;
  std::optional<FlashAttentionPlan> p = PlanFor(node, /*forward=*/true, dtype, in[0].dims(), in[1].dims(),
                                                in[2].dims(), MaskDims(in, 3), MaskDType(in, 3));
  if (!p || !AddDropout(ctx, node, *p)) return std::nullopt;
  absl::StatusOr<ir::Tensor> o = ctx.Output(node, 0, dtype, p->out_dims);
  if (!o.ok()) return o.status();
  if (o->num_elements() == 0) return std::vector<ir::Tensor>{*o};
  const void* mask = HasInput(in, 3) ? in[3].device_raw() : nullptr;
  absl::Status st = FlashAttentionForward(*p, in[0].device_raw(), in[1].device_raw(), in[2].device_raw(), mask,
                                          o->device_raw(), ctx.stream);
  if (!st.ok()) return st;
  return std::vector<ir::Tensor>{*o};
}

// dQ, dK, dV = AttentionGrad(dO, Q, K, V, mask?) (dMask? runs on the host).
KernelResult AttentionGrad(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  // dMask (a learned additive bias, T5's) is not computed by the fused kernels yet: the host runs it.
  if (WantsOutput(node, 3)) return std::nullopt;
  const ir::DType dtype = in[1].dtype();
  if (!AllOfDType(in, {0, 1, 2, 3}, dtype)) return std::nullopt;
  std::optional<FlashAttentionPlan> p = PlanFor(node, /*forward=*/false, dtype, in[1].dims(), in[2].dims(),
                                                in[3].dims(), MaskDims(in, 4), MaskDType(in, 4));
  if (!p || in[0].dims() != p->out_dims || !AddDropout(ctx, node, *p)) return std::nullopt;
  std::vector<ir::Tensor> out(3);
  FlashBackwardBuffers b;
  void** grads[3] = {&b.dq, &b.dk, &b.dv};
  for (int i = 0; i < 3; ++i) {
    if (!WantsOutput(node, i)) continue;
    absl::StatusOr<ir::Tensor> t = ctx.Output(node, i, dtype, in[i + 1].dims());
    if (!t.ok()) return t.status();
    out[i] = *t;
    // An empty gradient needs no kernel; its buffer may be null.
    if (t->num_elements() > 0) *grads[i] = t->device_raw();
  }
  b.d_o = in[0].device_raw();
  b.q = in[1].device_raw();
  b.k = in[2].device_raw();
  b.v = in[3].device_raw();
  b.mask = HasInput(in, 4) ? in[4].device_raw() : nullptr;
  b.workspace_bytes = FlashAttentionBackwardWorkspaceBytes(*p, b.dq != nullptr, b.dk != nullptr, b.dv != nullptr);
  absl::StatusOr<void*> ws = ctx.Workspace(node, b.workspace_bytes);
  if (!ws.ok()) return ws.status();
  b.workspace = *ws;
  absl::Status st = FlashAttentionBackward(*p, b, ctx.stream);
  if (!st.ok()) return st;
  return out;
}

// The scratch AttentionGrad takes for `node`, from the graph's shapes (0 where the host runs it).
int64_t AttentionGradWorkspace(const ir::Graph& g, const ir::Node& node) {
  if (WantsOutput(node, 3)) return 0;
  std::optional<std::vector<int64_t>> dims[3];
  for (int i = 0; i < 3; ++i) {
    dims[i] = InputDims(g, node, i + 1);
    if (!dims[i]) return 0;
  }
  const ir::DType dtype = g.value(node.inputs[1]).dtype;
  std::optional<std::vector<int64_t>> mask;
  ir::DType mask_dtype = ir::DType::kBool;
  if (node.inputs.size() > 4 && node.inputs[4] != ir::kNoValue) {
    mask = InputDims(g, node, 4);
    if (!mask) return 0;
    mask_dtype = g.value(node.inputs[4]).dtype;
  }
  std::optional<FlashAttentionPlan> p =
      PlanFor(node, /*forward=*/false, dtype, *dims[0], *dims[1], *dims[2], mask ? &*mask : nullptr, mask_dtype);
  if (!p) return 0;
  auto wants_elements = [&](int i) { return WantsOutput(node, i) && Product(*dims[i]) > 0; };
  return FlashAttentionBackwardWorkspaceBytes(*p, wants_elements(0), wants_elements(1), wants_elements(2));
}

}  // namespace

void RegisterAttentionKernels(KernelTable& table) {
  table[ir::OpKind::kAttention].run = Attention;
  table[ir::OpKind::kAttentionGrad] = {AttentionGrad, AttentionGradWorkspace};
}

}  // namespace onnxpipe::cuda
