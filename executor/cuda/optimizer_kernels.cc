// SGDUpdate, AdamWUpdate, SumSquares, SumScalars and ClipScale (f32 parameters and gradients) in the CUDA
// backend's kernel table (optimizer.h). One update node, or a group of them (the
// optimizer phase's updates of every parameter: Backend::RunGroup), is one multi-tensor step that
// reads each old parameter and state and writes the new ones (in place when the plan hands the
// update the state's own storage). lr and step are scalars read on the host where they are host
// tensors; on the device (the stage executor's under graphs) the step's fp32 scalars are made on the
// device into the first node's workspace, so nothing waits for the device and a captured step
// replays with each step's lr and count.
#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/cuda_status.h"
#include "executor/cuda/optimizer.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {
namespace {

float* MF(const ir::Tensor& t) { return static_cast<float*>(t.device_raw()); }

// A step scalar of dtype `dtype` on the device (read there by the kernels), not a host value.
bool OnDevice(const ir::Tensor& t, ir::DType dtype) {
  return t.has_data() && !t.on_host() && t.dtype() == dtype && t.num_elements() == 1;
}

// The elements of input i of n, when its dims are known.
std::optional<int64_t> InputElements(const ir::Graph& g, const ir::Node& n, size_t i) {
  const auto d = InputDims(g, n, i);
  if (!d) return std::nullopt;
  int64_t e = 1;
  for (int64_t x : *d) e *= x;
  return e;
}

// True when the update node forms its gradient's sum of squares (op.h: UpdateSumSquaresOutput).
bool FormsSumSquares(const ir::Node& node) { return WantsOutput(node, ir::UpdateSumSquaresOutput(node.op)); }

// An update group's workspace: the step scalars (kStepScalarsBytes), then, when its nodes form their gradients' sums
// of squares, the partials of every such update of the graph (any group of them fits).
int64_t UpdateWorkspace(const ir::Graph& g, const ir::Node& node) {
  int64_t chunks = 0;
  if (FormsSumSquares(node)) {
    for (ir::NodeId id : g.LiveNodes()) {
      const ir::Node& n = g.node(id);
      if (n.op != node.op || !FormsSumSquares(n)) continue;
      if (const std::optional<int64_t> e = InputElements(g, n, 1)) chunks += NormChunks(*e);
    }
  }
  return static_cast<int64_t>(kStepScalarsBytes) + chunks * static_cast<int64_t>(sizeof(double));
}

// The group's workspace (UpdateWorkspace): the step scalars, and the partials handed out to `ts` when they form
// their sums of squares.
absl::StatusOr<void*> GroupWorkspace(const KernelContext& ctx, const ir::Node& first,
                                     std::vector<OptimizerTensor>& ts) {
  int64_t chunks = 0;
  for (const OptimizerTensor& t : ts)
    if (t.sum_squares != nullptr) chunks += NormChunks(t.n);
  ASSIGN_OR_RETURN(void* ws, ctx.Workspace(first, static_cast<int64_t>(kStepScalarsBytes) +
                                                       chunks * static_cast<int64_t>(sizeof(double))));
  auto* partials = reinterpret_cast<double*>(static_cast<char*>(ws) + kStepScalarsBytes);
  for (OptimizerTensor& t : ts) {
    if (t.sum_squares == nullptr) continue;
    t.sum_partials = partials;
    partials += NormChunks(t.n);
  }
  return ws;
}

// Output k of an update node, shaped as its input `like`.
absl::StatusOr<ir::Tensor> UpdateOutput(const KernelContext& ctx, const ir::Node& node, int k, const ir::Tensor& like) {
  return ctx.FullOutput(node, k, like.dtype(), like.dims());
}

// The node's optional outputs (op.h), where it has them: the gradient's sum of squares (an f64 device scalar, for
// t.sum_squares) and the parameter's bf16 compute copy (t.param_bf16), shaped as `param`.
absl::Status ExtraOutputs(const KernelContext& ctx, const ir::Node& node, const ir::Tensor& param,
                          std::vector<ir::Tensor>* out, OptimizerTensor* t) {
  if (FormsSumSquares(node)) {
    const int k = ir::UpdateSumSquaresOutput(node.op);
    ASSIGN_OR_RETURN((*out)[k], ctx.Output(node, k, ir::DType::kF64, {}));
    t->sum_squares = static_cast<double*>((*out)[k].device_raw());
  }
  if (const int k = ir::UpdateComputeCopyOutput(node.op); WantsOutput(node, k)) {
    ASSIGN_OR_RETURN((*out)[k], ctx.FullOutput(node, k, ir::DType::kBF16, param.dims()));
    t->param_bf16 = (*out)[k].device_raw();
  }
  return absl::OkStatus();
}

// The device writes a compute copy in bf16 only (another dtype goes to the CPU kernel).
bool CopyOnDevice(const ir::Node& node) {
  return !WantsOutput(node, ir::UpdateComputeCopyOutput(node.op)) ||
         node.attrs.Get<std::string>("copy_to", "") == ir::DTypeName(ir::DType::kBF16);
}

const float* CF(const ir::Tensor& t) { return static_cast<const float*>(t.device_raw()); }

bool SameAs(const ir::Tensor& a, const ir::Tensor& b) {
  return a.has_data() && b.has_data() && a.dtype() == b.dtype() && a.dims() == b.dims();
}

// The optional clipping factor: a device f32 scalar, or null when absent; false when unusable.
bool ScalePointer(const std::vector<ir::Tensor>& in, size_t i, const float** scale) {
  *scale = nullptr;
  if (!HasInput(in, i)) return true;
  if (in[i].dtype() != ir::DType::kF32 || in[i].num_elements() != 1 || in[i].on_host()) return false;
  *scale = static_cast<const float*>(in[i].device_raw());
  return true;
}

// The same tensor (a shared step scalar such as lr): one read serves every node of a group.
bool SameTensor(const ir::Tensor& a, const ir::Tensor& b) {
  return a.defined() == b.defined() && a.address() == b.address() && a.dtype() == b.dtype();
}

// Every node of a group through one kernel: `fits(node, inputs)` says a node can join (the same
// attributes and step scalars as node 0's); `tensor(node, inputs, outputs)` sets up its outputs and
// OptimizerTensor; `step(tensors)` issues the update of them all. A single node is a group of one.
template <typename Fits, typename MakeTensor, typename Step>
GroupResult UpdateGroup(const std::vector<const ir::Node*>& nodes, const std::vector<std::vector<ir::Tensor>>& in,
                        Fits&& fits, MakeTensor&& tensor, Step&& step) {
  for (size_t i = 0; i < nodes.size(); ++i) {
    // the CPU kernel reports what is wrong
    if (!fits(*nodes[i], in[i]) || FormsSumSquares(*nodes[i]) != FormsSumSquares(*nodes[0]) ||
        !CopyOnDevice(*nodes[i])) {
      return std::nullopt;
    }
  }
  std::vector<OptimizerTensor> ts(nodes.size());
  std::vector<std::vector<ir::Tensor>> out(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (absl::Status st = tensor(*nodes[i], in[i], &out[i], &ts[i]); !st.ok()) return st;
  }
  if (absl::Status st = step(ts); !st.ok()) return st;
  return out;
}

// A group function as the entry's single-node kernel.
CudaKernelFn OneNode(CudaGroupFn group) {
  return [group = std::move(group)](const KernelContext& ctx, const ir::Node& node,
                                    const std::vector<ir::Tensor>& in) -> KernelResult {
    GroupResult r = group(ctx, {&node}, {in});
    if (!r.has_value()) return std::nullopt;
    if (!r->ok()) return r->status();
    return std::move((**r)[0]);
  };
}

// param', momentum_buf'? = SGDUpdate(param, grad, lr, momentum_buf?, scale?), for every node.
GroupResult SgdUpdates(const KernelContext& ctx, const std::vector<const ir::Node*>& nodes,
                       const std::vector<std::vector<ir::Tensor>>& in) {
  const ir::Node& first = *nodes[0];
  const double momentum = first.attrs.Get<double>("momentum", 0.0);
  const bool nesterov = first.attrs.Get<int64_t>("nesterov", 0) != 0;
  const double wd = first.attrs.Get<double>("weight_decay", 0.0);
  const float* scale = nullptr;
  if (!ScalePointer(in[0], 4, &scale) || in[0].size() < 3) return std::nullopt;
  auto fits = [&](const ir::Node& node, const std::vector<ir::Tensor>& x) {
    const float* s = nullptr;
    return node.attrs.Get<double>("momentum", 0.0) == momentum &&
           (node.attrs.Get<int64_t>("nesterov", 0) != 0) == nesterov &&
           node.attrs.Get<double>("weight_decay", 0.0) == wd && x.size() >= 3 && x[0].dtype() == ir::DType::kF32 &&
           SameAs(x[0], x[1]) && SameTensor(x[2], in[0][2]) && x[2].num_elements() == 1 &&
           (momentum != 0) == HasInput(x, 3) && (!HasInput(x, 3) || SameAs(x[0], x[3])) &&
           !(nesterov && momentum == 0) && ScalePointer(x, 4, &s) && s == scale &&
           (momentum == 0 || WantsOutput(node, 1));
  };
  auto tensor = [&](const ir::Node& node, const std::vector<ir::Tensor>& x, std::vector<ir::Tensor>* out,
                    OptimizerTensor* t) -> absl::Status {
    out->resize(node.outputs.size());
    ASSIGN_OR_RETURN((*out)[0], UpdateOutput(ctx, node, 0, x[0]));
    t->param = MF((*out)[0]), t->param_in = CF(x[0]), t->grad = CF(x[1]), t->n = x[0].num_elements();
    if (momentum != 0) {
      ASSIGN_OR_RETURN((*out)[1], UpdateOutput(ctx, node, 1, x[3]));
      t->state0 = MF((*out)[1]), t->state0_in = CF(x[3]);
    }
    return ExtraOutputs(ctx, node, x[0], out, t);
  };
  const ir::Tensor& lr = in[0][2];
  if (!lr.on_host() && !OnDevice(lr, ir::DType::kF64)) return std::nullopt;
  auto step = [&](std::vector<OptimizerTensor>& ts) -> absl::Status {
    ASSIGN_OR_RETURN(void* scalars, GroupWorkspace(ctx, first, ts));
    if (lr.on_host()) return SgdStep(ts, lr.GetAsDouble(0), momentum, wd, nesterov, scale, ctx.stream);
    return SgdStepOnDevice(ts, static_cast<const double*>(lr.device_raw()), momentum, wd, nesterov, scale, scalars,
                           ctx.stream);
  };
  return UpdateGroup(nodes, in, fits, tensor, step);
}

// param', m', v' = AdamWUpdate(param, grad, m, v, lr, step, scale?), for every node.
GroupResult AdamWUpdates(const KernelContext& ctx, const std::vector<const ir::Node*>& nodes,
                         const std::vector<std::vector<ir::Tensor>>& in) {
  const ir::Attrs& a = nodes[0]->attrs;
  const double beta1 = a.Get<double>("beta1", 0.9), beta2 = a.Get<double>("beta2", 0.999);
  const double eps = a.Get<double>("eps", 1e-8), wd = a.Get<double>("weight_decay", 0.01);
  const float* scale = nullptr;
  if (!ScalePointer(in[0], 6, &scale) || !HasInput(in[0], 4) || !HasInput(in[0], 5) || in[0][5].num_elements() != 1) {
    return std::nullopt;
  }
  auto fits = [&](const ir::Node& node, const std::vector<ir::Tensor>& x) {
    const ir::Attrs& b = node.attrs;
    const float* s = nullptr;
    return b.Get<double>("beta1", 0.9) == beta1 && b.Get<double>("beta2", 0.999) == beta2 &&
           b.Get<double>("eps", 1e-8) == eps && b.Get<double>("weight_decay", 0.01) == wd && x.size() >= 6 &&
           x[0].dtype() == ir::DType::kF32 && SameAs(x[0], x[1]) && SameAs(x[0], x[2]) && SameAs(x[0], x[3]) &&
           SameTensor(x[4], in[0][4]) && SameTensor(x[5], in[0][5]) && x[4].num_elements() == 1 &&
           x[5].num_elements() == 1 && ScalePointer(x, 6, &s) && s == scale && WantsOutput(node, 1) &&
           WantsOutput(node, 2);
  };
  auto tensor = [&](const ir::Node& node, const std::vector<ir::Tensor>& x, std::vector<ir::Tensor>* out,
                    OptimizerTensor* t) -> absl::Status {
    out->resize(node.outputs.size());
    for (int k = 0; k < 3; ++k) {
      ASSIGN_OR_RETURN((*out)[k], UpdateOutput(ctx, node, k, x[k == 0 ? 0 : k + 1]));
    }
    t->param = MF((*out)[0]), t->param_in = CF(x[0]), t->grad = CF(x[1]);
    t->state0 = MF((*out)[1]), t->state0_in = CF(x[2]), t->state1 = MF((*out)[2]), t->state1_in = CF(x[3]);
    t->n = x[0].num_elements();
    return ExtraOutputs(ctx, node, x[0], out, t);
  };
  // Host scalars: the count is read before any output is set up (one below 1 goes to the CPU kernel's
  // error). Device scalars (graphs): both on the device, the driver's count (>= 1).
  const ir::Tensor &lr = in[0][4], &count = in[0][5];
  const bool host = lr.on_host() && count.on_host();
  if (host ? count.GetAsInt(0) < 1 : !(OnDevice(lr, ir::DType::kF64) && OnDevice(count, ir::DType::kI64))) {
    return std::nullopt;
  }
  auto step = [&](std::vector<OptimizerTensor>& ts) -> absl::Status {
    ASSIGN_OR_RETURN(void* scalars, GroupWorkspace(ctx, *nodes[0], ts));
    if (host) return AdamWStep(ts, lr.GetAsDouble(0), count.GetAsInt(0), beta1, beta2, eps, wd, scale, ctx.stream);
    return AdamWStepOnDevice(ts, static_cast<const double*>(lr.device_raw()),
                             static_cast<const int64_t*>(count.device_raw()), beta1, beta2, eps, wd, scale, scalars,
                             ctx.stream);
  };
  return UpdateGroup(nodes, in, fits, tensor, step);
}

// SumSquares' and SumScalars' result dtype on the device: f32 or f64 (the `to` attribute, input 0's
// dtype by default); nullopt for another (the CPU kernel serves it).
std::optional<bool> F64Result(const ir::Node& node, ir::DType input) {
  const std::optional<ir::DType> to =
      node.attrs.Has("to") ? ir::ParseDType(node.attrs.Get<std::string>("to", "")) : input;
  if (to == ir::DType::kF64) return true;
  if (to == ir::DType::kF32) return false;
  return std::nullopt;
}

// Consecutive SumSquares nodes (a stage's per-gradient sums, Backend::RunGroup) in one pass: every
// node's f32 device inputs are one segment of one LaunchSumSquares. A single node is a group of one.
GroupResult SumSquaresGroup(const KernelContext& ctx, const std::vector<const ir::Node*>& nodes,
                            const std::vector<std::vector<ir::Tensor>>& in) {
  std::vector<const float*> ptrs;
  std::vector<int64_t> sizes;
  std::vector<int> ends;
  std::optional<bool> f64;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (in[i].empty() || !in[i][0].defined()) return std::nullopt;
    const std::optional<bool> node_f64 = F64Result(*nodes[i], in[i][0].dtype());
    if (!node_f64 || (f64 && *f64 != *node_f64)) return std::nullopt;
    f64 = node_f64;
    for (const ir::Tensor& t : in[i]) {
      if (!t.has_data() || t.on_host() || t.dtype() != ir::DType::kF32) return std::nullopt;
      ptrs.push_back(CF(t));
      sizes.push_back(t.num_elements());
    }
    ends.push_back(static_cast<int>(ptrs.size()));
  }
  std::vector<std::vector<ir::Tensor>> outs;
  std::vector<void*> out_ptrs;
  for (const ir::Node* n : nodes) {
    absl::StatusOr<ir::Tensor> out = ctx.Output(*n, 0, *f64 ? ir::DType::kF64 : ir::DType::kF32, {});
    if (!out.ok()) return out.status();
    out_ptrs.push_back(out->device_raw());
    outs.push_back({*out});
  }
  const size_t bytes = SumSquaresWorkspaceBytes(sizes);
  absl::StatusOr<void*> ws = ctx.Workspace(*nodes[0], static_cast<int64_t>(bytes));
  if (!ws.ok()) return ws.status();
  if (absl::Status st = SumSquaresBySegment(ptrs, sizes, ends, out_ptrs, *f64, *ws, bytes, ctx.stream); !st.ok()) {
    return st;
  }
  return outs;
}

