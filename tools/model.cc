#include "tools/model.h"

#include <algorithm>
#include <set>

#include "executor/cpu/cpu_evaluator.h"
#include "frontend/ir/infer.h"
#include "frontend/ir/precision.h"
#include "frontend/ir/status.h"
#include "frontend/passes/pipeline.h"

namespace onnxpipe::tools {

DimRoles ClassifySymbols(const ir::Graph& g) {
  std::set<std::string> at0, at1, all;
  for (ir::ValueId v : g.inputs()) {
    const ir::Shape& s = g.value(v).shape;
    for (size_t i = 0; i < s.size(); ++i) {
      for (const std::string& sym : s[i].symbols()) {
        if (sym.empty() || sym[0] == '?') continue;
        all.insert(sym);
        if (i == 0) at0.insert(sym);
        if (i == 1) at1.insert(sym);
      }
    }
  }
  DimRoles roles;
  for (const std::string& s : all) {
    if (at0.count(s)) {
      roles.batch.push_back(s);
    } else if (at1.count(s)) {
      roles.seq.push_back(s);
    } else {
      roles.other.push_back(s);
    }
  }
  return roles;
}

std::map<std::string, int64_t> NonBatchBindings(const ir::Graph& g,
                                                const std::map<std::string, int64_t>& bindings) {
  const std::vector<std::string> batch = ClassifySymbols(g).batch;
  std::map<std::string, int64_t> out;
  for (const auto& [sym, size] : bindings) {
    if (std::find(batch.begin(), batch.end(), sym) == batch.end()) out[sym] = size;
  }
  return out;
}

std::map<std::string, int64_t> OpHistogram(const ir::Graph& g) {
  std::map<std::string, int64_t> h;
  for (ir::NodeId id : g.LiveNodes()) ++h[std::string(ir::OpName(g.node(id).op))];
  return h;
}

absl::StatusOr<Model> ImportModel(const std::string& path, bool allow_unsupported,
                                  std::map<std::string, ir::Tensor> constant_inputs) {
  onnx_frontend::LoadOptions load_options;
  load_options.allow_unsupported = allow_unsupported;
  load_options.constant_inputs = std::move(constant_inputs);
  ASSIGN_OR_RETURN(onnx_frontend::LoadedModel loaded,
                   onnx_frontend::LoadOnnxModel(path, load_options));
  Model model;
  model.summary = std::move(loaded.summary);
  model.warnings = std::move(loaded.warnings);
  if (!loaded.graph) return model;  // unsupported ops: summary only
  RETURN_IF_ERROR(Annotate(ir::InferShapes(*loaded.graph), path));
  model.imported = std::move(*loaded.graph);
  return model;
}

absl::StatusOr<Model> LoadModel(const std::string& path, const ModelOptions& options) {
  ASSIGN_OR_RETURN(Model model, ImportModel(path, options.allow_unsupported));
  RETURN_IF_ERROR(PrepareModel(model, options));
  return model;
}

absl::Status PrepareModel(Model& model, const ModelOptions& options) {
  if (!model.imported) return absl::OkStatus();
  ir::Graph g = *model.imported;
  const std::string& path = g.source_path;
  const DimRoles roles = ClassifySymbols(g);
  std::map<std::string, int64_t> bindings = options.extra_dims;
  auto bind_role = [&](const std::vector<std::string>& syms, int64_t value, const char* flag,
                       int input_axis) -> absl::Status {
    if (value <= 0) return absl::OkStatus();
    if (value > (int64_t{1} << 31))
      return INVALID_ARGUMENT() << "--" << flag << " " << value << " is absurdly large";
    if (syms.empty()) {
      // Fixed-size export: the flag must agree with what the file bakes in.
      for (ir::ValueId v : g.inputs()) {
        const ir::Shape& s = g.value(v).shape;
        if (static_cast<int>(s.size()) > input_axis && s[input_axis].is_concrete() &&
            s[input_axis].value() != value) {
          return INVALID_ARGUMENT()
                 << path << ": --" << flag << " " << value << " but input '" << g.value(v).name
                 << "' has a fixed dim " << input_axis << " of " << s[input_axis].value()
                 << "; re-export the model with dynamic axes";
        }
      }
      return absl::OkStatus();
    }
    for (const std::string& s : syms) bindings[s] = value;
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(bind_role(roles.batch, options.batch, "batch", 0));
  RETURN_IF_ERROR(bind_role(roles.seq, options.seq, "seq", 1));
  if (!bindings.empty()) {
    RETURN_IF_ERROR(Annotate(ir::BindSymbols(g, bindings), path));
    RETURN_IF_ERROR(Annotate(ir::InferShapes(g), path));
  }
  model.bindings = bindings;
  if (options.compute == ir::DType::kF64) {
    RETURN_IF_ERROR(Annotate(ir::ConvertComputePrecision(g, ir::DType::kF32, ir::DType::kF64), path));
  }
  if (options.fuse) {
    cpu::CpuEvaluator evaluator;
    passes::PipelineOptions popts;
    RETURN_IF_ERROR(Annotate(passes::RunForwardPipeline(&g, evaluator, popts), path));
  }
  model.graph = std::move(g);
  return absl::OkStatus();
}

}  // namespace onnxpipe::tools
