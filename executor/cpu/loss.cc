// SoftmaxCrossEntropyLoss (ONNX opset 13): scores (N, C, D1..Dk), labels (N, D1..Dk), optional
// class weights (C). loss[n, d] = -w[label] * log_softmax(scores)[n, label, d]; positions whose
// label equals ignore_index contribute 0 and no weight. reduction: "none" (N, D1..Dk), "sum",
// "mean" = sum / sum of the weights of the non-ignored positions (their count without weights),
// as the ONNX reference and PyTorch. Optional second output: log_prob, shaped like scores.
// Optional third output (op.h): Stats, the labels' dims + (2): per position the maximum m and
// s = log(sum exp(x - m)) of which log_prob = (x - m) - s is made; the loss is computed from them
// (not from a stored log_prob), with the same values to the bit. Half scores reach this kernel
// widened to f32 (cpu_evaluator.cc), and its outputs stay f32 (ir::KeepsF32Output).
// A label outside [0, C) that is not ignore_index is an error naming the position.
// Attr label_smoothing e (op.h; PyTorch's CrossEntropyLoss(label_smoothing)): the loss of a
// position becomes (1-e) w[label] (-log p[label]) + e/C sum_c w[c] (-log p[c]), same reductions.
#include <cmath>
#include <limits>

#include "executor/cpu/kernel_util.h"

