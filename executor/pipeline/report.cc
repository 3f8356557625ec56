// Report files. Means leave out step 0 when there are more steps (first-touch allocations and cold
// caches make it an outlier), so the times describe the steady state the plan predicts.
#include "executor/pipeline/report.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "executor/io/atomic_file.h"
#include "executor/pipeline/memory.h"
#include "frontend/ir/status.h"
#include "nlohmann/json.hpp"
#include "partitioner/reports.h"
#include "partitioner/schedule.h"

namespace onnxpipe::pipeline {
namespace {

using ojson = nlohmann::ordered_json;

struct StageMeans {
  double forward_ms = 0, backward_ms = 0, recompute_ms = 0, optimizer_ms = 0, recv_wait_ms = 0;
  StageMeasure worst;  // memory: the largest over the steps
};

std::vector<StageMeans> Means(const std::vector<PipelineStepResult>& steps, int32_t K, int32_t M) {
  std::vector<StageMeans> out(K);
  const size_t first = steps.size() > 1 ? 1 : 0;
  const double n = static_cast<double>(steps.size() - first);
  for (size_t k = 0; k < steps.size(); ++k) {
    for (int32_t s = 0; s < K; ++s) {
      const StageMeasure& m = steps[k].stages[s];
      StageMeasure& w = out[s].worst;
      for (int64_t StageMeasure::*f :
           {&StageMeasure::saved_bytes, &StageMeasure::activations_peak, &StageMeasure::transient_bytes,
            &StageMeasure::arena_bytes, &StageMeasure::accumulator_bytes, &StageMeasure::workspace_bytes,
            &StageMeasure::optimizer_scratch_bytes}) {
        w.*f = std::max(w.*f, m.*f);
      }
      w.max_in_flight = std::max(w.max_in_flight, m.max_in_flight);
      w.bytes_sent = m.bytes_sent;
      w.bytes_received = m.bytes_received;
      if (k < first) continue;
      out[s].forward_ms += m.forward_s * 1e3 / M / n;
      out[s].backward_ms += m.backward_s * 1e3 / M / n;
      out[s].recompute_ms += m.recompute_s * 1e3 / M / n;
      out[s].optimizer_ms += m.post_s * 1e3 / n;
      out[s].recv_wait_ms += m.recv_wait_s * 1e3 / n;
    }
  }
  return out;
}

std::string Bytes(int64_t b) {
  char buf[32];
  if (b >= (int64_t{1} << 30)) {
    std::snprintf(buf, sizeof(buf), "%.2f GiB", b / 1073741824.0);
  } else if (b >= (int64_t{1} << 20)) {
    std::snprintf(buf, sizeof(buf), "%.2f MiB", b / 1048576.0);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f KiB", b / 1024.0);
  }
  return buf;
}

// The StageMeasure and StageMemoryPrediction fields a record carries.
constexpr std::pair<const char*, double StageMeasure::*> kMeasureTimes[] = {
    {"forward_s", &StageMeasure::forward_s}, {"backward_s", &StageMeasure::backward_s},
    {"recompute_s", &StageMeasure::recompute_s}, {"post_s", &StageMeasure::post_s},
    {"recv_wait_s", &StageMeasure::recv_wait_s}};
constexpr std::pair<const char*, int64_t StageMeasure::*> kMeasureBytes[] = {
    {"saved_bytes", &StageMeasure::saved_bytes},
    {"activations_peak", &StageMeasure::activations_peak},
    {"transient_bytes", &StageMeasure::transient_bytes},
    {"arena_bytes", &StageMeasure::arena_bytes},
    {"accumulator_bytes", &StageMeasure::accumulator_bytes},
    {"workspace_bytes", &StageMeasure::workspace_bytes},
    {"optimizer_scratch_bytes", &StageMeasure::optimizer_scratch_bytes},
    {"bytes_sent", &StageMeasure::bytes_sent},
    {"bytes_received", &StageMeasure::bytes_received}};
constexpr std::pair<const char*, int64_t StageMemoryPrediction::*> kPredicted[] = {
    {"saved", &StageMemoryPrediction::saved},           {"in_flight", &StageMemoryPrediction::in_flight},
    {"activations", &StageMemoryPrediction::activations}, {"arena", &StageMemoryPrediction::arena},
    {"transient", &StageMemoryPrediction::transient},   {"peak", &StageMemoryPrediction::peak},
    {"accumulators", &StageMemoryPrediction::accumulators}, {"workspace", &StageMemoryPrediction::workspace},
    {"parameters", &StageMemoryPrediction::parameters}, {"optimizer_state", &StageMemoryPrediction::optimizer_state},
    {"total", &StageMemoryPrediction::total}};

}  // namespace

std::string StageRecordJson(const PipelineExecutor& ex, const std::vector<PipelineStepResult>& steps, int32_t stage) {
  ojson steps_json = ojson::array();
  for (const PipelineStepResult& r : steps) {
    const StageMeasure& m = r.stages.at(stage);
    ojson sj = {{"max_in_flight", m.max_in_flight}};
    for (const auto& [key, f] : kMeasureTimes) sj[key] = m.*f;
    for (const auto& [key, f] : kMeasureBytes) sj[key] = m.*f;
    ojson trace = ojson::array();
    for (const TraceEvent& e : r.trace) {
      if (e.stage != stage) continue;
      trace.push_back({e.lane, e.name, e.category, e.microbatch, e.start_us, e.dur_us});
    }
    sj["trace"] = std::move(trace);
    steps_json.push_back(std::move(sj));
  }
  const StageMemoryPrediction pr = PredictStageMemory(ex.program().stages.at(stage), ex.layout(stage));
  ojson predicted;
  for (const auto& [key, f] : kPredicted) predicted[key] = pr.*f;
  return ojson{{"stage", stage}, {"steps", std::move(steps_json)}, {"predicted_memory", std::move(predicted)}}.dump();
}

absl::Status MergeStageRecord(const std::string& record, std::vector<PipelineStepResult>* steps,
                              std::vector<StageMemoryPrediction>* predicted) {
  try {
    const nlohmann::json j = nlohmann::json::parse(record);
    const int32_t stage = j.at("stage").get<int32_t>();
    const nlohmann::json& sj = j.at("steps");
    if (stage < 0 || stage >= static_cast<int32_t>(predicted->size()) || sj.size() != steps->size()) {
      return INVALID_ARGUMENT() << "--report: stage " << stage << "'s rank measured " << sj.size() << " steps, rank 0 "
                                << steps->size() << " (of " << predicted->size() << " stages)";
    }
    for (size_t k = 0; k < steps->size(); ++k) {
      StageMeasure& m = (*steps)[k].stages.at(stage);
      m.max_in_flight = sj[k].at("max_in_flight").get<int32_t>();
      for (const auto& [key, f] : kMeasureTimes) m.*f = sj[k].at(key).get<double>();
      for (const auto& [key, f] : kMeasureBytes) m.*f = sj[k].at(key).get<int64_t>();
      for (const nlohmann::json& e : sj[k].at("trace")) {
        (*steps)[k].trace.push_back({stage, e.at(0).get<int32_t>(), e.at(1).get<std::string>(),
                                     e.at(2).get<std::string>(), e.at(3).get<int32_t>(), e.at(4).get<double>(),
                                     e.at(5).get<double>()});
      }
    }
    for (const auto& [key, f] : kPredicted) (*predicted)[stage].*f = j.at("predicted_memory").at(key).get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    return INVALID_ARGUMENT() << "--report: a stage's record is malformed: " << e.what();
  }
  return absl::OkStatus();
}

std::string MeasuredTraceJson(const PipelineStepResult& step, int32_t num_stages, const std::string& model) {
  ojson spans = ojson::array();
  for (const TraceEvent& e : step.trace) {
    spans.push_back(partitioner::ChromeSpan(e.name, e.category, e.start_us, e.dur_us, e.stage, e.lane, e.microbatch));
  }
  return partitioner::ChromeTraceJson(
      num_stages, "receive waits", std::move(spans),
      {{"generator", "onnxpipe train (measured)"}, {"model", model}, {"step_ms", step.seconds * 1e3}});
}

absl::Status WriteRunReport(const std::string& dir, const PipelineExecutor& ex,
                            const std::vector<PipelineStepResult>& steps, const ReportContext& ctx) {
  if (steps.empty()) return INVALID_ARGUMENT() << "--report: no step ran";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return INVALID_ARGUMENT() << "--report: cannot create '" << dir << "': " << ec.message();
  const PipelineProgram& p = ex.program();
  const int32_t K = p.num_stages, M = ex.microbatches();
  const partitioner::ScheduleKind kind = ex.schedule();
  const std::vector<StageMeans> means = Means(steps, K, M);

  ojson j;
  j["schema_version"] = 1;
  j["generator"] = "onnxpipe train";
  j["model"] = ctx.model;
  j["config"] = {{"num_stages", K}, {"microbatches", M}, {"microbatch_size", ex.microbatch_size()},
                 {"batch", ex.microbatch_size() * M}, {"schedule", partitioner::ScheduleName(kind)},
                 {"plan", ctx.plan_dir.empty() ? nlohmann::ordered_json(nullptr) : ojson(ctx.plan_dir)}};
  ojson js = ojson::array();
  for (const PipelineStepResult& r : steps) {
    js.push_back({{"loss", r.loss}, {"grad_norm", std::isfinite(r.grad_norm) ? ojson(r.grad_norm) : ojson(nullptr)},
                  {"seconds", r.seconds}, {"samples_per_s", r.seconds > 0 ? ex.microbatch_size() * M / r.seconds : 0}});
  }
  j["steps"] = std::move(js);
  std::ostringstream txt;
  txt << "pipelined run: " << ctx.model << ", " << K << " stages, " << M << " micro-batches of "
      << ex.microbatch_size() << ", " << partitioner::ScheduleName(kind) << (ctx.plan ? ", plan " + ctx.plan_dir : "") << "\n";
  txt << "memory: high-water measured | planned (the stage's static layout); times: mean per micro-batch\n";
  char line[512];
  std::snprintf(line, sizeof(line), "%-5s %-23s %-9s %-23s %-23s %-23s %9s %9s %9s %9s\n", "stage", "saved/micro-batch",
                "in-flight", "arena", "accumulators", "kernel scratch", "fwd ms", "bwd ms", "recomp ms", "opt ms");
  txt << line;
  ojson stages = ojson::array();
  std::ostringstream plan_lines;
  for (int32_t s = 0; s < K; ++s) {
    const StageMeasure& m = means[s].worst;
    const StageMemoryPrediction pr =
        ctx.predicted_memory.empty() ? PredictStageMemory(p.stages[s], ex.layout(s)) : ctx.predicted_memory.at(s);
    ojson st = {
        {"index", s},
        {"measured",
         {{"memory", {{"saved_per_microbatch", m.saved_bytes}, {"activations", m.activations_peak},
                      {"in_flight", m.max_in_flight}, {"transient", m.transient_bytes}, {"arena", m.arena_bytes},
                      {"accumulators", m.accumulator_bytes}, {"kernel_scratch", m.workspace_bytes},
                      {"optimizer_scratch", m.optimizer_scratch_bytes}}},
          {"forward_ms", means[s].forward_ms}, {"backward_ms", means[s].backward_ms},
          {"recompute_ms", means[s].recompute_ms}, {"optimizer_ms", means[s].optimizer_ms},
          {"recv_wait_ms", means[s].recv_wait_ms}, {"bytes_sent", m.bytes_sent}, {"bytes_received", m.bytes_received}}},
        {"predicted",
         {{"memory", {{"saved_per_microbatch", pr.saved}, {"activations", pr.activations}, {"in_flight", pr.in_flight},
                      {"transient", pr.transient}, {"arena", pr.arena}, {"arena_lower_bound_per_microbatch", pr.peak},
                      {"accumulators", pr.accumulators}, {"kernel_scratch", pr.workspace}, {"parameters", pr.parameters},
                      {"optimizer_state", pr.optimizer_state}, {"total", pr.total}}}}},
    };
    // What the stage recomputed: the forward nodes of its recompute regions, in run order (the plan's, which a rank
    // built from its stage file holds for every stage).
    ojson recomputed = ojson::array();
    if (ctx.plan && s < static_cast<int32_t>(ctx.plan->stages.size())) {
      for (const partitioner::RegionPlan& r : ctx.plan->stages[s].recompute_regions)
        for (const std::string& name : r.nodes) recomputed.push_back(name);
    } else {
      for (const partitioner::RecomputeRegion& r : p.stages[s].regions)
        for (ir::NodeId id : r.nodes) recomputed.push_back(p.stages[s].graph.node(id).name);
    }
    st["recompute_nodes"] = std::move(recomputed);
    if (ctx.plan && s < static_cast<int32_t>(ctx.plan->stages.size())) {
      const partitioner::StagePlan& ps = ctx.plan->stages[s];
      st["plan"] = {{"memory", {{"saved_per_microbatch", ps.memory.saved}, {"activations", ps.memory.activations},
                                {"in_flight", ps.memory.in_flight}, {"arena", ps.memory.arena},
                                {"transient", ps.memory.transient}, {"kernel_scratch", ps.memory.kernel_scratch},
                                {"gradients", ps.memory.gradients},
                                {"total", ps.memory.total}}},
                    {"forward_ms", ps.forward_ms}, {"backward_ms", ps.backward_ms}, {"recompute_ms", ps.recompute_ms},
                    {"optimizer_ms", ps.optimizer_ms}};
    }
    stages.push_back(std::move(st));
    std::snprintf(line, sizeof(line), "%-5d %-23s %-9s %-23s %-23s %-23s %9.3f %9.3f %9.3f %9.3f\n", s,
                  (Bytes(m.saved_bytes) + " | " + Bytes(pr.saved)).c_str(),
                  (std::to_string(m.max_in_flight) + " | " + std::to_string(pr.in_flight)).c_str(),
                  (Bytes(m.arena_bytes) + " | " + Bytes(pr.arena)).c_str(),
                  (Bytes(m.accumulator_bytes) + " | " + Bytes(pr.accumulators)).c_str(),
                  (Bytes(m.workspace_bytes) + " | " + Bytes(pr.workspace)).c_str(),
                  means[s].forward_ms, means[s].backward_ms, means[s].recompute_ms, means[s].optimizer_ms);
    txt << line;
    if (ctx.plan && s < static_cast<int32_t>(ctx.plan->stages.size())) {
      const partitioner::StageMemory& pm = ctx.plan->stages[s].memory;
      plan_lines << "  stage " << s << ": arena " << pm.arena << " bytes in plan.json, " << m.arena_bytes << " measured ("
                 << (pm.arena == m.arena_bytes ? "equal" : "DIFFERENT") << "); gradients " << pm.gradients << " | "
                 << m.accumulator_bytes << "\n";
    }
  }
  if (ctx.plan) txt << "the partition plan's prediction:\n" << plan_lines.str();
  j["stages"] = std::move(stages);
  double mean_step = 0;
  for (size_t k = steps.size() > 1 ? 1 : 0; k < steps.size(); ++k) mean_step += steps[k].seconds;
  mean_step /= static_cast<double>(steps.size() > 1 ? steps.size() - 1 : 1);
  j["measured"] = {{"step_ms", mean_step * 1e3}, {"samples_per_s", ex.microbatch_size() * M / mean_step}};
  txt << "step: " << mean_step * 1e3 << " ms measured";

  // The predicted timeline: the plan's, or the schedule simulated with the measured stage times.
  std::string predicted;
  if (ctx.plan && !ctx.plan_dir.empty()) {
    absl::StatusOr<std::string> t = io::ReadFileToString(ctx.plan_dir + "/schedule.trace.json");
    if (t.ok()) predicted = *t;
    j["predicted"] = {{"source", "plan"}, {"step_ms", ctx.plan->step_ms}, {"bubble_fraction", ctx.plan->bubble_fraction}};
    txt << ", " << ctx.plan->step_ms << " ms predicted by the plan\n";
  }
  if (predicted.empty()) {
    // The lists the stages ran, timed with the measured mean stage times.
    std::vector<partitioner::StageTiming> timing(K);
    for (int32_t s = 0; s < K; ++s) {
      timing[s].forward_s = means[s].forward_ms * 1e-3;
      timing[s].backward_s = (means[s].backward_ms) * 1e-3;
      timing[s].optimizer_s = means[s].optimizer_ms * 1e-3;
    }
    ASSIGN_OR_RETURN(const partitioner::ScheduleResult sim, partitioner::Simulate(ex.action_lists(), timing));
    predicted = partitioner::TimelineTraceJson(
        sim, K, {{"generator", "onnxpipe train (schedule simulated with the measured mean stage times)"},
                 {"step_ms", sim.step_s * 1e3}, {"bubble_fraction", sim.bubble_fraction}});
    j["predicted"] = {{"source", "schedule simulated with the measured stage times"}, {"step_ms", sim.step_s * 1e3},
                      {"bubble_fraction", sim.bubble_fraction}};
    txt << ", " << sim.step_s * 1e3 << " ms for the schedule alone (simulated with the measured stage times, bubble "
        << sim.bubble_fraction << ")\n";
  }
  const std::string measured_trace = MeasuredTraceJson(steps.back(), K, ctx.model);
  RETURN_IF_ERROR(io::WriteFileAtomically(dir + "/measured.json", j.dump(1) + "\n"));
  RETURN_IF_ERROR(io::WriteFileAtomically(dir + "/measured.trace.json", measured_trace));
  RETURN_IF_ERROR(io::WriteFileAtomically(dir + "/report.html", RunReportHtml(j, measured_trace, predicted)));
  RETURN_IF_ERROR(io::WriteFileAtomically(dir + "/predicted.trace.json", predicted));
  RETURN_IF_ERROR(io::WriteFileAtomically(dir + "/report.txt", txt.str()));
  return absl::OkStatus();
}

}  // namespace onnxpipe::pipeline
