#include "tests/cpu/test_util.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "executor/data/npy.h"

namespace onnxpipe::cpu::testing {

namespace fs = std::filesystem;

ir::Node MakeNode(ir::OpKind op, int num_inputs, int num_outputs, ir::Attrs attrs, std::string name) {
  ir::Node n;
  n.op = op;
  n.name = std::move(name);
  for (int i = 0; i < num_inputs; ++i) n.inputs.push_back(i);
  for (int i = 0; i < num_outputs; ++i) n.outputs.push_back(num_inputs + i);
  n.attrs = std::move(attrs);
  return n;
}

absl::StatusOr<std::vector<ir::Tensor>> Eval(const ir::Node& node, const std::vector<ir::Tensor>& inputs,
                                             const EvalContext& ctx) {
  CpuEvaluator ev(ctx);
  return ev.Evaluate(node, inputs);
}

ir::Tensor Eval1(const ir::Node& node, const std::vector<ir::Tensor>& inputs, const EvalContext& ctx) {
  auto r = Eval(node, inputs, ctx);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok() || r->empty()) return ir::Tensor();
  return (*r)[0];
}

ir::Tensor Rand(ir::DType dtype, std::vector<int64_t> dims, uint32_t seed, double lo, double hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  ir::Tensor t(ir::DType::kF64, std::move(dims));
  for (int64_t i = 0; i < t.num_elements(); ++i) t.mutable_data<double>()[i] = dist(gen);
  return t.CastTo(dtype);
}

ir::Tensor RandInt(ir::DType dtype, std::vector<int64_t> dims, uint32_t seed, int64_t lo, int64_t hi) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> dist(lo, hi);
  ir::Tensor t(ir::DType::kI64, std::move(dims));
  for (int64_t i = 0; i < t.num_elements(); ++i) t.mutable_data<int64_t>()[i] = dist(gen);
  return t.CastTo(dtype);
}

ir::Tensor I64(std::vector<int64_t> dims, std::vector<int64_t> values) {
  return ir::Tensor::FromVector<int64_t>(std::move(dims), values);
}
ir::Tensor I64Vec(std::vector<int64_t> values) {
  const int64_t n = static_cast<int64_t>(values.size());
  return ir::Tensor::FromVector<int64_t>({n}, values);
}

std::map<std::string, ir::Tensor> Numpy(const std::map<std::string, ir::Tensor>& inputs, const std::string& code) {
  std::map<std::string, ir::Tensor> result;
  std::string tmpl = (fs::temp_directory_path() / "onnxpipe_cpu_test_XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp failed";
    return result;
  }
  const fs::path dir = tmpl;
  for (const auto& [name, t] : inputs) {
    absl::Status st = data::WriteNpy((dir / ("in_" + name + ".npy")).string(), t);
    EXPECT_TRUE(st.ok()) << st;
  }
  {
    std::ofstream driver(dir / "driver.py");
    driver << "import os, sys\nimport numpy as np\nd = sys.argv[1]\n"
              "a = {f[3:-4]: np.load(os.path.join(d, f)) for f in os.listdir(d) if f.startswith('in_')}\n"
              "out = {}\n"
              "exec(open(os.path.join(d, 'code.py')).read())\n"
              "for k, v in out.items():\n"
              "    v = np.asarray(v)\n"
              "    np.save(os.path.join(d, 'out_' + k + '.npy'), v.copy(order='C'))\n";
    std::ofstream(dir / "code.py") << code;
  }
  const std::string cmd = std::string(ONNXPIPE_PYTHON) + " " + (dir / "driver.py").string() + " " + dir.string() +
                          " 2> " + (dir / "stderr.txt").string();
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    std::ifstream err(dir / "stderr.txt");
    std::string text((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
    ADD_FAILURE() << "numpy reference failed (rc " << rc << "):\n" << text << "\ncode:\n" << code;
  } else {
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string f = entry.path().filename().string();
      if (f.rfind("out_", 0) != 0) continue;
      auto t = data::ReadNpy(entry.path().string());
      EXPECT_TRUE(t.ok()) << t.status();
      if (t.ok()) result[f.substr(4, f.size() - 8)] = *t;
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return result;
}

::testing::AssertionResult AllClose(const ir::Tensor& got, const ir::Tensor& want, double rtol, double atol,
                                    bool check_dtype) {
  if (!got.defined() || !want.defined()) return ::testing::AssertionFailure() << "undefined tensor";
  if (got.dims() != want.dims()) {
    return ::testing::AssertionFailure() << "dims differ: got " << got.DebugString() << ", want "
                                         << want.DebugString();
  }
  if (check_dtype && got.dtype() != want.dtype()) {
    return ::testing::AssertionFailure() << "dtype differs: got " << ir::DTypeName(got.dtype()) << ", want "
                                         << ir::DTypeName(want.dtype());
  }
  int64_t bad = 0;
  std::ostringstream first;
  for (int64_t i = 0; i < got.num_elements(); ++i) {
    const double g = got.GetAsDouble(i), w = want.GetAsDouble(i);
    bool ok;
    if (std::isnan(w)) {
      ok = std::isnan(g);
    } else if (std::isinf(w)) {
      ok = g == w;
    } else {
      ok = std::fabs(g - w) <= atol + rtol * std::fabs(w);
    }
    if (!ok && bad++ < 5) first << "  [" << i << "] got " << g << ", want " << w << "\n";
  }
  if (bad) {
    return ::testing::AssertionFailure() << bad << " of " << got.num_elements() << " elements differ (rtol "
                                         << rtol << ", atol " << atol << "):\n" << first.str();
  }
  return ::testing::AssertionSuccess();
}

double RelTol(ir::DType dt) { return dt == ir::DType::kF32 ? 2e-5 : 1e-11; }

}  // namespace onnxpipe::cpu::testing
