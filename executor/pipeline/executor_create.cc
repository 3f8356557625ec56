// Building the pipeline executor: a StageExecutor for each stage of the compiled plan this process runs (all of
// them, or with a world comm its own stage of its replica; each plans and allocates its layout, arena and stream),
// their constants on the backend, the data inputs and, with graphs, the stages' graph buffers. The step driver is
// executor.cc.
#include <algorithm>
#include <set>

#include "executor/comm/inprocess_comm.h"
#include "executor/comm/subgroup_comm.h"
#include "executor/pipeline/executor.h"
#include "executor/pipeline/stage_executor.h"
#include "frontend/ir/status.h"

namespace onnxpipe::pipeline {

// The world ranks of every group an all-reduce of the run names (comm::Comm::PrepareGroups), the same list on every
// rank: each stage's data-parallel replicas, then per replica each shared parameter's holders.
std::vector<std::vector<int>> PipelineExecutor::AllReduceGroups(const Topology& topo) const {
  std::vector<std::vector<int>> groups;
  auto add = [&](std::vector<int> g) {
    if (std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(std::move(g));
  };
  for (int32_t s = 0; topo.replicas > 1 && s < topo.stages; ++s)
    add(Topology{topo.stages, topo.replicas, s}.DataParallelGroup());
  for (int32_t d = 0; d < topo.replicas; ++d) {
    for (const std::vector<int32_t>& stages : program_.shared_groups) {
      std::vector<int> g;
      for (int s : stages) g.push_back(topo.RankOf(s, d));
      add(std::move(g));
    }
  }
  return groups;
}

absl::StatusOr<ProgramFacts> ProgramFactsOf(const ir::Graph& training_graph, const PipelineProgram& program,
                                            int32_t loss_microbatches) {
  ProgramFacts f;
  ASSIGN_OR_RETURN(f.loss_rule, AnalyzeLoss(training_graph, program.loss, loss_microbatches));
  f.seed_like = *training_graph.value(program.loss_seed).constant;
  f.seed_like = ir::Tensor::DimsOnly(f.seed_like.dtype(), f.seed_like.dims());
  bool labels_read = f.loss_rule.labels_input.empty();
  for (const StageProgram& sp : program.stages) {
    for (ir::ValueId v : sp.data_inputs) {
      const ir::Value& val = training_graph.value(v);
      labels_read |= val.name == f.loss_rule.labels_input;
      if (!val.shape_known || val.shape.empty() || !val.shape[0].is_concrete()) {
        return INVALID_ARGUMENT() << "data input '" << val.name << "' has no concrete leading (batch) dim in the "
                                  << "training graph: bind the micro-batch size before building it";
      }
      if (f.microbatch_size != 0 && f.microbatch_size != val.shape[0].value()) {
        return INVALID_ARGUMENT() << "data inputs disagree on the micro-batch size (" << f.microbatch_size << " and "
                                  << val.shape[0].value() << " at '" << val.name << "')";
      }
      f.microbatch_size = val.shape[0].value();
    }
    for (const ir::Graph::StateUpdate& u : sp.state_updates) {
      const ir::Value& val = sp.graph.value(u.state);
      if (val.constant) f.state_shapes.emplace(val.name, ir::Tensor::DimsOnly(val.constant->dtype(), val.constant->dims()));
    }
  }
  if (!labels_read) {
    return absl::InternalError("the loss's labels '" + f.loss_rule.labels_input + "' are read by no stage");
  }
  for (const auto& [v, s] : program.parameter_owner) f.parameters[training_graph.value(v).name] = s;
  return f;
}

absl::StatusOr<std::unique_ptr<PipelineExecutor>> PipelineExecutor::Create(
    const ir::Graph& training_graph, partitioner::CompiledPlan plan, const ExecutorOptions& options,
    std::shared_ptr<const backend::Backend> backend) {
  ASSIGN_OR_RETURN(ProgramFacts facts, ProgramFactsOf(training_graph, plan.program,
                                                      plan.microbatches * std::max(options.topology.replicas, 1)));
  return Create(std::move(facts), std::move(plan), options, std::move(backend));
}

absl::StatusOr<std::unique_ptr<PipelineExecutor>> PipelineExecutor::Create(
    ProgramFacts facts, partitioner::CompiledPlan plan, const ExecutorOptions& options,
    std::shared_ptr<const backend::Backend> backend) {
  const int32_t M = plan.microbatches;
  if (M < 1) return INVALID_ARGUMENT() << "--microbatches must be >= 1, got " << M;
  if (static_cast<int32_t>(plan.actions.size()) != plan.program.num_stages) {
    return INVALID_ARGUMENT() << "the plan has " << plan.actions.size() << " action lists for "
                              << plan.program.num_stages << " stages";
  }
  std::unique_ptr<PipelineExecutor> ex(new PipelineExecutor());
  ex->options_ = options;
  ex->schedule_ = plan.schedule;
  ex->microbatches_ = M;
  ex->backend_ = backend ? std::move(backend) : backend::MakeCpuBackend();
  ex->staging_ = std::make_shared<comm::StagingPool>();
  ex->program_ = std::move(plan.program);
  ex->lists_ = std::move(plan.actions);
  ex->facts_ = std::move(facts);
  if (static_cast<int32_t>(ex->program_.all_reduced.size()) != ex->program_.num_stages) {
    return absl::InternalError("the program has no all-reduce list per stage");
  }
  const std::shared_ptr<const backend::Backend> be = ex->backend_;
  const Topology& topo = options.topology;
  if (options.world != nullptr) {
    if (topo.stages != ex->program_.num_stages || topo.replicas < 1 || topo.world() != options.world->size() ||
        topo.rank != options.world->rank()) {
      return INVALID_ARGUMENT() << "the plan has " << ex->program_.num_stages << " stages; " << topo.Describe()
                                << " does not fit a world of " << options.world->size() << " ranks (rank "
                                << options.world->rank() << ")";
    }
    ex->pipeline_comm_ = std::make_unique<comm::SubgroupComm>(*options.world, topo.PipelineGroup());
  } else if (topo.replicas != 1) {
    return INVALID_ARGUMENT() << "data parallelism needs one process per rank (a world comm)";
  }
  for (StageProgram& sp : ex->program_.stages) {
    if (options.world != nullptr && sp.stage != topo.stage()) {  // another process's stage
      // Its constants (parameters, optimizer state, tables) are that process's: keep their dtypes and dims only.
      for (ir::ValueId v = 0; v < sp.graph.num_values(); ++v) {
        std::optional<ir::Tensor>& c = sp.graph.value(v).constant;
        if (c) c = ir::Tensor::DimsOnly(c->dtype(), c->dims());
      }
      ex->stages_.push_back(nullptr);
      continue;
    }
    const int64_t in_flight = partitioner::InFlightMicrobatches(ex->schedule_, ex->program_.num_stages, sp.stage, M);
    ASSIGN_OR_RETURN(std::unique_ptr<StageExecutor> stage,
                     StageExecutor::Create(sp, ex->options_, M, in_flight, be, ex->program_.all_reduced[sp.stage]));
    ex->stages_.push_back(std::move(stage));
  }
  if (options.world != nullptr) RETURN_IF_ERROR(options.world->PrepareGroups(ex->AllReduceGroups(topo)));
  // Every constant a stage reads (parameters, optimizer state, folded constants) moves to its backend once,
  // on the stage's stream, except those only read on the host (shape operands, Slice bounds).
  for (size_t s = 0; s < ex->program_.stages.size(); ++s) {
    if (!ex->is_local(static_cast<int32_t>(s))) continue;
    StageProgram& sp = ex->program_.stages[s];
    const std::vector<std::vector<ir::NodeId>> uses = sp.graph.ComputeUses();
    for (ir::ValueId v = 0; v < sp.graph.num_values(); ++v) {
      std::optional<ir::Tensor>& c = sp.graph.value(v).constant;
      if (!c || backend::ReadOnlyOnHost(*be, sp.graph, uses, v)) continue;
      ASSIGN_OR_RETURN(*c, be->Upload(*c, ex->stages_[s]->stream()));
    }
  }
  // A process feeds the data inputs of its own stages, and the labels where it computes the loss (the loss shares
  // count their valid rows).
  const std::string& labels = ex->facts_.loss_rule.labels_input;
  const bool labels_here = !labels.empty() && ex->is_local(ex->program_.loss_stage);
  std::set<std::string> fed;
  for (const StageProgram& sp : ex->program_.stages) {
    if (!ex->is_local(sp.stage)) continue;
    for (ir::ValueId v : sp.data_inputs) {
      const ir::Value& val = sp.graph.value(v);
      if (!val.shape_known || val.shape.empty() || val.shape[0] != ir::Dim(ex->facts_.microbatch_size)) {
        return INVALID_ARGUMENT() << "data input '" << val.name << "' of stage " << sp.stage << " is "
                                  << ir::ShapeToString(val.shape) << ": expected micro-batches of "
                                  << ex->facts_.microbatch_size << " rows";
      }
      fed.insert(val.name);
    }
  }
  if (labels_here) fed.insert(labels);
  ex->data_inputs_.assign(fed.begin(), fed.end());
  if (options.graphs) {
    if (options.check_numerics || options.node_hook) {
      return INVALID_ARGUMENT() << "graphs cannot be combined with --check-numerics (or a node hook): they look at "
                                   "every node's outputs, which a graph replay does not return";
    }
    if (!be->CanCapture()) {
      return INVALID_ARGUMENT() << "graphs need a backend that records them (cuda), not " << be->name();
    }
    for (const std::unique_ptr<StageExecutor>& stage : ex->stages_)
      if (stage != nullptr) RETURN_IF_ERROR(stage->EnableGraphs());
  }
  return ex;
}

}  // namespace onnxpipe::pipeline
