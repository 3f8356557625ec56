// Softmax, LogSoftmax and their gradients (f32 or bf16, computed in fp32 and rounded once),
// SoftmaxCrossEntropyLoss and its gradient (f32 or bf16 scores, computed in fp32; losses, class
// weights and Stats f32) in the CUDA backend's kernel table (softmax.h). Covered: the softmax axis
// is the last non-trivial one (rows of contiguous classes), i.e. scores (N, C) for the loss; other
// layouts run on the host.
//
// The forward is one fused pass per row writing the loss and the row's Stats (op.h); no log_prob
// is made unless the graph asks for it. The gradient with Stats (what autodiff builds) re-reads the
// scores once and writes dScores in their dtype. The gradient from a log_prob (the graph had one)
// is the fused cross-entropy applied to it: log_softmax of log-probabilities is themselves (their
// log-sum-exp is 0), so p = exp(log_prob) as in the CPU kernel. Labels are checked on the host
// first (a copy of N integers) so that an out-of-range label is the CPU kernel's error rather than
// a NaN.
#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/softmax.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {
namespace {

constexpr int64_t kAlign = 256;
int64_t Aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

const float* F(const ir::Tensor& t) { return static_cast<const float*>(t.device_raw()); }
float* MF(const ir::Tensor& t) { return static_cast<float*>(t.device_raw()); }

// (rows, n) of a softmax over attr axis when everything after the axis has extent 1.
std::optional<std::pair<int64_t, int64_t>> SoftmaxRows(const ir::Node& node, const std::vector<int64_t>& dims) {
  const int64_t rank = static_cast<int64_t>(dims.size());
  int64_t axis = node.attrs.Get<int64_t>("axis", -1);
  if (axis < 0) axis += rank;
  if (rank == 0 || axis < 0 || axis >= rank) return std::nullopt;
  int64_t rows = 1;
  for (int64_t i = 0; i < axis; ++i) rows *= dims[i];
  for (int64_t i = axis + 1; i < rank; ++i)
    if (dims[i] != 1) return std::nullopt;
  return std::make_pair(rows, dims[axis]);
}

template <bool kLog>
KernelResult Softmax(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const auto rn = SoftmaxRows(node, in[0].dims());
  if (!rn) return std::nullopt;
  return WithFloatElement(in[0].dtype(), [&](auto tag) -> KernelResult {
    using T = typename decltype(tag)::type;
    absl::StatusOr<ir::Tensor> y = ctx.FullOutput(node, 0, in[0].dtype(), in[0].dims());
    if (!y.ok()) return y.status();
    if (rn->first > 0 && rn->second > 0) {
      const absl::Status st =
          SoftmaxForward(DevicePtr<const T>(in[0]), DevicePtr<T>(*y), rn->first, rn->second, kLog, ctx.stream);
      if (!st.ok()) return st;
    }
    return std::vector<ir::Tensor>{*y};
  });
}

// dX = SoftmaxGrad(dY, Y) / LogSoftmaxGrad(dY, Y).
template <bool kLog>
KernelResult SoftmaxGrad(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  if (in[0].dtype() != in[1].dtype() || in[0].dims() != in[1].dims()) return std::nullopt;
  const auto rn = SoftmaxRows(node, in[1].dims());
  if (!rn) return std::nullopt;
  return WithFloatElement(in[0].dtype(), [&](auto tag) -> KernelResult {
    using T = typename decltype(tag)::type;
    absl::StatusOr<ir::Tensor> dx = ctx.FullOutput(node, 0, in[0].dtype(), in[1].dims());
    if (!dx.ok()) return dx.status();
    if (rn->first > 0 && rn->second > 0) {
      const absl::Status st = SoftmaxBackward(DevicePtr<const T>(in[0]), DevicePtr<const T>(in[1]), DevicePtr<T>(*dx),
                                              rn->first, rn->second, kLog, ctx.stream);
      if (!st.ok()) return st;
    }
    return std::vector<ir::Tensor>{*dx};
  });
}

// The loss attributes, or nullopt for what the CPU kernel refuses (it reports those).
struct LossAttrs {
  LossReduction reduction;
  bool has_ignore;
  int64_t ignore;
  float smoothing;
};
std::optional<LossAttrs> ReadLossAttrs(const ir::Node& node) {
  const std::string r = node.attrs.Get<std::string>("reduction", "mean");
  LossAttrs a;
  if (r == "mean")
    a.reduction = LossReduction::kMean;
  else if (r == "sum")
    a.reduction = LossReduction::kSum;
  else if (r == "none")
    a.reduction = LossReduction::kNone;
  else
    return std::nullopt;
  a.has_ignore = node.attrs.Has("ignore_index");
  a.ignore = node.attrs.Get<int64_t>("ignore_index", 0);
  const double e = node.attrs.Get<double>("label_smoothing", 0.0);
  if (!(e >= 0.0 && e <= 1.0)) return std::nullopt;
  a.smoothing = static_cast<float>(e);
  return a;
}

// The CPU kernels' check of the labels (a host copy of them).
absl::Status CheckLabels(const KernelContext& ctx, const ir::Node& node, const ir::Tensor& labels, int64_t classes,
                         const LossAttrs& a) {
  ASSIGN_OR_RETURN(ir::Tensor host, ctx.backend->ToHost(labels, ctx.exec.stream));
  for (int64_t i = 0; i < host.num_elements(); ++i) {
    const int64_t l = host.GetAsInt(i);
    if (a.has_ignore && l == a.ignore) continue;
    if (l < 0 || l >= classes) {
      return INVALID_ARGUMENT() << ir::OpName(node.op) << " '" << node.name << "': label " << l << " at position " << i
                                << " is out of range [0, " << classes << ")";
    }
  }
  return absl::OkStatus();
}

// The labels' dims for scores (N, C, d...): (N, d...).
std::vector<int64_t> LabelDims(const ir::Tensor& scores) {
  std::vector<int64_t> d = scores.dims();
  d.erase(d.begin() + 1);
  return d;
}

// Scores (N, C) (trailing extents 1 allowed) of f32 or bf16 with labels (N, 1...) of i64/i32 and fp32 weights (C)?.
bool LossShapesCovered(const ir::Tensor& scores, const ir::Tensor& labels, const ir::Tensor* weights) {
  if (!IsKernelFloat(scores.dtype()) || scores.rank() < 2) return false;
  if (labels.dtype() != ir::DType::kI64 && labels.dtype() != ir::DType::kI32) return false;
  for (int64_t i = 2; i < scores.rank(); ++i)
    if (scores.dims()[i] != 1) return false;
  if (labels.dims() != LabelDims(scores)) return false;
  if (weights != nullptr &&
      (weights->dtype() != ir::DType::kF32 || weights->rank() != 1 || weights->num_elements() != scores.dims()[1]))
    return false;
  return true;
}

// The Stats' dims for scores (N, C, d...): (N, d..., 2).
std::vector<int64_t> StatsDims(const ir::Tensor& scores) {
  std::vector<int64_t> d = LabelDims(scores);
  d.push_back(2);
  return d;
}

// Runs the forward (grad = false) or the gradient from Stats (grad = true) with the labels' type.
template <typename T>
absl::Status CrossEntropyAnyLabels(const KernelContext& ctx, const ir::Tensor& labels, const LossAttrs& a,
                                   CrossEntropyArgs<T, int64_t> args, bool grad) {
  args.has_ignore_index = a.has_ignore;
  args.ignore_index = a.ignore;
  args.label_smoothing = a.smoothing;
  args.reduction = a.reduction;
  if (labels.dtype() == ir::DType::kI64) {
    args.labels = static_cast<const int64_t*>(labels.device_raw());
    return grad ? CrossEntropyGrad(args, ctx.stream) : CrossEntropy(args, ctx.stream);
  }
  CrossEntropyArgs<T, int32_t> a32;
  a32.rows = args.rows, a32.classes = args.classes, a32.logits = args.logits;
  a32.labels = static_cast<const int32_t*>(labels.device_raw());
  a32.weights = args.weights, a32.dloss = args.dloss, a32.loss = args.loss, a32.dlogits = args.dlogits;
  a32.stats = args.stats, a32.workspace = args.workspace;
  a32.has_ignore_index = args.has_ignore_index, a32.ignore_index = args.ignore_index;
  a32.label_smoothing = args.label_smoothing, a32.reduction = args.reduction;
  return grad ? CrossEntropyGrad(a32, ctx.stream) : CrossEntropy(a32, ctx.stream);
}

// Forward scratch: the cross-entropy's.
int64_t LossWorkspace(int64_t rows) { return Aligned(CrossEntropyWorkspaceBytes(rows)); }
// Backward scratch: the cross-entropy's, then (from a log_prob) the unused recomputed loss.
int64_t LossGradWorkspace(int64_t rows, bool from_log_prob) {
  return Aligned(CrossEntropyWorkspaceBytes(rows)) + (from_log_prob ? rows * 4 : 0);
}

// Loss, log_prob?, Stats? = SoftmaxCrossEntropyLoss(scores, labels, weights?).
KernelResult Sce(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const std::optional<LossAttrs> a = ReadLossAttrs(node);
  const bool keep_lp = WantsOutput(node, 1);
  // log_prob (f32, the scores' dims) is made by the f32 softmax kernel: bf16 scores with it run on the host.
  if (!a || !LossShapesCovered(in[0], in[1], HasInput(in, 2) ? &in[2] : nullptr) || in[0].num_elements() == 0 ||
      (keep_lp && in[0].dtype() != ir::DType::kF32)) {
    return std::nullopt;
  }
  const int64_t rows = in[0].dims()[0], classes = in[0].dims()[1];
  if (const absl::Status st = CheckLabels(ctx, node, in[1], classes, *a); !st.ok()) return st;
  absl::StatusOr<void*> ws = ctx.Workspace(node, LossWorkspace(rows));
  if (!ws.ok()) return ws.status();
  std::vector<ir::Tensor> out(3);
  absl::StatusOr<ir::Tensor> loss = ctx.Output(
      node, 0, ir::DType::kF32, a->reduction == LossReduction::kNone ? in[1].dims() : std::vector<int64_t>{});
  if (!loss.ok()) return loss.status();
  out[0] = *loss;
  if (keep_lp) {
    absl::StatusOr<ir::Tensor> t = ctx.FullOutput(node, 1, ir::DType::kF32, in[0].dims());
    if (!t.ok()) return t.status();
    out[1] = *t;
    if (absl::Status st = SoftmaxForward(F(in[0]), MF(*t), rows, classes, /*log=*/true, ctx.stream); !st.ok()) return st;
  }
  if (WantsOutput(node, 2)) {
    absl::StatusOr<ir::Tensor> t = ctx.FullOutput(node, 2, ir::DType::kF32, StatsDims(in[0]));
    if (!t.ok()) return t.status();
    out[2] = *t;
  }
  return WithFloatElement(in[0].dtype(), [&](auto tag) -> KernelResult {
    using T = typename decltype(tag)::type;
    CrossEntropyArgs<T, int64_t> args;
    args.rows = rows, args.classes = classes, args.logits = DevicePtr<const T>(in[0]);
    args.weights = HasInput(in, 2) ? F(in[2]) : nullptr;
    args.loss = MF(*loss);
    args.stats = out[2].defined() ? MF(out[2]) : nullptr;
    args.workspace = static_cast<float*>(*ws);
    if (absl::Status st = CrossEntropyAnyLabels(ctx, in[1], *a, args, /*grad=*/false); !st.ok()) return st;
    out.resize(node.outputs.size());
    return out;
  });
}

// dScores = SoftmaxCrossEntropyLossGrad(dLoss, scores, labels, weights?, Stats) in the scores' dtype, or
// SoftmaxCrossEntropyLossGrad(dLoss, log_prob, labels, weights?) (f32).
KernelResult SceGrad(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const std::optional<LossAttrs> a = ReadLossAttrs(node);
  const bool has_stats = HasInput(in, 4);
  if (!a || in[0].dtype() != ir::DType::kF32 || !LossShapesCovered(in[1], in[2], HasInput(in, 3) ? &in[3] : nullptr) ||
      in[1].num_elements() == 0 || (!has_stats && in[1].dtype() != ir::DType::kF32) ||
      (has_stats && (in[4].dtype() != ir::DType::kF32 || in[4].dims() != StatsDims(in[1])))) {
    return std::nullopt;
  }
  const int64_t rows = in[1].dims()[0], classes = in[1].dims()[1];
  if (a->reduction == LossReduction::kNone ? in[0].dims() != LabelDims(in[1]) : in[0].num_elements() != 1) {
    return std::nullopt;
  }
  if (const absl::Status st = CheckLabels(ctx, node, in[2], classes, *a); !st.ok()) return st;
  absl::StatusOr<void*> ws = ctx.Workspace(node, LossGradWorkspace(rows, !has_stats));
  if (!ws.ok()) return ws.status();
  absl::StatusOr<ir::Tensor> d = ctx.FullOutput(node, 0, in[1].dtype(), in[1].dims());
  if (!d.ok()) return d.status();
  return WithFloatElement(in[1].dtype(), [&](auto tag) -> KernelResult {
    using T = typename decltype(tag)::type;
    CrossEntropyArgs<T, int64_t> args;
    args.rows = rows, args.classes = classes, args.logits = DevicePtr<const T>(in[1]);
    args.weights = HasInput(in, 3) ? F(in[3]) : nullptr;
    args.dloss = F(in[0]);
    args.workspace = static_cast<float*>(*ws);
    args.dlogits = DevicePtr<T>(*d);
    if (has_stats) {
      args.stats = MF(in[4]);
    } else {
      args.loss = args.workspace + Aligned(CrossEntropyWorkspaceBytes(rows)) / 4;
    }
    if (absl::Status st = CrossEntropyAnyLabels(ctx, in[2], *a, args, /*grad=*/has_stats); !st.ok()) return st;
    return std::vector<ir::Tensor>{*d};
  });
}

int64_t SceWorkspace(const ir::Graph& g, const ir::Node& node) {
  const auto s = InputDims(g, node, 0);
  if (!s || s->size() < 2) return 0;
  return LossWorkspace((*s)[0]);
}
int64_t SceGradWorkspace(const ir::Graph& g, const ir::Node& node) {
  const auto s = InputDims(g, node, 1);
  if (!s || s->size() < 2) return 0;
  const bool has_stats = node.inputs.size() > 4 && node.inputs[4] != ir::kNoValue;
  return LossGradWorkspace((*s)[0], !has_stats);
}

}  // namespace

void RegisterSoftmaxKernels(KernelTable& table) {
  table[ir::OpKind::kSoftmax].run = Softmax<false>;
  table[ir::OpKind::kLogSoftmax].run = Softmax<true>;
  table[ir::OpKind::kSoftmaxGrad].run = SoftmaxGrad<false>;
  table[ir::OpKind::kLogSoftmaxGrad].run = SoftmaxGrad<true>;
  table[ir::OpKind::kSoftmaxCrossEntropyLoss] = {Sce, SceWorkspace};
  table[ir::OpKind::kSoftmaxCrossEntropyLossGrad] = {SceGrad, SceGradWorkspace};
}

}  // namespace onnxpipe::cuda
