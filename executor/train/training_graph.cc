// What feeding the training graph takes: the data fields a model needs and the inputs of one step.
#include "executor/train/training_graph.h"

#include "frontend/autodiff/loss.h"
#include "frontend/ir/status.h"

namespace onnxpipe::train {
namespace {

ir::DType OtherFloat(ir::DType t) { return t == ir::DType::kF32 ? ir::DType::kF64 : ir::DType::kF32; }

}  // namespace

absl::StatusOr<std::vector<FieldSpec>> DataFields(const ir::Graph& forward, const std::string& logits,
                                                  const std::string& labels) {
  std::vector<FieldSpec> fields;
  bool labels_is_input = false;
  for (ir::ValueId v : forward.inputs()) {
    const ir::Value& val = forward.value(v);
    if (!val.shape_known || val.shape.empty()) {
      return INVALID_ARGUMENT() << "model input '" << val.name << "' has "
                                << (val.shape_known ? "rank 0" : "no known shape")
                                << "; training data needs a leading batch dim";
    }
    FieldSpec f;
    f.name = val.name;
    f.dtype = val.dtype;
    f.row_shape.assign(val.shape.begin() + 1, val.shape.end());
    if (val.dtype == ir::DType::kF32 || val.dtype == ir::DType::kF64) {
      f.also_accept.push_back(OtherFloat(val.dtype));
    }
    if (val.name == labels) labels_is_input = true;
    fields.push_back(std::move(f));
  }
  if (labels_is_input || autodiff::FindExistingLoss(forward) != ir::kNoValue) return fields;
  const ir::ValueId lv = forward.FindValue(logits);
  if (lv == ir::kNoValue) {
    std::string outs;
    for (ir::ValueId o : forward.outputs()) outs += (outs.empty() ? "'" : ", '") + forward.value(o).name + "'";
    return NOT_FOUND() << "--logits '" << logits << "' is not a value of the model (its outputs: " << outs << ")";
  }
  const ir::Value& l = forward.value(lv);
  if (!l.shape_known || l.shape.size() < 2 || l.shape.size() > 3) {
    return INVALID_ARGUMENT() << "--logits '" << logits << "' has shape " << ir::ShapeToString(l.shape)
                              << "; expected (B, C) or (B, S, V)";
  }
  FieldSpec f;
  f.name = labels;
  f.dtype = ir::DType::kI64;
  f.row_shape.assign(l.shape.begin() + 1, l.shape.end() - 1);
  f.also_accept = {ir::DType::kI32};
  fields.push_back(std::move(f));
  return fields;
}

std::vector<ir::Tensor> StepInputs(const autodiff::TrainingGraph& tg, const Dataset& data, const TrainOptions& options,
                                   int64_t step, double lr) {
  const std::vector<int64_t> rows = data.BatchRows(step, options.batch, options.shuffle, options.seed);
  std::vector<ir::Tensor> inputs;
  for (ir::ValueId v : tg.graph.inputs()) {
    const ir::Value& in = tg.graph.value(v);
    if (v == tg.optimizer.lr) {
      inputs.push_back(ir::Tensor::Scalar<double>(lr));
    } else if (v == tg.optimizer.step) {
      inputs.push_back(ir::Tensor::Scalar<int64_t>(step + 1));
    } else {
      ir::Tensor t = data.Gather(in.name, rows);
      if (t.dtype() != in.dtype) t = t.CastTo(in.dtype);
      inputs.push_back(std::move(t));
    }
  }
  return inputs;
}

}  // namespace onnxpipe::train
