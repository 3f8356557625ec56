// `onnxpipe train --report DIR`: the measured side of a pipelined run next to its prediction.
//
//   measured.json         schema_version 1: config; per step {step, loss, grad_norm, seconds};
//                         per stage the measured memory (peak, saved per micro-batch, activations
//                         high-water, in-flight count, accumulators) and mean times per micro-batch
//                         (forward, backward, recompute) and per step (optimizer, receive waits),
//                         beside the prediction: the static planner's numbers for the very program
//                         the stage ran (memory.h) and, with --plan, the plan's own stage numbers;
//                         recompute_nodes: the forward nodes the stage recomputed
//   measured.trace.json   Chrome trace of the last step: pid = stage, tid 0 compute (F m, B m,
//                         R m, optimizer), tid 1 receive waits
//   predicted.trace.json  the plan's schedule.trace.json (with --plan); otherwise the stages'
//                         action lists simulated (partitioner/schedule.h) with the measured mean
//                         stage times, i.e. what the schedule alone explains of the measured timeline
//   report.txt            a per-stage table, measured | predicted
//   report.html           the same table and both timelines as inline SVG (self-contained)
// Files are written atomically; DIR is created. A multi-process run's report is written by rank 0 with every
// stage's numbers: each stage's rank sends its record (StageRecordJson) and rank 0 merges them (MergeStageRecord);
// the trace's times of a stage are then from that rank's own start of the step.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "executor/pipeline/executor.h"
#include "executor/pipeline/memory.h"
#include "nlohmann/json.hpp"
#include "partitioner/partitioner.h"

namespace onnxpipe::pipeline {

struct ReportContext {
  std::string model;
  const partitioner::PartitionPlan* plan = nullptr;  // with --plan
  std::string plan_dir;                              // its folder (for schedule.trace.json)
  // Per stage, the static planner's memory (memory.h); empty: computed from the executor's layouts, which a
  // multi-process run's rank holds for its own stage only.
  std::vector<StageMemoryPrediction> predicted_memory;
};

// What stage `stage` of this process measured in every step (its StageMeasure, its trace events) and its predicted
// memory, as JSON.
std::string StageRecordJson(const PipelineExecutor& ex, const std::vector<PipelineStepResult>& steps, int32_t stage);
// Puts another rank's record into `steps` (the same steps: an error naming the stage when the counts differ) and its
// predicted memory into `predicted` (indexed by stage).
absl::Status MergeStageRecord(const std::string& record, std::vector<PipelineStepResult>* steps,
                              std::vector<StageMemoryPrediction>* predicted);

absl::Status WriteRunReport(const std::string& dir, const PipelineExecutor& ex,
                            const std::vector<PipelineStepResult>& steps, const ReportContext& ctx);

// The Chrome trace of one step (measured.trace.json's content).
std::string MeasuredTraceJson(const PipelineStepResult& step, int32_t num_stages, const std::string& model);
// report.html from measured.json's content and the two traces.
std::string RunReportHtml(const nlohmann::ordered_json& measured, const std::string& measured_trace,
                          const std::string& predicted_trace);

}  // namespace onnxpipe::pipeline
