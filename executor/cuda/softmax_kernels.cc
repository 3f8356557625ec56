// Softmax, LogSoftmax and their gradients (f32 or bf16, computed in fp32 and rounded once),
// SoftmaxCrossEntropyLoss and its gradient (f32: a bf16 graph casts its logits to f32 first) in the
// CUDA backend's kernel table (softmax.h). Covered: the softmax axis is the last non-trivial one
// (rows of contiguous classes), i.e. scores (N, C) for the loss; other layouts run on the host.
//
// The loss gradient is the fused cross-entropy applied to the forward's log_prob: log_softmax of
// log-probabilities is themselves (their log-sum-exp is 0), so p = exp(log_prob) as in the CPU
// kernel. Labels are checked on the host first (a copy of N integers) so that an out-of-range
// label is the CPU kernel's error rather than a NaN.
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

// Scores (N, C) (trailing extents 1 allowed) with labels (N, 1...) of i64/i32 and fp32 weights (C)?.
bool LossShapesCovered(const ir::Tensor& scores, const ir::Tensor& labels, const ir::Tensor* weights) {
  if (scores.dtype() != ir::DType::kF32 || scores.rank() < 2) return false;
  if (labels.dtype() != ir::DType::kI64 && labels.dtype() != ir::DType::kI32) return false;
  for (int64_t i = 2; i < scores.rank(); ++i)
    if (scores.dims()[i] != 1) return false;
  if (labels.dims() != LabelDims(scores)) return false;
  if (weights != nullptr && (weights->dtype() != ir::DType::kF32 || weights->num_elements() != scores.dims()[1]))
    return false;
  return true;
}

template <typename L>
absl::Status RunCrossEntropy(const KernelContext& ctx, CrossEntropyArgs<float, L> args, const LossAttrs& a) {
  args.has_ignore_index = a.has_ignore;
  args.ignore_index = a.ignore;
  args.label_smoothing = a.smoothing;
  args.reduction = a.reduction;
  return CrossEntropy(args, ctx.stream);
}

absl::Status CrossEntropyAnyLabels(const KernelContext& ctx, const ir::Tensor& labels, const LossAttrs& a,
                                   CrossEntropyArgs<float, int64_t> args) {
  if (labels.dtype() == ir::DType::kI64) {
    args.labels = static_cast<const int64_t*>(labels.device_raw());
    return RunCrossEntropy(ctx, args, a);
  }
  CrossEntropyArgs<float, int32_t> a32;
  a32.rows = args.rows, a32.classes = args.classes, a32.logits = args.logits;
  a32.labels = static_cast<const int32_t*>(labels.device_raw());
  a32.weights = args.weights, a32.dloss = args.dloss, a32.loss = args.loss, a32.dlogits = args.dlogits;
  a32.workspace = args.workspace;
  return RunCrossEntropy(ctx, a32, a);
}

// Forward scratch: the cross-entropy's, then log_prob when the graph does not keep it.
int64_t LossWorkspace(int64_t rows, int64_t classes, bool log_prob_kept) {
  return Aligned(CrossEntropyWorkspaceBytes(rows)) + (log_prob_kept ? 0 : rows * classes * 4);
}
// Backward scratch: the cross-entropy's, then the (unused) recomputed loss.
int64_t LossGradWorkspace(int64_t rows) { return Aligned(CrossEntropyWorkspaceBytes(rows)) + rows * 4; }