// The workspace of any group of the graph's SumSquares nodes: a chunk partial for every input of them all.
int64_t SumSquaresWorkspace(const ir::Graph& g, const ir::Node&) {
  std::vector<int64_t> sizes;
  for (ir::NodeId id : g.LiveNodes()) {
    const ir::Node& n = g.node(id);
    if (n.op != ir::OpKind::kSumSquares) continue;
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (const std::optional<int64_t> e = InputElements(g, n, i)) sizes.push_back(*e);
  }
  return static_cast<int64_t>(SumSquaresWorkspaceBytes(sizes));
}

// SumScalars over f64 device scalars: one thread adds them in input order.
KernelResult SumScalars(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  std::vector<const double*> terms;
  for (const ir::Tensor& t : in) {
    if (!t.has_data() || t.on_host() || t.dtype() != ir::DType::kF64 || t.num_elements() != 1) return std::nullopt;
    terms.push_back(static_cast<const double*>(t.device_raw()));
  }
  const std::optional<bool> f64 = F64Result(node, ir::DType::kF64);
  if (!f64) return std::nullopt;
  absl::StatusOr<ir::Tensor> out = ctx.Output(node, 0, *f64 ? ir::DType::kF64 : ir::DType::kF32, {});
  if (!out.ok()) return out.status();
  absl::StatusOr<void*> carry = ctx.Workspace(node, sizeof(double));
  if (!carry.ok()) return carry.status();
  CUDA_RETURN_IF_ERROR(LaunchSumScalars(terms.data(), static_cast<int>(terms.size()), out->device_raw(), *f64,
                                        static_cast<double*>(*carry), ctx.stream));
  return std::vector<ir::Tensor>{*out};
}

