// SoftmaxCrossEntropyLossGrad(dLoss, X, labels, weights?, Stats?) -> dScores, from the forward's
// log-probabilities (class axis 1, scores (N, C, d1, ...), labels (N, d1, ...)): X is log_prob, or
// with the forward's Stats (m, s per position) X is the scores and log_prob = (x - m) - s is
// recomputed exactly as the forward evaluates it (loss.cc), so both forms give the same bits. Half
// scores reach this kernel widened to f32 and dScores is rounded to their dtype (cpu_evaluator.cc).
// With p = exp(log_prob),
// class weights w (1 when absent), W = sum(w) and label smoothing e, the loss of one element with
// label l is (1-e) w_l (-log p_l) + e/C sum_c w_c (-log p_c) (PyTorch's CrossEntropyLoss), whose
// gradient with respect to the scores is
//   (1-e) w_l (p_c - [c == l]) + e/C (W p_c - w_c),
// scaled by dLoss (reduction "sum"), dLoss / sum of w_l over non-ignored elements ("mean") or
// dLoss[element] ("none"); ignored elements get zeros.
#include <cmath>

#include "executor/cpu/grad_util.h"

namespace onnxpipe::cpu {
namespace {

using Outputs = absl::StatusOr<std::vector<ir::Tensor>>;

Outputs SoftmaxCrossEntropyLossGradKernel(const ir::Node& node, const std::vector<ir::Tensor>& in,
                                          const EvalContext& ctx) {
  const ir::Tensor& dloss = in[0];
  const ir::Tensor& lp = in[1];  // log_prob, or the scores with Stats
  const ir::Tensor& labels = in[2];
  const bool has_w = HasInput(in, 3);
  const bool has_stats = HasInput(in, 4);
  if (lp.rank() < 2) {
    return INVALID_ARGUMENT() << Describe(node) << ": " << (has_stats ? "scores" : "log_prob") << " must be (N, C, ...)";
  }
  const int64_t n = lp.dims()[0], c = lp.dims()[1];
  std::vector<int64_t> label_dims = {n};
  label_dims.insert(label_dims.end(), lp.dims().begin() + 2, lp.dims().end());
  if (labels.dims() != label_dims || !ir::IsInteger(labels.dtype())) {
    return INVALID_ARGUMENT() << Describe(node) << ": labels " << ir::DTypeName(labels.dtype())
                              << DimsToString(labels.dims()) << " must be integers of shape "
                              << DimsToString(label_dims);
  }
  if (dloss.dtype() != lp.dtype() || (has_w && (in[3].dtype() != lp.dtype() || in[3].num_elements() != c))) {
    return INVALID_ARGUMENT() << Describe(node) << ": dLoss and weights must be " << ir::DTypeName(lp.dtype())
                              << ", weights of " << c << " elements";
  }
  if (has_stats) {
    std::vector<int64_t> stats_dims = label_dims;
    stats_dims.push_back(2);
    if (in[4].dtype() != lp.dtype() || in[4].dims() != stats_dims) {
      return INVALID_ARGUMENT() << Describe(node) << ": Stats are " << ir::DTypeName(in[4].dtype())
                                << DimsToString(in[4].dims()) << ", expected " << ir::DTypeName(lp.dtype())
                                << DimsToString(stats_dims);
    }
  }
  const std::string reduction = node.attrs.Get<std::string>("reduction", "mean");
  if (reduction != "mean" && reduction != "sum" && reduction != "none") {
    return INVALID_ARGUMENT() << Describe(node) << ": reduction '" << reduction << "', expected mean|sum|none";
  }
  const int64_t inner = labels.num_elements() / std::max<int64_t>(n, 1);
  if (reduction == "none" ? dloss.dims() != label_dims : dloss.num_elements() != 1) {
    return INVALID_ARGUMENT() << Describe(node) << ": dLoss has shape " << DimsToString(dloss.dims());
  }
  const bool has_ignore = node.attrs.Has("ignore_index");
  const int64_t ignore = node.attrs.Get<int64_t>("ignore_index", 0);
  const double eps = node.attrs.Get<double>("label_smoothing", 0.0);
  const int64_t count = labels.num_elements();
  // Label i, or -1 when ignored; checked up front, read again where used (no table allocated).
  auto label = [&](int64_t i) -> int64_t {
    const int64_t l = labels.GetAsInt(i);
    return has_ignore && l == ignore ? -1 : l;
  };
  for (int64_t i = 0; i < count; ++i) {
    const int64_t l = label(i);
    if (l != -1 && (l < 0 || l >= c)) {
      return INVALID_ARGUMENT() << Describe(node) << ": label " << l << " at position " << i
                                << " is outside [0, " << c << ")";
    }
  }
  return DispatchDType(FloatTypes{}, node, "input 1", lp.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    const T* pl = lp.data<T>();
    const T* st = has_stats ? in[4].data<T>() : nullptr;
    const T* pw = has_w ? in[3].data<T>() : nullptr;
    const T* pd = dloss.data<T>();
    auto weight = [&](int64_t k) { return pw ? static_cast<double>(pw[k]) : 1.0; };
    double wsum = 0;
    for (int64_t k = 0; k < c; ++k) wsum += weight(k);
    double denom = 0;
    for (int64_t i = 0; i < count; ++i)
      if (label(i) >= 0) denom += weight(label(i));
    ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, lp.dtype(), lp.dims()));
    T* po = out.mutable_data<T>();
    ParallelFor(count, std::max<int64_t>(1, 4096 / std::max<int64_t>(c, 1)), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const int64_t ni = i / inner, si = i % inner;
        const int64_t base = ni * c * inner + si;
        const int64_t l = label(i);
        double coef = 0;
        if (l >= 0) {
          if (reduction == "none") coef = pd[i];
          else if (reduction == "sum") coef = pd[0];
          else coef = denom != 0 ? pd[0] / denom : 0.0;
        }
        if (coef == 0) {
          for (int64_t k = 0; k < c; ++k) po[base + k * inner] = T(0);
          continue;
        }
        const double wl = weight(l);
        for (int64_t k = 0; k < c; ++k) {
          const T lpk = st ? pl[base + k * inner] - st[2 * i] - st[2 * i + 1] : pl[base + k * inner];
          const double p = std::exp(static_cast<double>(lpk));
          double g = (1.0 - eps) * wl * (p - (k == l ? 1.0 : 0.0));
          if (eps != 0) g += eps / static_cast<double>(c) * (wsum * p - weight(k));
          po[base + k * inner] = static_cast<T>(coef * g);
        }
      }
    });
    return std::vector<ir::Tensor>{out};
  });
}
REGISTER_CPU_KERNEL(kSoftmaxCrossEntropyLossGrad, SoftmaxCrossEntropyLossGradKernel);

}  // namespace
}  // namespace onnxpipe::cpu
