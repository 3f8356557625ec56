// The partition reports, each a pure function of the plan returning the file's text, and the
// writer of a plan folder (every file atomically: temp file, fsync, rename, folder fsync).
//   plan.json            plan_io.h
//   report.txt           a per-stage table for a terminal
//   report.html          self-contained (inline SVG and CSS, no script, no network): stacked memory
//                        bars per stage against the device capacity, a Gantt chart of the
//                        simulated schedule, the layer-to-stage map, the stage table
//   partition.dot        Graphviz: one cluster per stage (its layers), boundary tensors as edges
//   schedule.trace.json  Chrome trace (chrome://tracing, Perfetto): pid = stage, tid 0 compute,
//                        tid 1 transfers; times in microseconds
// stage_<k>.onnx files come from frontend/onnx/stage_export.h (the tool writes them).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "partitioner/partitioner.h"

namespace onnxpipe::partitioner {

std::string ReportText(const PartitionPlan& plan);
std::string ReportHtml(const PartitionPlan& plan);
std::string PartitionDot(const PartitionPlan& plan);
std::string ScheduleTraceJson(const PartitionPlan& plan);
// The Chrome trace of a simulated step (schedule.h's events), `other_data` as its "otherData".
std::string TimelineTraceJson(const ScheduleResult& timeline, int32_t num_stages, nlohmann::ordered_json other_data);
// A Chrome trace of `num_stages` stages (pid = stage; tid 0 named "compute", tid 1 `lane1`) holding
// `spans` (ChromeSpan), times in microseconds.
std::string ChromeTraceJson(int32_t num_stages, const std::string& lane1, nlohmann::ordered_json spans,
                            nlohmann::ordered_json other_data);
// One complete ("X") event; a micro-batch >= 0 goes into its args.
nlohmann::ordered_json ChromeSpan(const std::string& name, const std::string& category, double start_us, double dur_us,
                                  int32_t stage, int32_t lane, int32_t microbatch);

// Writes plan.json, report.txt, report.html, partition.dot and schedule.trace.json into `dir`
// (created if missing).
absl::Status WritePlanFiles(const PartitionPlan& plan, const std::string& dir);

// The batch and the ranks: "batch 64 = 8 micro-batches x 8, 2 stages" or, with D > 1 replicas,
// "batch 128 = 2 replicas x 64 = 2 x 8 micro-batches x 8, 2 stages x 2 replicas = 4 ranks".
std::string DescribeBatch(const PartitionPlan& plan);
// "" for one replica; else the step's parts: "pipeline 12.0 ms + data-parallel all-reduce 1.50 ms (stage 0)".
std::string DescribeStepParts(const PartitionPlan& plan);

// "12.5 ms", "1.23 s"
std::string FormatMs(double ms);
// "encoder/layers.0-5, norm": consecutive indexed layer keys folded into ranges.
std::string CompressLayers(const std::vector<std::string>& layers);
// Escapes &, <, >, " for HTML/SVG text and attributes.
std::string HtmlEscape(const std::string& s);

}  // namespace onnxpipe::partitioner