// () f32 = min(1, max_norm / (norm + eps)) in fp32, NaN passing through (the CPU's three fp32
// operations: Add, Div, then Min, which propagates NaN).
KernelResult ClipScale(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const double max_norm = node.attrs.Get<double>("max_norm", 0.0);
  if (in[0].dtype() != ir::DType::kF32 || in[0].num_elements() != 1 || !(max_norm > 0)) return std::nullopt;
  absl::StatusOr<ir::Tensor> out = ctx.Output(node, 0, ir::DType::kF32, {});
  if (!out.ok()) return out.status();
  CUDA_RETURN_IF_ERROR(LaunchClipScale(CF(in[0]), static_cast<float>(max_norm),
                                       static_cast<float>(node.attrs.Get<double>("eps", 1e-6)), MF(*out), ctx.stream));
  return std::vector<ir::Tensor>{*out};
}

}  // namespace

void RegisterOptimizerKernels(KernelTable& table) {
  // Every update node reserves a group's workspace (the group's first node's is used).
  table[ir::OpKind::kSGDUpdate] = {OneNode(SgdUpdates), UpdateWorkspace, /*host_inputs=*/1u << 2, SgdUpdates};
  table[ir::OpKind::kAdamWUpdate] = {OneNode(AdamWUpdates), UpdateWorkspace, /*host_inputs=*/(1u << 4) | (1u << 5),
                                     AdamWUpdates};
  table[ir::OpKind::kSumSquares] = {OneNode(SumSquaresGroup), SumSquaresWorkspace, /*host_inputs=*/0,
                                     SumSquaresGroup};
  table[ir::OpKind::kSumScalars] = {SumScalars, [](const ir::Graph&, const ir::Node&) {
                                      return static_cast<int64_t>(sizeof(double));
                                    }};
  table[ir::OpKind::kClipScale] = {ClipScale, nullptr};
}

}  // namespace onnxpipe::cuda
