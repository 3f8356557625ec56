// Evaluation runs the interpreter on a copy of the forward graph whose parameter constants hold the trained values
// (on the CPU kernels or a backend's);
// the loss is computed on the host in double so that it does not depend on a loss graph's reduction order.
#include "executor/train/evaluate.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "executor/cpu/cpu_evaluator.h"
#include "executor/runtime/interpreter.h"
#include "executor/train/training_graph.h"
#include "frontend/ir/status.h"

namespace onnxpipe::train {
namespace {

// Adds row r of (rows, classes) logits `z` with label y to `out`.
void Score(const double* z, int64_t classes, int64_t y, EvalResult& out) {
  const double zmax = *std::max_element(z, z + classes);
  double sum = 0;
  for (int64_t c = 0; c < classes; ++c) sum += std::exp(z[c] - zmax);
  out.loss_sum += std::log(sum) + zmax - z[y];
  const int64_t arg = std::max_element(z, z + classes) - z;  // first maximum on ties
  out.correct += arg == y ? 1 : 0;
  ++out.counted;
}

}  // namespace

absl::StatusOr<EvalResult> Evaluate(const ir::Graph& forward, const std::map<std::string, ir::Tensor>& params,
                                    const Dataset& data, const EvalOptions& options) {
  RET_CHECK(options.batch >= 1) << "evaluation batch must be >= 1";
  RET_CHECK(options.shards >= 1 && options.shard >= 0 && options.shard < options.shards) << "bad evaluation shard";
  ir::Graph g = forward;
  RETURN_IF_ERROR(autodiff::SetTrainingDType(g, options.dtype, /*freeze_regex=*/""));
  for (const auto& [name, t] : params) {
    const ir::ValueId v = g.FindValue(name);
    if (v == ir::kNoValue || !g.value(v).constant) {
      return NOT_FOUND() << "evaluation: trained parameter '" << name << "' is not a constant of the forward graph";
    }
    g.value(v).constant = t.dtype() == g.value(v).dtype ? t : t.CastTo(g.value(v).dtype);
  }
  const ir::ValueId logits = g.FindValue(options.logits);
  if (logits == ir::kNoValue) return NOT_FOUND() << "evaluation: no value '" << options.logits << "'";
  g.outputs() = {logits};

  cpu::EvalContext ctx;
  ctx.training = false;  // inference: Dropout is the identity
  cpu::CpuEvaluator cpu_evaluator(ctx);
  std::unique_ptr<ir::OpEvaluator> backend_evaluator;
  if (options.evaluator) {
    ASSIGN_OR_RETURN(backend_evaluator, options.evaluator(g));
  }
  const ir::OpEvaluator& evaluator = backend_evaluator ? *backend_evaluator : cpu_evaluator;
  EvalResult out;
  out.samples = data.rows();
  const ir::Tensor& all_labels = data.field(options.labels);
  const int64_t per_row_labels = all_labels.num_elements() / std::max<int64_t>(data.rows(), 1);
  for (int64_t start = options.shard * options.batch; start < data.rows(); start += options.shards * options.batch) {
    const int64_t valid = std::min(options.batch, data.rows() - start);
    std::vector<int64_t> rows(options.batch);
    for (int64_t j = 0; j < options.batch; ++j) rows[j] = start + (j < valid ? j : j % valid);
    std::vector<ir::Tensor> feeds;
    for (ir::ValueId in : g.inputs()) {
      const ir::Value& iv = g.value(in);
      ir::Tensor t = data.Gather(iv.name, rows);
      feeds.push_back(t.dtype() == iv.dtype ? t : t.CastTo(iv.dtype));
    }
    absl::StatusOr<std::vector<ir::Tensor>> r = runtime::Interpret(g, evaluator, feeds);
    if (!r.ok()) return Annotate(r.status(), "evaluation rows " + std::to_string(start));
    const ir::Tensor z = (*r)[0].CastTo(ir::DType::kF64);
    const int64_t classes = z.dims().back();
    const ir::Tensor y = data.Gather(options.labels, rows).CastTo(ir::DType::kI64);
    RET_CHECK(z.num_elements() == y.num_elements() * classes)
        << "evaluation: logits " << z.num_elements() << " elements for " << y.num_elements() << " labels";
    for (int64_t j = 0; j < valid; ++j) {
      for (int64_t k = 0; k < per_row_labels; ++k) {
        const int64_t i = j * per_row_labels + k;
        const int64_t label = y.data<int64_t>()[i];
        if (label == options.ignore_index) continue;
        if (label < 0 || label >= classes) {
          return INVALID_ARGUMENT() << "evaluation row " << start + j << ": label " << label
                                    << " is out of range [0, " << classes << ")";
        }
        Score(z.data<double>() + i * classes, classes, label, out);
      }
    }
  }
  if (out.counted > 0) {
    out.accuracy = static_cast<double>(out.correct) / out.counted;
    out.loss = out.loss_sum / out.counted;
  }
  return out;
}

}  // namespace onnxpipe::train
