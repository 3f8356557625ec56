// report.txt, partition.dot, schedule.trace.json and the plan-folder writer. (report.html is in
// report_html.cc.)
#include "partitioner/reports.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <regex>
#include <sstream>

#include "executor/io/atomic_file.h"
#include "frontend/ir/status.h"
#include "nlohmann/json.hpp"
#include "partitioner/plan_io.h"

namespace onnxpipe::partitioner {
namespace {

std::string Percent(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %%", 100.0 * x);
  return buf;
}

std::string Short(std::string name) {
  while (!name.empty() && name[0] == '/') name.erase(0, 1);
  return name.empty() ? "(top)" : name;
}

std::string Pad(const std::string& s, size_t width, bool right = true) {
  if (s.size() >= width) return s;
  return right ? std::string(width - s.size(), ' ') + s : s + std::string(width - s.size(), ' ');
}

}  // namespace

std::string FormatMs(double ms) {
  char buf[32];
  if (ms == 0) return "0";
  if (ms >= 1000) {
    std::snprintf(buf, sizeof(buf), "%.2f s", ms / 1000);
  } else if (ms >= 10) {
    std::snprintf(buf, sizeof(buf), "%.1f ms", ms);
  } else if (ms >= 0.1) {
    std::snprintf(buf, sizeof(buf), "%.2f ms", ms);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f us", ms * 1000);
  }
  return buf;
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// "encoder/layers.0-5, norm" from consecutive indexed layer keys.
std::string CompressLayers(const std::vector<std::string>& layers) {
  static const std::regex indexed(R"((.*[._])(\d+)$)");
  std::vector<std::string> parts;
  std::string prefix;
  long first = -1, last = -1;
  auto flush = [&] {
    if (first < 0) return;
    parts.push_back(first == last ? prefix + std::to_string(first)
                                  : prefix + std::to_string(first) + "-" + std::to_string(last));
    first = last = -1;
  };
  for (const std::string& raw : layers) {
    const std::string l = Short(raw);
    std::smatch m;
    if (std::regex_match(l, m, indexed)) {
      const long idx = std::stol(m[2].str());
      if (first >= 0 && m[1].str() == prefix && idx == last + 1) {
        last = idx;
        continue;
      }
      flush();
      prefix = m[1].str();
      first = last = idx;
    } else {
      flush();
      parts.push_back(l);
    }
  }
  flush();
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

std::string DescribeBatch(const PartitionPlan& p) {
  const std::string stages = std::to_string(p.num_stages) + (p.num_stages == 1 ? " stage" : " stages");
  const std::string per_replica =
      std::to_string(p.microbatches) + " micro-batches x " + std::to_string(p.microbatch_size);
  if (p.data_parallel <= 1) return "batch " + std::to_string(p.batch) + " = " + per_replica + ", " + stages;
  return "batch " + std::to_string(p.batch * p.data_parallel) + " = " + std::to_string(p.data_parallel) +
         " replicas x " + std::to_string(p.batch) + " = " + std::to_string(p.data_parallel) + " x " + per_replica +
         ", " + stages + " x " + std::to_string(p.data_parallel) +
         " replicas = " + std::to_string(p.num_stages * p.data_parallel) + " ranks";
}

std::string DescribeStepParts(const PartitionPlan& p) {
  if (p.data_parallel <= 1) return "";
  int32_t slowest = 0;
  for (const StagePlan& s : p.stages) {
    if (s.data_parallel_exposed_ms > p.stages[slowest].data_parallel_exposed_ms) slowest = s.index;
  }
  return "pipeline " + FormatMs(p.step_ms - p.data_parallel_exposed_ms) + " + data-parallel all-reduce " +
         FormatMs(p.data_parallel_exposed_ms) + " past the backward (stage " + std::to_string(slowest) + ")";
}

std::string ReportText(const PartitionPlan& p) {
  std::ostringstream os;
  os << "onnxpipe partition: " << (p.model.empty() ? "(model)" : p.model) << "\n";
  os << "device     " << p.device.name << " (" << p.device.source << "): " << FormatBytes(p.device.memory_bytes)
     << ", " << FormatBytes(p.device.reserved_bytes) << " reserved -> " << FormatBytes(p.capacity_bytes)
     << " usable per stage\n";
  os << "config     " << DescribeBatch(p) << (p.stages_auto ? " (auto)" : "") << ", " << ScheduleName(p.schedule)
     << ", recompute " << RecomputePolicyName(p.recompute) << ", " << PrecisionName(p.precision)
     << (p.optimizer.empty() ? "" : ", " + p.optimizer) << "\n";
  os << "cost       " << p.cost.source;
  if (p.cost.source == "profile") os << " (" << p.cost.measured_nodes << " nodes measured, " << p.cost.roofline_nodes << " roofline)";
  os << "\n";
  char line[256];
  const std::string parts = DescribeStepParts(p);
  std::snprintf(line, sizeof(line), "predicted  step %s%s, %.1f samples/s, bubble %s\n\n", FormatMs(p.step_ms).c_str(),
                parts.empty() ? "" : (" = " + parts).c_str(), p.samples_per_s, Percent(p.bubble_fraction).c_str());
  os << line;

  os << "stage " << Pad("fwd", 10) << Pad("bwd", 10) << Pad("recomp", 10) << Pad("params", 11) << Pad("grads", 11)
     << Pad("optim", 11) << Pad("activ", 11) << Pad("x", 4) << Pad("work", 11) << Pad("total", 11) << Pad("use", 8)
     << "  layers\n";
  int worst = 0;
  for (const StagePlan& s : p.stages) {
    const StageMemory& m = s.memory;
    if (m.total > p.stages[worst].memory.total) worst = s.index;
    os << Pad(std::to_string(s.index), 5) << " " << Pad(FormatMs(s.forward_ms), 10) << Pad(FormatMs(s.backward_ms), 10)
       << Pad(FormatMs(s.recompute_ms), 10) << Pad(FormatBytes(m.parameters), 11) << Pad(FormatBytes(m.gradients), 11)
       << Pad(FormatBytes(m.optimizer_state), 11) << Pad(FormatBytes(m.activations), 11)
       << Pad(std::to_string(m.in_flight), 4) << Pad(FormatBytes(m.transient + m.kernel_scratch + m.boundary + m.constants), 11)
       << Pad(FormatBytes(m.total), 11)
       << Pad(Percent(static_cast<double>(m.total) / static_cast<double>(std::max<int64_t>(1, p.capacity_bytes))), 8)
       << "  " << CompressLayers(s.layers) << "\n";
  }
  os << "\n(per micro-batch: fwd, bwd, recomp; activ = saved activations x in-flight micro-batches (x); "
        "work = transient + kernel scratch + constants + boundary buffers)\n";
  const StagePlan& w = p.stages[worst];
  os << "memory     all " << p.stages.size() << " stages fit; the largest is stage " << w.index << " with "
     << FormatBytes(w.memory.total) << " (" << Percent(static_cast<double>(w.memory.total) / p.capacity_bytes)
     << " of " << FormatBytes(p.capacity_bytes) << ")\n";
  for (const StagePlan& s : p.stages) {
    if (p.data_parallel <= 1) break;
    os << "all-reduce stage " << s.index << ": " << FormatBytes(s.data_parallel_bytes) << " of gradients ("
       << s.data_parallel_tensors << " tensors) over " << p.data_parallel << " replicas, "
       << FormatMs(s.data_parallel_allreduce_ms) << " per step, in place (no memory added); "
       << s.data_parallel_buckets << " buckets during the last backward, " << FormatMs(s.data_parallel_exposed_ms)
       << " past it\n";
  }
  for (const StagePlan& s : p.stages) {
    if (s.recompute_regions.empty()) continue;
    os << "recompute  stage " << s.index << ": " << s.recompute_regions.size() << " regions, "
       << FormatMs(s.recompute_ms) << " per micro-batch\n";
  }
  for (const StagePlan& s : p.stages) {
    for (const BoundaryTensor& b : s.boundary_outputs) {
      if (b.kind != "activation") continue;
      std::string dims;
      for (int64_t d : b.dims) dims += (dims.empty() ? "" : "x") + std::to_string(d);
      os << "boundary   stage " << s.index << " -> ";
      for (size_t i = 0; i < b.peers.size(); ++i) os << (i ? "," : "") << b.peers[i];
      os << ": " << b.name << " (" << dims << " " << b.dtype << ", " << FormatBytes(b.bytes) << ")\n";
    }
  }
  // Shared parameters, once each (the lowest holder names the others).
  for (const StagePlan& s : p.stages) {
    for (const BoundaryTensor& b : s.boundary_inputs) {
      if (b.kind != "shared_gradient" || (!b.peers.empty() && b.peers.front() < s.index)) continue;
      os << "shared     " << (b.name.rfind("grad/", 0) == 0 ? b.name.substr(5) : b.name) << " on stages " << s.index;
      for (int32_t k : b.peers) os << ", " << k;
      os << ": parameter, gradient and optimizer state on each, gradient all-reduced once per step ("
         << FormatBytes(b.bytes) << ")\n";
    }
  }
  std::snprintf(line, sizeof(line), "search     %d cut candidates, %d units, %lld DP runs, %d verify rounds, %.3f s\n",
                p.search.cut_candidates, p.search.units, static_cast<long long>(p.search.dp_runs),
                p.search.verify_rounds, p.search.seconds);
  os << line;
  for (const std::string& warning : p.warnings) os << "warning    " << warning << "\n";
  return os.str();
}

std::string PartitionDot(const PartitionPlan& p) {
  auto q = [](const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
      if (c == '\n') {  // a line break in a Graphviz label is the escape \n
        out += "\\n";
        continue;
      }
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    return out + "\"";
  };
  static const char* kColors[] = {"#dbe7f3", "#fde3cc", "#f7d3d4", "#d9efed", "#d8ecd4", "#fbf1cc", "#eadbe7", "#ffe5e8"};
  std::ostringstream os;
  os << "digraph partition {\n  rankdir=LR;\n  compound=true;\n"
     << "  node [shape=box, style=\"rounded,filled\", fillcolor=white, fontname=\"Helvetica\", fontsize=10];\n"
     << "  edge [fontname=\"Helvetica\", fontsize=9];\n"
     << "  label=" << q(Short(p.model) + ": " + std::to_string(p.num_stages) + " stages, " +
                       ScheduleName(p.schedule) + ", step " + FormatMs(p.step_ms))
     << ";\n";
  std::vector<std::string> first(p.stages.size()), last(p.stages.size());
  for (const StagePlan& s : p.stages) {
    os << "  subgraph cluster_" << s.index << " {\n";
    os << "    label=" << q("stage " + std::to_string(s.index) + "\n" + FormatBytes(s.memory.total) + " / " +
                            FormatBytes(p.capacity_bytes) + "\nF " + FormatMs(s.forward_ms) + "  B " +
                            FormatMs(s.backward_ms + s.recompute_ms))
       << ";\n    style=filled; color=\"#888888\"; fillcolor=" << q(kColors[s.index % 8]) << ";\n";
    std::string prev;
    for (size_t i = 0; i < s.layers.size(); ++i) {
      const std::string id = "s" + std::to_string(s.index) + "_" + std::to_string(i);
      os << "    " << id << " [label=" << q(Short(s.layers[i])) << "];\n";
      if (!prev.empty()) os << "    " << prev << " -> " << id << ";\n";
      if (i == 0) first[s.index] = id;
      prev = id;
    }
    last[s.index] = prev;
    os << "  }\n";
  }
  for (const StagePlan& s : p.stages) {
    std::map<int32_t, std::string> labels;
    for (const BoundaryTensor& b : s.boundary_outputs) {
      if (b.kind != "activation") continue;
      std::string dims;
      for (int64_t d : b.dims) dims += (dims.empty() ? "" : "x") + std::to_string(d);
      for (int32_t peer : b.peers) {
        std::string& l = labels[peer];
        l += (l.empty() ? "" : "\n") + b.name + " (" + dims + ", " + FormatBytes(b.bytes) + ")";
      }
    }
    for (const auto& [peer, label] : labels) {
      os << "  " << last[s.index] << " -> " << first[peer] << " [label=" << q(label) << ", ltail=cluster_" << s.index
         << ", lhead=cluster_" << peer << "];\n";
    }
  }
  os << "}\n";
  return os.str();
}

std::string ChromeTraceJson(int32_t num_stages, const std::string& lane1, nlohmann::ordered_json spans,
                            nlohmann::ordered_json other_data) {
  nlohmann::ordered_json events = nlohmann::ordered_json::array();
  for (int32_t s = 0; s < num_stages; ++s) {
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", s}, {"tid", 0},
                      {"args", {{"name", "stage " + std::to_string(s)}}}});
    events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", s}, {"tid", 0}, {"args", {{"sort_index", s}}}});
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", s}, {"tid", 0}, {"args", {{"name", "compute"}}}});
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", s}, {"tid", 1}, {"args", {{"name", lane1}}}});
  }
  for (nlohmann::ordered_json& e : spans) events.push_back(std::move(e));
  nlohmann::ordered_json j;
  j["traceEvents"] = std::move(events);
  j["displayTimeUnit"] = "ms";
  j["otherData"] = std::move(other_data);
  return j.dump(1) + "\n";
}

nlohmann::ordered_json ChromeSpan(const std::string& name, const std::string& category, double start_us, double dur_us,
                                  int32_t stage, int32_t lane, int32_t microbatch) {
  nlohmann::ordered_json ev = {{"name", name},  {"cat", category}, {"ph", "X"},  {"ts", start_us},
                               {"dur", dur_us}, {"pid", stage},    {"tid", lane}};
  if (microbatch >= 0) ev["args"] = {{"microbatch", microbatch}};
  return ev;
}

std::string TimelineTraceJson(const ScheduleResult& timeline, int32_t num_stages, nlohmann::ordered_json other_data) {
  nlohmann::ordered_json spans = nlohmann::ordered_json::array();
  for (const ScheduleEvent& e : timeline.events) {
    std::string name, cat;
    int tid = 0;
    const std::string m = std::to_string(e.microbatch);
    switch (e.kind) {
      case ScheduleEvent::kForward: name = "F" + m; cat = "forward"; break;
      case ScheduleEvent::kBackward: name = "B" + m; cat = "backward"; break;
      case ScheduleEvent::kRecompute: name = "R" + m; cat = "recompute"; break;
      case ScheduleEvent::kOptimizer: name = "optimizer"; cat = "optimizer"; break;
      case ScheduleEvent::kSendForward:
      case ScheduleEvent::kSendBackward:
        name = std::string("send ") + (e.kind == ScheduleEvent::kSendForward ? "F" : "B") + m + " -> " +
               std::to_string(e.peer);
        cat = "transfer";
        tid = 1;
        break;
    }
    spans.push_back(ChromeSpan(name, cat, e.start_s * 1e6, (e.end_s - e.start_s) * 1e6, e.stage, tid, e.microbatch));
  }
  return ChromeTraceJson(num_stages, "transfers", std::move(spans), std::move(other_data));
}

std::string ScheduleTraceJson(const PartitionPlan& p) {
  return TimelineTraceJson(p.timeline, static_cast<int32_t>(p.stages.size()),
                           {{"generator", "onnxpipe partition"},
                            {"model", p.model},
                            {"schedule", ScheduleName(p.schedule)},
                            {"step_ms", p.step_ms},
                            {"bubble_fraction", p.bubble_fraction},
                            {"data_parallel", p.data_parallel},
                            {"data_parallel_allreduce_ms", p.data_parallel_allreduce_ms},
                            {"data_parallel_exposed_ms", p.data_parallel_exposed_ms}});
}

absl::Status WritePlanFiles(const PartitionPlan& plan, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return INVALID_ARGUMENT() << dir << ": cannot create the output folder: " << ec.message();
  RETURN_IF_ERROR(io::WriteFileAtomically(dir + "/plan.json", PlanToJson(plan).dump(2) + "\n"));
  RETURN_IF_ERROR(io::WriteFileAtomically(dir + "/report.txt", ReportText(plan)));
  RETURN_IF_ERROR(io::WriteFileAtomically(dir + "/report.html", ReportHtml(plan)));
  RETURN_IF_ERROR(io::WriteFileAtomically(dir + "/partition.dot", PartitionDot(plan)));
  RETURN_IF_ERROR(io::WriteFileAtomically(dir + "/schedule.trace.json", ScheduleTraceJson(plan)));
  return absl::OkStatus();
}

}  // namespace onnxpipe::partitioner
