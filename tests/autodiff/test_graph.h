// Helpers for the autodiff tests: a small graph builder with random fp64 parameters, evaluation
// with the CPU backend (training mode, fixed dropout seed) and central finite differences.
#pragma once

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/cpu/cpu_evaluator.h"
#include "executor/runtime/interpreter.h"
#include "frontend/ir/graph.h"
#include "frontend/ir/infer.h"

namespace onnxpipe::autodiff::testing {

inline ir::Attrs MakeAttrs(std::initializer_list<std::pair<std::string, ir::AttrValue>> kv) {
  ir::Attrs a;
  for (const auto& [k, v] : kv) a.Set(k, v);
  return a;
}

class TestGraph {
 public:
  explicit TestGraph(uint64_t seed = 42) : rng_(seed) {}
  ir::Graph& g() { return g_; }

  // f64 initializer (a trainable parameter) with values uniform in [lo, hi].
  ir::ValueId Param(const std::string& name, std::vector<int64_t> dims, double lo = -1, double hi = 1) {
    return g_.AddConstant(name, Random(dims, lo, hi, false), /*is_initializer=*/true);
  }
  // Parameter with magnitudes in [lo, hi] and random signs (away from zero: Relu, Div, ...).
  ir::ValueId ParamAway(const std::string& name, std::vector<int64_t> dims, double lo, double hi) {
    return g_.AddConstant(name, Random(dims, lo, hi, true), /*is_initializer=*/true);
  }
  // f64 constant that is not an initializer (no gradient).
  ir::ValueId ConstF(const std::string& name, std::vector<int64_t> dims, double lo = -1, double hi = 1) {
    return g_.AddConstant(name, Random(dims, lo, hi, false));
  }
  ir::ValueId ConstI(const std::string& name, std::vector<int64_t> dims, std::vector<int64_t> v) {
    return g_.AddConstant(name, ir::Tensor::FromVector<int64_t>(std::move(dims), v));
  }
  ir::ValueId ConstB(const std::string& name, std::vector<int64_t> dims, std::vector<bool> v) {
    return g_.AddConstant(name, ir::Tensor::FromVector<bool>(std::move(dims), v));
  }
  std::vector<ir::ValueId> Op(ir::OpKind op, std::vector<ir::ValueId> inputs, int num_outputs = 1,
                              ir::Attrs attrs = {}) {
    std::vector<ir::ValueId> outs;
    const std::string name = "/n" + std::to_string(counter_++) + "/" + std::string(ir::OpName(op));
    for (int i = 0; i < num_outputs; ++i) {
      outs.push_back(g_.AddValue(name + ":" + std::to_string(i), ir::DType::kF64, {}, /*shape_known=*/false));
    }
    g_.AddNode(op, name, std::move(inputs), outs, std::move(attrs));
    return outs;
  }
  ir::ValueId Op1(ir::OpKind op, std::vector<ir::ValueId> inputs, ir::Attrs attrs = {}) {
    return Op(op, std::move(inputs), 1, std::move(attrs))[0];
  }
  ir::Tensor Random(const std::vector<int64_t>& dims, double lo, double hi, bool random_sign) {
    ir::Tensor t(ir::DType::kF64, dims);
    std::uniform_real_distribution<double> u(lo, hi);
    std::bernoulli_distribution coin(0.5);
    double* p = t.mutable_data<double>();
    for (int64_t i = 0; i < t.num_elements(); ++i) p[i] = u(rng_) * (random_sign && coin(rng_) ? -1 : 1);
    return t;
  }

  // Appends loss = sum_k sum(y_k * w_k) with fixed random w_k (shape inference runs first) and
  // makes it the only graph output.
  absl::StatusOr<ir::ValueId> AddWeightedSumLoss(const std::vector<ir::ValueId>& ys) {
    absl::Status st = ir::InferShapes(g_);
    if (!st.ok()) return st;
    std::vector<ir::ValueId> parts;
    for (ir::ValueId y : ys) {
      const ir::Value& v = g_.value(y);
      if (!ir::IsConcrete(v.shape)) return absl::InternalError("non-concrete shape in a test graph");
      ir::ValueId w = ConstF("w/" + v.name, ir::ToInts(v.shape), -1, 1);
      ir::ValueId t = Op1(ir::OpKind::kMul, {y, w});
      parts.push_back(Op1(ir::OpKind::kReduceSum, {t}, MakeAttrs({{"keepdims", int64_t{0}}})));
    }
    ir::ValueId loss = parts.size() == 1 ? parts[0] : Op1(ir::OpKind::kSum, parts);
    st = ir::InferShapes(g_);
    if (!st.ok()) return st;
    g_.outputs() = {loss};
    return loss;
  }

 private:
  ir::Graph g_;
  std::mt19937_64 rng_;
  int counter_ = 0;
};

inline cpu::EvalContext TrainingContext() {
  cpu::EvalContext ctx;
  ctx.training = true;
  ctx.seed = 1234;
  ctx.offset = 7;
  return ctx;
}

// Evaluates every graph output (the graph has no inputs unless `inputs` are given).
inline absl::StatusOr<std::vector<ir::Tensor>> Run(const ir::Graph& g, std::vector<ir::Tensor> inputs = {}) {
  cpu::CpuEvaluator ev(TrainingContext());
  return runtime::Interpret(g, ev, inputs);
}

// Central finite differences of output 0 (a scalar) of `fwd` with respect to constant `param`.
inline absl::StatusOr<std::vector<double>> NumericGradient(ir::Graph fwd, ir::ValueId param, double eps,
                                                           const std::vector<ir::Tensor>& inputs = {}) {
  const ir::Tensor base = fwd.value(param).constant->CastTo(ir::DType::kF64);
  std::vector<double> out(base.num_elements());
  for (int64_t i = 0; i < base.num_elements(); ++i) {
    double f[2];
    for (int s = 0; s < 2; ++s) {
      ir::Tensor t = base.Clone();
      t.mutable_data<double>()[i] += s == 0 ? eps : -eps;
      fwd.value(param).constant = t.CastTo(fwd.value(param).dtype);
      auto r = Run(fwd, inputs);
      if (!r.ok()) return r.status();
      f[s] = (*r)[0].CastTo(ir::DType::kF64).data<double>()[0];
    }
    out[i] = (f[0] - f[1]) / (2 * eps);
  }
  return out;
}

}  // namespace onnxpipe::autodiff::testing
