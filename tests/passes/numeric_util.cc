#include "tests/passes/numeric_util.h"

#include <cmath>
#include <filesystem>
#include <random>

#include "executor/cpu/cpu_evaluator.h"
#include "executor/runtime/interpreter.h"
#include "frontend/autodiff/autodiff.h"
#include "frontend/ir/infer.h"
#include "frontend/ir/status.h"
#include "frontend/ir/verifier.h"
#include "frontend/onnx/loader.h"
#include "frontend/onnx/stage_export.h"

namespace onnxpipe::passes::testing {

absl::StatusOr<std::vector<ir::Tensor>> RandomFeeds(const ir::Graph& g, const std::map<std::string, int64_t>& dims,
                                                    uint32_t seed, int64_t int_high) {
  std::mt19937 rng(seed);
  std::vector<ir::Tensor> feeds;
  for (ir::ValueId id : g.inputs()) {
    const ir::Value& v = g.value(id);
    std::vector<int64_t> shape;
    for (const ir::Dim& d : v.shape) {
      ir::Dim bound = d.Bind(dims);
      if (!bound.is_concrete())
        return INVALID_ARGUMENT() << "input '" << v.name << "' has unbound dim " << d.ToString();
      shape.push_back(bound.value());
    }
    ir::Tensor t(v.dtype, shape);
    const int64_t n = t.num_elements();
    std::uniform_real_distribution<double> real(-1.0, 1.0);
    for (int64_t i = 0; i < n; ++i) {
      switch (v.dtype) {
        case ir::DType::kF32:
          t.mutable_data<float>()[i] = static_cast<float>(real(rng));
          break;
        case ir::DType::kF64:
          t.mutable_data<double>()[i] = real(rng);
          break;
        // Mostly true: a row of all-false keys is an edge case the unfused graph leaves NaN.
        case ir::DType::kBool:
          t.mutable_data<bool>()[i] = real(rng) > -0.6;
          break;
        case ir::DType::kI64:
          t.mutable_data<int64_t>()[i] = static_cast<int64_t>(rng() % int_high);
          break;
        case ir::DType::kI32:
          t.mutable_data<int32_t>()[i] = static_cast<int32_t>(rng() % int_high);
          break;
        default:
          return UNIMPLEMENTED() << "RandomFeeds: dtype " << ir::DTypeName(v.dtype);
      }
    }
    feeds.push_back(std::move(t));
  }
  return feeds;
}

absl::StatusOr<std::vector<ir::Tensor>> Evaluate(const ir::Graph& g, const std::vector<ir::Tensor>& feeds,
                                                 bool training) {
  cpu::CpuEvaluator ev(cpu::EvalContext{.training = training, .seed = 1});
  return runtime::Interpret(g, ev, feeds);
}

absl::StatusOr<std::vector<ir::Tensor>> LossAndGradients(ir::Graph g, bool training) {
  RETURN_IF_ERROR(autodiff::BuildGradients(&g, g.outputs()[0], {}).status());
  RETURN_IF_ERROR(ir::Verify(g));
  ASSIGN_OR_RETURN(std::vector<ir::Tensor> feeds, RandomFeeds(g, {}, 7));
  return Evaluate(g, feeds, training);
}

absl::StatusOr<ir::Graph> StageOnnxRoundTrip(const ir::Graph& g, const std::string& name) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  absl::Status st = onnx_frontend::ExportStageOnnx(g, path);
  absl::StatusOr<onnx_frontend::LoadedModel> m =
      st.ok() ? onnx_frontend::LoadOnnxModel(path) : absl::StatusOr<onnx_frontend::LoadedModel>(st);
  std::filesystem::remove(path);
  RETURN_IF_ERROR(m.status());
  ir::Graph back = *m->graph;
  RETURN_IF_ERROR(ir::InferShapes(back));
  return back;
}

absl::StatusOr<double> MaxAbsDiff(const std::vector<ir::Tensor>& a, const std::vector<ir::Tensor>& b) {
  if (a.size() != b.size()) return INVALID_ARGUMENT() << "output counts differ: " << a.size() << " vs " << b.size();
  double worst = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k].dtype() != b[k].dtype() || a[k].dims() != b[k].dims()) {
      return INVALID_ARGUMENT() << "output " << k << ": " << a[k].DebugString(0) << " vs " << b[k].DebugString(0);
    }
    for (int64_t i = 0; i < a[k].num_elements(); ++i) {
      const double x = a[k].GetAsDouble(i), y = b[k].GetAsDouble(i);
      if (std::isnan(x) != std::isnan(y))
        return INVALID_ARGUMENT() << "output " << k << " element " << i << ": " << x << " vs " << y;
      if (!std::isnan(x)) worst = std::max(worst, std::fabs(x - y));
    }
  }
  return worst;
}

absl::StatusOr<double> MaxAbsDiffOnRandomFeeds(const ir::Graph& a, const ir::Graph& b, uint32_t seed) {
  ASSIGN_OR_RETURN(const std::vector<ir::Tensor> feeds, RandomFeeds(a, {}, seed));
  ASSIGN_OR_RETURN(const std::vector<ir::Tensor> x, Evaluate(a, feeds));
  ASSIGN_OR_RETURN(const std::vector<ir::Tensor> y, Evaluate(b, feeds));
  return MaxAbsDiff(x, y);
}

}  // namespace onnxpipe::passes::testing
