// Stage program files: `onnxpipe partition --out DIR` writes DIR/stage_<k>.program for every stage, the stage's
// compiled program (partitioner/stage_program.h) with what its process needs of the rest of the run, so that a rank
// of `onnxpipe train --plan DIR` builds its own stage from the plan alone: no training graph, no autodiff, no other
// stage's nodes. The plan is the source of truth: the rank checks the file against plan.json, the model and its own
// flags, each mismatch an error naming the file and what differs, and runs it as written.
//
// Format: CBOR (nlohmann::json::to_cbor), one object, followed by the masked CRC32C of its bytes (4 bytes,
// little-endian: a damaged or cut file is refused before it is parsed):
//   format "onnxpipe stage program", version 1, stage k, num_stages K, microbatches M, data_parallel D,
//   actions     the stage's action list (schedule.h's strings), equal to plan.json's
//   spec        the training options the graph was built with (autodiff::TrainingGraphSpec)
//   bindings    the micro-batch graph's symbol bindings (its batch and sequence dims, ...)
//   values      [{name, dtype, shape, shape_known, initializer, param_state, exported_as, constant?}]: the values the
//               stage's nodes and lists touch; constant: {model: true, crc32c} for the model's initializer of that
//               name (taken from the model at load, its bytes checked), else {dtype, dims, data | zeros} (neither:
//               dims only; zeros: the optimizer state a run starts from)
//   nodes       [{op, name, scope, inputs, outputs, attrs, phase, origin}]: the nodes the stage runs, in graph order;
//               inputs and outputs index `values` (-1: absent)
//   program     the StageProgram's lists over those indices
//   pipeline    loss_stage, grad_norm_stage, shared_groups, all_reduced (this stage's: node index -> stages)
//   facts       ProgramFacts: loss rule, loss seed dtype and dims, micro-batch size, every stage's state shapes,
//               every parameter's stage
//   trainer     input dtypes, trained parameter count, class count, unreachable parameters
// Values and nodes are numbered anew (dense, in the training graph's order); transfers are tagged by value name
// (stage_comm.cc), so the stages need not share ids.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/pipeline/executor.h"
#include "frontend/autodiff/training_graph.h"
#include "frontend/ir/graph.h"
#include "partitioner/partitioner.h"
#include "partitioner/plan_io.h"

namespace onnxpipe::pipeline {

// DIR/stage_<k>.program.
std::string StageFilePath(const std::string& dir, int32_t stage);

// What the writer needs beyond the compiled plan.
struct StageFileSource {
  const autodiff::TrainingGraph* training = nullptr;  // the graph `plan` was compiled against
  const ir::Graph* model = nullptr;  // the imported model: constants equal to its initializers are referenced
  autodiff::TrainingGraphSpec spec;
  int32_t data_parallel = 1;
};

// Writes every stage's file into `dir` (atomically, each).
absl::Status WriteStageFiles(const std::string& dir, const partitioner::CompiledPlan& plan,
                             const StageFileSource& source);

// A rank's stage, read back.
struct LoadedStage {
  partitioner::CompiledPlan plan;  // program.stages[k] is the stage's; the others hold only their index
  ProgramFacts facts;
  autodiff::TrainingGraphSpec spec;
  std::map<std::string, int64_t> bindings;
  std::map<std::string, ir::DType> input_dtypes;
  int64_t num_trainable = 0, num_classes = 0;
  std::vector<std::string> unreachable;
  int64_t num_nodes = 0;  // the nodes the stage runs
};

// Reads stage `stage`'s file of the plan in `dir` (`plan`: its plan.json, whose schedule, micro-batches and actions
// the file must match). Constants that reference the model take `model`'s initializer of that name (copied), whose
// dtype, dims and CRC32C must be the ones the partition saw.
absl::StatusOr<LoadedStage> ReadStageFile(const std::string& dir, int32_t stage, const partitioner::PartitionPlan& plan,
                                          const ir::Graph& model);

// OK when the run's training options and trained parameters are the ones the stage was built for; otherwise an error
// naming the file, the flag (or parameter) and both values. (The batch is plan.json's; the data's other dims are
// checked against the stage's inputs when the data is set: PipelineTrainer::SetData.)
absl::Status CheckStageMatchesRun(const LoadedStage& loaded, const std::string& file,
                                  const autodiff::TrainingGraphSpec& run, const ir::Graph& model);

}  // namespace onnxpipe::pipeline
