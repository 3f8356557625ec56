// The gradient check of an imported ONNX model: Y's weighted-sum loss differentiated by autodiff
// against central finite differences of the forward graph.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "executor/data/npy.h"
#include "frontend/autodiff/autodiff.h"
#include "frontend/ir/infer.h"
#include "frontend/ir/precision.h"
#include "frontend/onnx/loader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/autodiff/test_graph.h"

namespace onnxpipe::autodiff::testing {

// tests/data/<folder>/<file> in the source tree.
inline std::string TestDataPath(const std::string& folder, const std::string& file) {
  return std::string(ONNXPIPE_SOURCE_DIR) + "/tests/data/" + folder + "/" + file;
}

// The .npy file at `path`; a test failure and an empty tensor when it cannot be read.
inline ir::Tensor ReadTestNpy(const std::string& path) {
  absl::StatusOr<ir::Tensor> t = data::ReadNpy(path);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : ir::Tensor();
}

// tests/data/<folder>/<name>.onnx run on `feeds` (its graph inputs in order): its first output has the dims of
// <name>.Y.npy and every element within atol + rtol * |expected| of it (0 and 0: equal).
inline void ExpectOutputMatchesReference(const std::string& folder, const std::string& name,
                                         std::vector<ir::Tensor> feeds, double atol = 0, double rtol = 0) {
  absl::StatusOr<onnx_frontend::LoadedModel> m = onnx_frontend::LoadOnnxModel(TestDataPath(folder, name + ".onnx"));
  ASSERT_TRUE(m.ok()) << name << ": " << m.status();
  ASSERT_TRUE(ir::InferShapes(*m->graph).ok()) << name;
  absl::StatusOr<std::vector<ir::Tensor>> out = Run(*m->graph, std::move(feeds));
  ASSERT_TRUE(out.ok()) << name << ": " << out.status();
  const ir::Tensor want = ReadTestNpy(TestDataPath(folder, name + ".Y.npy"));
  ASSERT_EQ((*out)[0].dims(), want.dims()) << name;
  ASSERT_EQ((*out)[0].dtype(), want.dtype()) << name;
  for (int64_t i = 0; i < want.num_elements(); ++i) {
    const double expected = want.GetAsDouble(i);
    ASSERT_LE(std::abs((*out)[0].GetAsDouble(i) - expected), atol + rtol * std::abs(expected))
        << name << " element " << i << ": " << (*out)[0].GetAsDouble(i) << " against " << expected;
  }
}

// Each (name, message) of `cases`: tests/data/<folder>/<name>.onnx fails to load, with an error naming `node` (as
// "'/emb/pad' (Pad)") and holding the message.
inline void ExpectLoadFailsNamingTheNode(const std::string& folder, const std::string& node,
                                         const std::vector<std::pair<std::string, std::string>>& cases) {
  for (const auto& [name, message] : cases) {
    absl::StatusOr<onnx_frontend::LoadedModel> m = onnx_frontend::LoadOnnxModel(TestDataPath(folder, name + ".onnx"));
    ASSERT_FALSE(m.ok()) << name;
    EXPECT_THAT(m.status().message(), ::testing::HasSubstr(node)) << name;
    EXPECT_THAT(m.status().message(), ::testing::HasSubstr(message)) << name;
  }
}

// The model at `path` with the inputs in `constants` bound as initializers (so that they are
// differentiated; an f32 model runs in f64): each parameter whose name `wanted` accepts has its
// gradient compared element by element with the finite difference, within `tol` relative to
// max(1, |numeric|). Returns the names compared (none after a failure).
inline std::vector<std::string> ExpectGradientsMatchFiniteDifferences(
    const std::string& path, std::map<std::string, ir::Tensor> constants, double tol,
    const std::function<bool(const std::string&)>& wanted) {
  onnx_frontend::LoadOptions options;
  options.constant_inputs = std::move(constants);
  absl::StatusOr<onnx_frontend::LoadedModel> m = onnx_frontend::LoadOnnxModel(path, options);
  if (!m.ok()) {
    ADD_FAILURE() << path << ": " << m.status();
    return {};
  }
  TestGraph t;
  t.g() = std::move(*m->graph);
  if (t.g().value(t.g().FindValue("X")).dtype == ir::DType::kF32 &&
      !ir::ConvertFloatPrecision(t.g(), ir::DType::kF32, ir::DType::kF64).ok()) {
    ADD_FAILURE() << path << ": no f64 graph";
    return {};
  }
  absl::StatusOr<ir::ValueId> loss = t.AddWeightedSumLoss({t.g().FindValue("Y")});
  if (!loss.ok()) {
    ADD_FAILURE() << path << ": " << loss.status();
    return {};
  }
  const ir::Graph forward = t.g();
  absl::StatusOr<TrainingGraphInfo> info = BuildGradients(&t.g(), *loss, {});
  absl::StatusOr<std::vector<ir::Tensor>> out =
      info.ok() ? Run(t.g()) : absl::StatusOr<std::vector<ir::Tensor>>(info.status());
  if (!out.ok()) {
    ADD_FAILURE() << path << ": " << out.status();
    return {};
  }
  std::vector<std::string> compared;
  for (size_t k = 0; k < info->param_grads.size(); ++k) {
    const ir::ValueId p = info->param_grads[k].param;
    const std::string& name = t.g().value(p).name;
    if (!wanted(name)) continue;
    compared.push_back(name);
    const ir::Tensor& analytic = (*out)[1 + k];
    absl::StatusOr<std::vector<double>> numeric = NumericGradient(forward, p, 1e-6);
    if (!numeric.ok() || analytic.num_elements() != static_cast<int64_t>(numeric->size())) {
      ADD_FAILURE() << path << ": no finite difference of " << name << " to compare";
      continue;
    }
    for (int64_t i = 0; i < analytic.num_elements(); ++i) {
      const double a = analytic.data<double>()[i], n = (*numeric)[i];
      EXPECT_LE(std::abs(a - n) / std::max(1.0, std::abs(n)), tol)
          << path << ": d loss / d " << name << "[" << i << "] analytic " << a << " numeric " << n;
    }
  }
  return compared;
}

}  // namespace onnxpipe::autodiff::testing
