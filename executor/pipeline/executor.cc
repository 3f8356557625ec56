// The driver. It interprets the compiled plan: every node, transfer, accumulation and action comes
// from the stage programs and action lists the partitioner built, run by one StageExecutor per stage
// (stage_executor.h). A step cuts the batch into this replica's micro-batches and runs each local
// stage executor on a thread of its own; the stage threads share nothing but the read-only step
// inputs and the comm group, so the only synchronisation is the comm's.
#include "executor/pipeline/executor.h"

#include <array>
#include <chrono>
#include <cmath>
#include <exception>
#include <thread>
#include <utility>

#include "executor/comm/inprocess_comm.h"
#include "executor/pipeline/stage_executor.h"
#include "frontend/ir/status.h"

namespace onnxpipe::pipeline {

const char* StepPhaseName(StepPhase p) { return std::array{"forward", "backward", "optimizer"}[static_cast<int>(p)]; }

const StageLayout& PipelineExecutor::layout(int32_t stage) const { return stages_[stage]->layout(); }

PipelineExecutor::~PipelineExecutor() = default;

absl::StatusOr<PipelineStepResult> PipelineExecutor::Step(const StepFeeds& feeds) {
  if (broken_) return FAILED_PRECONDITION() << "a previous step failed; the pipeline's parameters are inconsistent";
  const int32_t K = program_.num_stages, M = microbatches_;
  const int32_t D = options_.topology.replicas, first = options_.topology.replica() * M;  // this replica's
  const int64_t b = facts_.microbatch_size;
  // The stages here share value ids (one training graph, or one stage's program): slices are keyed by them.
  const ir::Graph* local = nullptr;
  for (int32_t s = 0; s < K && local == nullptr; ++s)
    if (is_local(s)) local = &program_.stages[s].graph;
  RET_CHECK(local != nullptr);

  StageStepInputs inputs;
  inputs.step = feeds.step;
  inputs.lr = feeds.lr;
  inputs.first_microbatch = first;
  inputs.rows = b;
  inputs.steps_done = steps_done_;
  // Micro-batch slices of every data input: the global batch's D x M, of which this replica runs
  // [first, first + M).
  inputs.slices.resize(M);
  std::map<std::string, std::vector<ir::Tensor>> by_name;
  for (const std::string& name : data_inputs_) {
    auto it = feeds.batch.find(name);
    if (it == feeds.batch.end())
      return INVALID_ARGUMENT() << "step " << feeds.step << ": no data for input '" << name << "'";
    const ir::Tensor& t = it->second;
    const ir::ValueId v = local->FindValue(name);  // none for labels that only the loss shares read
    if (t.rank() < 1 || t.dims()[0] != b * M * D) {
      return INVALID_ARGUMENT() << "step " << feeds.step << ": input '" << name << "' has "
                                << (t.rank() < 1 ? 0 : t.dims()[0]) << " rows; " << M * D << " micro-batches of " << b
                                << " need " << b * M * D;
    }
    if (v != ir::kNoValue && t.dtype() != local->value(v).dtype) {
      return INVALID_ARGUMENT() << "step " << feeds.step << ": input '" << name << "' is " << ir::DTypeName(t.dtype())
                                << ", the model expects " << ir::DTypeName(local->value(v).dtype);
    }
    if (name == facts_.loss_rule.labels_input) {
      for (int32_t m = 0; m < M * D; ++m) {
        ASSIGN_OR_RETURN(ir::Tensor s, SliceRows(t, m * b, (m + 1) * b));
        by_name[name].push_back(s);
      }
    }
    for (int32_t m = 0; m < M && v != ir::kNoValue; ++m) {
      ASSIGN_OR_RETURN(inputs.slices[m][v], SliceRows(t, (first + m) * b, (first + m + 1) * b));
    }
  }
  // The shares of the global batch's micro-batches; this replica's are [first, first + M). Only the loss stage's
  // process feeds the labels and needs them.
  std::vector<double> shares(M, 1.0 / D);
  if (by_name.count(facts_.loss_rule.labels_input) != 0) {
    absl::StatusOr<std::vector<double>> s = LossShares(facts_.loss_rule, by_name.at(facts_.loss_rule.labels_input));
    if (!s.ok()) return Annotate(s.status(), "step " + std::to_string(feeds.step));
    shares.assign(s->begin() + first, s->begin() + first + M);
  }
  for (double s : shares)
    inputs.scales.push_back(
        ir::Tensor::Scalar<double>(s).CastTo(facts_.seed_like.dtype()).Reshaped(facts_.seed_like.dims()));

  for (const std::unique_ptr<StageExecutor>& stage : stages_)
    if (stage != nullptr) RETURN_IF_ERROR(stage->PrepareStep());
  // The stages' comms: this replica's view of the world, or a group of threads made for the step.
  std::shared_ptr<comm::InProcessGroup> group;
  if (options_.world == nullptr) {
    group = comm::InProcessGroup::Create(K, options_.recv_timeout_s, backend_, staging_);
    if (options_.nccl_semantics) group->UseNcclSemantics();
  }
  std::vector<std::unique_ptr<comm::Comm>> comms(K);
  for (int32_t s = 0; s < K; ++s)
    if (is_local(s) && group) comms[s] = group->Endpoint(s);
  inputs.t0 = std::chrono::steady_clock::now();
  std::vector<StageStepResult> results(K);
  std::vector<absl::Status> status(K);
  std::vector<std::thread> threads;
  for (int32_t s = 0; s < K; ++s) {
    if (!is_local(s)) continue;
    threads.emplace_back([&, s] {
      comm::Comm& c = group ? *comms[s] : *pipeline_comm_;
      try {
        absl::StatusOr<StageStepResult> run = stages_[s]->Run(lists_[s], inputs, c);
        status[s] = run.status();
        if (run.ok()) {
          results[s] = *std::move(run);
          // The step ends when the stage's device work has: its parameters and timings are final.
          backend::Stream* stream = stages_[s]->stream();
          if (stream != nullptr) status[s] = stream->Synchronize();
        }
      } catch (const std::exception& e) {
        status[s] = absl::InternalError("stage " + std::to_string(s) + ": exception: " + e.what());
      } catch (...) {
        status[s] = absl::InternalError("stage " + std::to_string(s) + ": unknown exception");
      }
      if (!status[s].ok() && !comm::IsAbortedByPeer(status[s])) c.Abort(status[s]);
    });
  }
  for (std::thread& t : threads) t.join();
  PipelineStepResult r;
  double loss_part = 0, norm_part = 0;
  const absl::Status root = group ? group->abort_status() : options_.world->abort_status();
  if (root.ok()) {
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - inputs.t0).count();
    r.shares = shares;
    r.stages.resize(K);
    for (int32_t s = 0; s < K; ++s) {
      if (!is_local(s)) continue;
      r.stages[s] = results[s].measure;
      r.trace.insert(r.trace.end(), results[s].trace.begin(), results[s].trace.end());
    }
    if (is_local(program_.loss_stage)) {
      r.microbatch_losses = results[program_.loss_stage].losses;
      for (int32_t m = 0; m < M; ++m) loss_part += shares[m] * r.microbatch_losses[m];
    }
    const int32_t ns = program_.grad_norm_stage;
    if (ns >= 0 && is_local(ns) && options_.topology.replica() == 0) norm_part = results[ns].grad_norm;
    r.loss = loss_part;
    r.grad_norm = ns >= 0 ? norm_part : std::nan("");
  }
  const absl::Status shared = root.ok() && options_.world ? ShareResult(r, loss_part, norm_part) : root;
  if (!shared.ok()) {
    broken_ = true;
    return absl::Status(shared.code(), "step " + std::to_string(feeds.step) + ": " + std::string(shared.message()));
  }
  ++steps_done_;
  if (!std::isfinite(r.loss)) {
    broken_ = true;
    return FAILED_PRECONDITION() << "step " << feeds.step << ": the loss is " << r.loss
                                 << "; rerun with --check-numerics to name the stage, micro-batch and node that "
                                    "first produce a non-finite value";
  }
  return r;
}

absl::Status PipelineExecutor::ShareResult(PipelineStepResult& r, double loss_part, double norm_part) {
  // Every rank adds what it holds (0 elsewhere): the loss stage of each replica its replica's share-weighted
  // losses (replica order), replica 0's norm stage the norm (the replicas' norms are the same after the all-reduce).
  ir::Tensor parts = ir::Tensor::FromVector<double>({2}, {loss_part, norm_part});
  std::vector<int> everyone(options_.world->size());
  for (size_t i = 0; i < everyone.size(); ++i) everyone[i] = static_cast<int>(i);
  RETURN_IF_ERROR(Annotate(options_.world->AllReduce(parts, everyone, nullptr), "sharing the step's loss"));
  r.loss = parts.data<double>()[0];
  if (program_.grad_norm_stage >= 0) r.grad_norm = parts.data<double>()[1];
  return absl::OkStatus();
}

}  // namespace onnxpipe::pipeline
