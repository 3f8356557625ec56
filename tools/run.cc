// onnxpipe run: evaluates the forward pass of a model on the CPU backend.
#include <cstdio>
#include <filesystem>
#include <map>

#include "executor/backend/backend_evaluator.h"
#include "executor/cpu/cpu_evaluator.h"
#include "executor/data/npy.h"
#include "executor/runtime/interpreter.h"
#include "frontend/ir/status.h"
#include "frontend/passes/mixed_precision.h"
#include "tools/backend_flag.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "tools/model.h"

namespace onnxpipe::tools {
namespace {

namespace fs = std::filesystem;

// Reads one feed per graph input, named: `input_<i>.pb` (ONNX backend-test layout, graph-input
// order) when input_0.pb exists, else `<input name>.npy`.
absl::StatusOr<std::map<std::string, ir::Tensor>> ReadFeeds(const std::vector<std::string>& names,
                                                            const fs::path& dir) {
  if (!fs::is_directory(dir)) return NOT_FOUND() << "--inputs " << dir.string() << " is not a directory";
  std::map<std::string, ir::Tensor> feeds;
  const bool pb_layout = fs::exists(dir / "input_0.pb");
  for (size_t i = 0; i < names.size(); ++i) {
    absl::StatusOr<ir::Tensor> t;
    if (pb_layout) {
      fs::path p = dir / ("input_" + std::to_string(i) + ".pb");
      if (!fs::exists(p))
        return NOT_FOUND() << p.string() << " is missing (graph input " << i << " '" << names[i] << "')";
      t = onnx_frontend::LoadTensorProtoFile(p.string());
    } else {
      fs::path p = dir / (names[i] + ".npy");
      if (!fs::exists(p))
        return NOT_FOUND() << p.string() << " is missing: --inputs needs input_<i>.pb files or one "
                           << "<input name>.npy per graph input";
      t = data::ReadNpy(p.string());
    }
    if (!t.ok()) return t.status();
    feeds[names[i]] = std::move(*t);
  }
  return feeds;
}

// Operand-like feeds (integer vectors and float scalars: Reduce axes, Split sizes, a Dropout
// ratio fed at run time) become constants for this one evaluation, so that the importer, which
// needs such operands at compile time, accepts the model. Results are unchanged.
std::map<std::string, ir::Tensor> OperandFeeds(const std::map<std::string, ir::Tensor>& feeds) {
  std::map<std::string, ir::Tensor> out;
  for (const auto& [name, t] : feeds) {
    const bool int_vector = (ir::IsInteger(t.dtype()) && t.rank() <= 1 && t.num_elements() <= 64);
    const bool float_scalar = ir::IsFloat(t.dtype()) && t.rank() == 0;
    if (int_vector || float_scalar) out[name] = t;
  }
  return out;
}

std::string FileNameFor(const std::string& value_name) {
  std::string out = value_name;
  for (char& c : out)
    if (c == '/' || c == '\\' || c == ':') c = '_';
  return out;
}

}  // namespace

int RunRun(const Args& args) {
  std::string inputs_dir, out_dir, backend = "cpu", dtype = "fp32", cuda_attention = "auto", gemm_tactics;
  bool check_numerics = false;
  int64_t device = 0;
  FlagSet flags("run", "MODEL.onnx --inputs DIR --out DIR [--backend cpu|cuda|checked] [--dtype fp32|fp64|bf16]",
                "Evaluates the forward pass (inference: Dropout is identity). DIR holds input_<i>.pb\n"
                "TensorProto files in graph-input order (the ONNX backend-test layout) or one\n"
                "<input name>.npy per graph input; writes <output name>.npy into --out.");
  flags.String("inputs", &inputs_dir, "folder with the input tensors");
  flags.String("out", &out_dir, "folder for the outputs (created)");
  flags.String("backend", &backend, "cpu | cuda | checked: where the nodes run (cuda and checked: node by node "
               "through the backend, every value copied in and out; a conformance path, not a fast one)");
  flags.Int("device", &device, "the GPU --backend cuda runs on");
  DeclareCudaAttentionFlag(flags, &cuda_attention);
  DeclareGemmTacticsFlag(flags, &gemm_tactics);
  flags.String("dtype", &dtype, "fp32 | fp64 | bf16: float precision to compute in (bf16: the mixed precision of "
               "`train --dtype bf16`, bf16 activations and f32 weights cast per use; float outputs come out f32)");
  flags.Bool("check-numerics", &check_numerics, "stop at the first node producing NaN/Inf");
  if (absl::Status st = flags.Parse(args); !st.ok()) return Fail("run", std::string(st.message()), 2);
  if (flags.help_requested()) {
    std::printf("%s", flags.Usage().c_str());
    return 0;
  }
  if (flags.positional().size() != 1) return Fail("run", "expected exactly one MODEL.onnx (see --help)", 2);
  if (inputs_dir.empty() || out_dir.empty()) return Fail("run", "--inputs and --out are required", 2);
  if (backend != "cpu" && backend != "cuda" && backend != "checked") {
    return Fail("run", "--backend expects cpu, cuda or checked, got '" + backend + "'", 2);
  }
  absl::StatusOr<std::shared_ptr<const backend::Backend>> be =
      BackendFromFlags(backend, device, {.cuda_attention = cuda_attention, .gemm_tactics = gemm_tactics});
  if (!be.ok()) return Fail("run", std::string(be.status().message()));
  if (dtype != "fp32" && dtype != "fp64" && dtype != "bf16") {
    return Fail("run", "--dtype expects fp32, fp64 or bf16, got '" + dtype + "'", 2);
  }

  const std::string path = flags.positional()[0];
  absl::StatusOr<std::vector<std::string>> names = onnx_frontend::ReadGraphInputNames(path);
  if (!names.ok()) return Fail("run", std::string(names.status().message()));
  absl::StatusOr<std::map<std::string, ir::Tensor>> named = ReadFeeds(*names, inputs_dir);
  if (!named.ok()) return Fail("run", std::string(named.status().message()));
  absl::StatusOr<Model> model = ImportModel(path, /*allow_unsupported=*/false);
  if (!model.ok()) {
    // Retry with operand-like feeds as constants (see OperandFeeds).
    absl::StatusOr<Model> specialised = ImportModel(path, false, OperandFeeds(*named));
    if (!specialised.ok()) return Fail("run", std::string(model.status().message()));
    model = std::move(specialised);
  }
  absl::StatusOr<std::vector<ir::Tensor>> feeds = std::vector<ir::Tensor>();
  for (ir::ValueId v : model->imported->inputs()) feeds->push_back(named->at(model->imported->value(v).name));

  // Bind the symbolic dims to the feeds' sizes, then fold and fuse for those shapes.
  ModelOptions options;
  if (dtype == "fp64") options.compute = ir::DType::kF64;  // f64 before folding
  for (size_t i = 0; i < feeds->size(); ++i) {
    absl::Status st = runtime::CheckInput(*model->imported, model->imported->inputs()[i], (*feeds)[i],
                                          &options.extra_dims);
    if (!st.ok()) return Fail("run", std::string(st.message()));
  }
  if (absl::Status st = PrepareModel(*model, options); !st.ok()) return Fail("run", std::string(st.message()));
  ir::Graph& g = *model->graph;
  if (dtype == "fp64") {
    for (ir::Tensor& t : *feeds)
      if (t.dtype() == ir::DType::kF32) t = t.CastTo(ir::DType::kF64);
  } else if (dtype == "bf16") {
    absl::Status st = passes::MixedPrecision({.compute = ir::DType::kBF16, .freeze_regex = ""}).Run(&g).status();
    if (!st.ok()) return Fail("run", std::string(st.message()));
  }
  cpu::CpuEvaluator cpu_evaluator;
  backend::BackendEvaluator backend_evaluator(*be);
  const ir::OpEvaluator& evaluator =
      backend == "cpu" ? static_cast<const ir::OpEvaluator&>(cpu_evaluator) : backend_evaluator;
  runtime::InterpreterOptions iopts;
  iopts.check_numerics = check_numerics;
  absl::StatusOr<std::vector<ir::Tensor>> outputs = runtime::Interpret(g, evaluator, *feeds, iopts);
  if (!outputs.ok()) return Fail("run", std::string(outputs.status().message()));

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return Fail("run", "cannot create --out " + out_dir + ": " + ec.message());
  for (size_t i = 0; i < outputs->size(); ++i) {
    const std::string name = g.value(g.outputs()[i]).name;
    const fs::path p = fs::path(out_dir) / (FileNameFor(name) + ".npy");
    if (absl::Status st = data::WriteNpy(p.string(), (*outputs)[i]); !st.ok())
      return Fail("run", std::string(st.message()));
    std::printf("%s -> %s\n", name.c_str(), p.string().c_str());
  }
  return 0;
}

}  // namespace onnxpipe::tools
