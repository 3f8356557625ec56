// Small synthetic training graphs for partitioner tests: an MLP chain
//   x (B, w0) -> [Linear(w_i -> w_{i+1}) -> Relu] x L -> Linear(-> C) -> cross-entropy
// (or MLP blocks, see ChainSpec::expand)
// built with the project's autodiff and optimizer passes, plus fake devices and measured times.
#pragma once

#include <map>
#include <random>
#include <string>
#include <vector>

#include "frontend/autodiff/autodiff.h"
#include "frontend/autodiff/loss.h"
#include "frontend/autodiff/optimizer.h"
#include "frontend/ir/graph.h"
#include "frontend/ir/infer.h"
#include "frontend/passes/mixed_precision.h"
#include "partitioner/cost_model.h"
#include "partitioner/device.h"

namespace onnxpipe::partitioner::testing {

struct ChainSpec {
  int64_t batch = 4;
  std::vector<int64_t> widths = {16, 16, 16, 16, 16};  // w0 .. wL: L = widths.size() - 1 layers
  int64_t classes = 4;
  // 0: layer i is Linear(w_i -> w_{i+1}) -> Relu. e > 0: an MLP block Linear(w_i -> e w_i) -> Relu
  // -> Linear(e w_i -> w_{i+1}), so cuts fall between blocks and each Relu is inside one.
  int64_t expand = 0;
  ir::OpKind activation = ir::OpKind::kRelu;  // or kGelu (its gradient reads the input)
  autodiff::OptimizerKind optimizer = autodiff::OptimizerKind::kSGD;
  double momentum = 0;
  // The head reads layer 0's weight (a tied parameter, as a GPT's embedding and output projection):
  // needs widths.back() == widths[0] and classes == widths[1] (expand 0).
  bool tie_head = false;
  // kBF16: the forward graph goes through passes::MixedPrecision before the loss, as the trainer's.
  ir::DType dtype = ir::DType::kF32;
};

// Returns the training graph (forward + loss + backward + optimizer), or dies on a test bug.
inline ir::Graph BuildChain(const ChainSpec& spec) {
  ir::Graph g;
  g.name = "chain";
  const int64_t B = spec.batch;
  ir::ValueId h = g.AddValue("x", ir::DType::kF32, ir::FromInts({B, spec.widths[0]}));
  g.inputs().push_back(h);
  auto linear = [&](const std::string& scope, ir::ValueId in, int64_t k, int64_t n) {
    ir::ValueId w = g.FindValue("layers.0.weight");
    if (!spec.tie_head || scope != "head") {
      w = g.AddConstant(scope + ".weight", ir::Tensor(ir::DType::kF32, {k, n}), true);
    }
    const ir::ValueId b = g.AddConstant(scope + ".bias", ir::Tensor(ir::DType::kF32, {n}), true);
    const ir::ValueId out = g.AddValue(scope + "/linear_out", ir::DType::kF32, ir::FromInts({B, n}));
    const ir::NodeId id = g.AddNode(ir::OpKind::kLinear, "/" + scope + "/Linear", {in, w, b}, {out});
    g.node(id).scope = "/" + scope;
    return out;
  };
  for (size_t i = 0; i + 1 < spec.widths.size(); ++i) {
    const std::string scope = "layers." + std::to_string(i);
    const int64_t hidden = spec.expand > 0 ? spec.expand * spec.widths[i] : spec.widths[i + 1];
    const ir::ValueId y = linear(scope, h, spec.widths[i], hidden);
    const ir::ValueId r = g.AddValue(scope + "/act_out", ir::DType::kF32, ir::FromInts({B, hidden}));
    const std::string act(ir::OpName(spec.activation));
    const ir::NodeId id = g.AddNode(spec.activation, "/" + scope + "/" + act, {y}, {r});
    g.node(id).scope = "/" + scope;
    h = spec.expand > 0 ? linear(scope + ".out", r, hidden, spec.widths[i + 1]) : r;
    if (spec.expand > 0) g.node(g.value(h).producer).scope = "/" + scope;
  }
  const ir::ValueId logits = linear("head", h, spec.widths.back(), spec.classes);
  g.RenameValue(logits, "logits");
  g.outputs().push_back(logits);
  absl::Status st = ir::InferShapes(g);
  if (!st.ok()) std::abort();
  if (spec.dtype == ir::DType::kBF16) {
    st = passes::MixedPrecision({.compute = spec.dtype, .freeze_regex = ""}).Run(&g).status();
    if (!st.ok()) std::abort();
  }
  // The loss reads the logits as the graph computes them (bf16 under mixed precision, as
  // autodiff::BuildTrainingGraph has it): the f32 copy MixedPrecision made of the output is dropped.
  std::string loss_logits = "logits";
  if (spec.dtype == ir::DType::kBF16) {
    const ir::ValueId f32 = g.FindValue("logits");
    const ir::NodeId cast = g.value(f32).producer;
    loss_logits = g.value(g.node(cast).inputs[0]).name;
    g.outputs().clear();
    g.RemoveNode(cast);
  }
  absl::StatusOr<autodiff::LossInfo> loss = autodiff::AddCrossEntropyLoss(&g, loss_logits, "labels", {});
  if (!loss.ok()) std::abort();
  absl::StatusOr<autodiff::TrainingGraphInfo> grads = autodiff::BuildGradients(&g, loss->loss, {});
  if (!grads.ok()) std::abort();
  autodiff::OptimizerOptions oo;
  oo.kind = spec.optimizer;
  oo.momentum = spec.momentum;
  absl::StatusOr<autodiff::OptimizerGraphInfo> opt = autodiff::AddOptimizer(&g, grads->param_grads, oo);
  if (!opt.ok()) std::abort();
  g.outputs() = {loss->loss, opt->grad_norm};
  return g;
}

// A device with round numbers: 1 TFLOP/s everywhere, 100 GB/s memory, 10 GB/s links.
inline DeviceProfile FakeDevice(int64_t memory_bytes) {
  DeviceProfile d;
  d.name = "fake";
  d.source = "test";
  d.memory_bytes = memory_bytes;
  d.reserved_bytes = 0;
  d.gemm_flops_fp32 = d.gemm_flops_bf16 = d.vector_flops = 1e12;
  d.memory_bandwidth = 1e11;
  d.link_bandwidth = 1e10;
  d.link_latency_s = 1e-6;
  d.op_overhead_s = 0;
  d.compute_efficiency = d.memory_efficiency = 1.0;
  return d;
}

// Random measured times for every node: forward U(lo, hi) ms, backward `backward_ratio` times the
// forward time of its origin when given (proportional costs), else random too.
inline OpTimes RandomTimes(const ir::Graph& g, int64_t microbatch, uint64_t seed, double backward_ratio = 0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.1, 3.0);
  OpTimes t;
  t.microbatch = microbatch;
  // With a ratio, each forward node's backward nodes share ratio x its time (accumulation Sums,
  // which may sit elsewhere, cost nothing), so every stage's backward is ratio x its forward.
  std::map<std::string, double> forward_ms;
  std::map<std::string, int> backward_count;
  for (ir::NodeId id : g.LiveNodes()) {
    const ir::Node& n = g.node(id);
    if (n.phase == ir::Phase::kBackward && n.op != ir::OpKind::kSum) ++backward_count[n.origin];
  }
  for (ir::NodeId id : g.LiveNodes()) {
    const ir::Node& n = g.node(id);
    double ms = u(rng);
    if (n.phase == ir::Phase::kForward) forward_ms[n.name] = ms;
    if (n.phase == ir::Phase::kBackward && backward_ratio > 0) {
      auto it = forward_ms.find(n.origin);
      ms = it != forward_ms.end() && n.op != ir::OpKind::kSum
               ? backward_ratio * it->second / backward_count[n.origin] : 0.0;
    }
    if (n.phase == ir::Phase::kOptimizer) ms = backward_ratio > 0 ? 0.0 : 0.01;
    t.ops.push_back({n.name, std::string(ir::OpName(n.op)), "", ms});
  }
  return t;
}

}  // namespace onnxpipe::partitioner::testing