namespace onnxpipe::cpu {
namespace {

using Outputs = absl::StatusOr<std::vector<ir::Tensor>>;

Outputs SceKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& scores = in[0];
  const ir::Tensor& labels = in[1];
  const bool has_w = HasInput(in, 2);
  if (scores.rank() < 2) {
    return INVALID_ARGUMENT() << Describe(node) << ": scores must be (N, C, ...), got "
                              << DimsToString(scores.dims());
  }
  if (labels.dtype() != ir::DType::kI64 && labels.dtype() != ir::DType::kI32) {
    return UnsupportedDType(node, "input 1 (labels)", labels.dtype(), {ir::DType::kI64, ir::DType::kI32});
  }
  std::vector<int64_t> label_dims = scores.dims();
  label_dims.erase(label_dims.begin() + 1);
  if (labels.dims() != label_dims) {
    return INVALID_ARGUMENT() << Describe(node) << ": labels have shape " << DimsToString(labels.dims())
                              << ", expected " << DimsToString(label_dims) << " for scores "
                              << DimsToString(scores.dims());
  }
  const int64_t n = scores.dims()[0], c = scores.dims()[1];
  const int64_t d = n * c == 0 ? 0 : scores.num_elements() / (n * c);
  if (has_w && (in[2].dtype() != scores.dtype() || in[2].rank() != 1 || in[2].dims()[0] != c)) {
    return INVALID_ARGUMENT() << Describe(node) << ": weights are " << ir::DTypeName(in[2].dtype())
                              << DimsToString(in[2].dims()) << ", expected " << ir::DTypeName(scores.dtype())
                              << "[" << c << "]";
  }
  const std::string reduction = node.attrs.Get<std::string>("reduction", "mean");
  if (reduction != "mean" && reduction != "sum" && reduction != "none") {
    return INVALID_ARGUMENT() << Describe(node) << ": reduction is '" << reduction
                              << "', expected 'mean', 'sum' or 'none'";
  }
  const bool has_ignore = node.attrs.Has("ignore_index");
  const int64_t ignore = node.attrs.Get<int64_t>("ignore_index", 0);
  const double smoothing = node.attrs.Get<double>("label_smoothing", 0.0);
  if (!(smoothing >= 0.0 && smoothing <= 1.0)) {
    return INVALID_ARGUMENT() << Describe(node) << ": label_smoothing is " << smoothing << ", expected [0, 1]";
  }
  for (int64_t i = 0; i < labels.num_elements(); ++i) {
    const int64_t l = labels.GetAsInt(i);
    if (has_ignore && l == ignore) continue;
    if (l < 0 || l >= c) {
      return INVALID_ARGUMENT() << Describe(node) << ": label " << l << " at position " << i
                                << " is out of range [0, " << c << ")"
                                << (has_ignore ? " and is not ignore_index " + std::to_string(ignore) : "");
    }
  }
  return DispatchDType(FloatTypes{}, node, "input 0", scores.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    const int64_t lines = n * d;
    // Stats: output 2, or a temporary of two values per line when the node does not output it.
    ir::Tensor stats;
    if (WantsOutput(node, 2)) {
      std::vector<int64_t> stats_dims = label_dims;
      stats_dims.push_back(2);
      ASSIGN_OR_RETURN(stats, AllocOutput(node, ctx, 2, scores.dtype(), stats_dims));
    } else {
      stats = ir::Tensor(scores.dtype(), {lines, 2});
    }
    ir::Tensor log_prob;
    if (WantsOutput(node, 1)) {
      ASSIGN_OR_RETURN(log_prob, AllocOutput(node, ctx, 1, scores.dtype(), scores.dims()));
    }
    const T* x = scores.data<T>();
    T* st = stats.mutable_data<T>();
    T* lp = log_prob.defined() ? log_prob.mutable_data<T>() : nullptr;
    // The statistics of log_softmax over C for each (n, d) line (stride d).
    ParallelFor(lines, std::max<int64_t>(1, 8192 / std::max<int64_t>(c, 1)), [&](int64_t b, int64_t e) {
      for (int64_t line = b; line < e; ++line) {
        const int64_t base = (line / d) * c * d + line % d;
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < c; ++j) mx = std::max(mx, x[base + j * d]);
        double sum = 0;
        for (int64_t j = 0; j < c; ++j) sum += std::exp(x[base + j * d] - mx);
        const T lse = static_cast<T>(std::log(sum));
        st[2 * line] = mx;
        st[2 * line + 1] = lse;
        if (lp != nullptr) {
          for (int64_t j = 0; j < c; ++j) lp[base + j * d] = x[base + j * d] - mx - lse;
        }
      }
    });
    // log_prob[line, j], evaluated as the loop above stores it.
    auto logp = [&](int64_t line, int64_t j) -> T {
      return x[(line / d) * c * d + j * d + line % d] - st[2 * line] - st[2 * line + 1];
    };
    const bool per_line = reduction == "none";
    ASSIGN_OR_RETURN(ir::Tensor loss, AllocOutput(node, ctx, 0, scores.dtype(),
                                                  per_line ? label_dims : std::vector<int64_t>{}));
    T* l = loss.mutable_data<T>();
    const T* w = has_w ? in[2].data<T>() : nullptr;
    double total = 0, weight_sum = 0;
    for (int64_t line = 0; line < lines; ++line) {
      const int64_t label = labels.GetAsInt(line);
      if (has_ignore && label == ignore) continue;
      const T wt = w ? w[label] : T(1);
      T li = -wt * logp(line, label);
      if (smoothing != 0.0) {
        double smooth = 0;
        for (int64_t j = 0; j < c; ++j) smooth -= (w ? w[j] : T(1)) * logp(line, j);
        li = static_cast<T>((1.0 - smoothing) * li + smoothing / static_cast<double>(c) * smooth);
      }
      if (per_line) l[line] = li;
      total += li;
      weight_sum += wt;
    }
    if (reduction == "sum") {
      l[0] = static_cast<T>(total);
    } else if (!per_line) {
      l[0] = static_cast<T>(total / weight_sum);
    }
    return std::vector<ir::Tensor>{loss, log_prob, WantsOutput(node, 2) ? stats : ir::Tensor()};
  });
}
REGISTER_CPU_KERNEL(kSoftmaxCrossEntropyLoss, SceKernel);

}  // namespace
}  // namespace onnxpipe::cpu
