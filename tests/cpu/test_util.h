// Test helpers for the CPU kernels: node construction, evaluation, deterministic random inputs,
// numpy references (the Python of ONNXPIPE_PYTHON, fed through .npy files) and tolerant compares.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/cpu/cpu_evaluator.h"
#include "gtest/gtest.h"

namespace onnxpipe::cpu::testing {

// A node of `op` reading values 0..num_inputs-1 and writing the next num_outputs values.
ir::Node MakeNode(ir::OpKind op, int num_inputs, int num_outputs = 1, ir::Attrs attrs = {},
                  std::string name = "test_node");

absl::StatusOr<std::vector<ir::Tensor>> Eval(const ir::Node& node, const std::vector<ir::Tensor>& inputs,
                                             const EvalContext& ctx = {});
// Evaluates and returns output 0; fails the test (and returns an undefined tensor) on error.
ir::Tensor Eval1(const ir::Node& node, const std::vector<ir::Tensor>& inputs, const EvalContext& ctx = {});

// Uniform values in [lo, hi), deterministic in `seed`, stored as `dtype` (floats or integers).
ir::Tensor Rand(ir::DType dtype, std::vector<int64_t> dims, uint32_t seed, double lo = -2.0, double hi = 2.0);
ir::Tensor RandInt(ir::DType dtype, std::vector<int64_t> dims, uint32_t seed, int64_t lo, int64_t hi);
ir::Tensor I64(std::vector<int64_t> dims, std::vector<int64_t> values);
ir::Tensor I64Vec(std::vector<int64_t> values);

// Runs `code` in Python with numpy as `np`, the inputs in the dict `a` (by name) and collects
// the arrays the code stores in the dict `out`. Fails the test on any Python error.
std::map<std::string, ir::Tensor> Numpy(const std::map<std::string, ir::Tensor>& inputs, const std::string& code);

// Same dims and, elementwise, |got - want| <= atol + rtol * |want| (NaN matches NaN, infinities
// match themselves). Dtypes must match unless `check_dtype` is false.
::testing::AssertionResult AllClose(const ir::Tensor& got, const ir::Tensor& want, double rtol, double atol,
                                    bool check_dtype = true);
// Tolerances for comparing against a float64 reference: loose for f32, tight for f64.
double RelTol(ir::DType dt);

inline const std::vector<ir::DType>& FloatDTypes() {
  static const std::vector<ir::DType> v = {ir::DType::kF32, ir::DType::kF64};
  return v;
}
inline std::string NpName(ir::DType dt) {
  switch (dt) {
    case ir::DType::kF32: return "np.float32";
    case ir::DType::kF64: return "np.float64";
    case ir::DType::kI64: return "np.int64";
    case ir::DType::kI32: return "np.int32";
    case ir::DType::kBool: return "np.bool_";
    default: return "None";
  }
}

}  // namespace onnxpipe::cpu::testing