// Loss, log_prob? = SoftmaxCrossEntropyLoss(scores, labels, weights?).
KernelResult Sce(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const std::optional<LossAttrs> a = ReadLossAttrs(node);
  if (!a || !LossShapesCovered(in[0], in[1], HasInput(in, 2) ? &in[2] : nullptr) || in[0].num_elements() == 0 ||
      (HasInput(in, 2) && in[2].rank() != 1)) {
    return std::nullopt;
  }
  const int64_t rows = in[0].dims()[0], classes = in[0].dims()[1];
  if (const absl::Status st = CheckLabels(ctx, node, in[1], classes, *a); !st.ok()) return st;
  const bool keep_lp = WantsOutput(node, 1);
  absl::StatusOr<void*> ws = ctx.Workspace(node, LossWorkspace(rows, classes, keep_lp));
  if (!ws.ok()) return ws.status();
  std::vector<ir::Tensor> out(2);
  absl::StatusOr<ir::Tensor> loss = ctx.Output(
      node, 0, ir::DType::kF32, a->reduction == LossReduction::kNone ? in[1].dims() : std::vector<int64_t>{});
  if (!loss.ok()) return loss.status();
  out[0] = *loss;
  float* lp = static_cast<float*>(*ws) + Aligned(CrossEntropyWorkspaceBytes(rows)) / 4;
  if (keep_lp) {
    absl::StatusOr<ir::Tensor> t = ctx.Output(node, 1, ir::DType::kF32, in[0].dims());
    if (!t.ok()) return t.status();
    out[1] = *t;
    lp = MF(*t);
  }
  if (absl::Status st = SoftmaxForward(F(in[0]), lp, rows, classes, /*log=*/true, ctx.stream); !st.ok()) return st;
  CrossEntropyArgs<float, int64_t> args;
  args.rows = rows, args.classes = classes, args.logits = F(in[0]);
  args.weights = HasInput(in, 2) ? F(in[2]) : nullptr;
  args.loss = MF(*loss);
  args.workspace = static_cast<float*>(*ws);
  if (absl::Status st = CrossEntropyAnyLabels(ctx, in[1], *a, args); !st.ok()) return st;
  return out;
}

// dScores = SoftmaxCrossEntropyLossGrad(dLoss, log_prob, labels, weights?).
KernelResult SceGrad(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const std::optional<LossAttrs> a = ReadLossAttrs(node);
  if (!a || in[0].dtype() != ir::DType::kF32 || !LossShapesCovered(in[1], in[2], HasInput(in, 3) ? &in[3] : nullptr) ||
      in[1].num_elements() == 0) {
    return std::nullopt;
  }
  const int64_t rows = in[1].dims()[0], classes = in[1].dims()[1];
  if (a->reduction == LossReduction::kNone ? in[0].dims() != LabelDims(in[1]) : in[0].num_elements() != 1) {
    return std::nullopt;
  }
  if (const absl::Status st = CheckLabels(ctx, node, in[2], classes, *a); !st.ok()) return st;
  absl::StatusOr<void*> ws = ctx.Workspace(node, LossGradWorkspace(rows));
  if (!ws.ok()) return ws.status();
  absl::StatusOr<ir::Tensor> d = ctx.Output(node, 0, ir::DType::kF32, in[1].dims());
  if (!d.ok()) return d.status();
  CrossEntropyArgs<float, int64_t> args;
  args.rows = rows, args.classes = classes, args.logits = F(in[1]);
  args.weights = HasInput(in, 3) ? F(in[3]) : nullptr;
  args.dloss = F(in[0]);
  args.workspace = static_cast<float*>(*ws);
  args.loss = args.workspace + Aligned(CrossEntropyWorkspaceBytes(rows)) / 4;
  args.dlogits = MF(*d);
  if (absl::Status st = CrossEntropyAnyLabels(ctx, in[2], *a, args); !st.ok()) return st;
  return std::vector<ir::Tensor>{*d};
}

int64_t SceWorkspace(const ir::Graph& g, const ir::Node& node) {
  const auto s = InputDims(g, node, 0);
  if (!s || s->size() < 2) return 0;
  return LossWorkspace((*s)[0], (*s)[1], WantsOutput(node, 1));
}
int64_t SceGradWorkspace(const ir::Graph& g, const ir::Node& node) {
  const auto s = InputDims(g, node, 1);
  if (!s || s->size() < 2) return 0;
  return LossGradWorkspace((*s)[0]);
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
