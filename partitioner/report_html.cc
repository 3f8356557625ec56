// report.html: one self-contained page (inline CSS and SVG, no script, no external resource) so
// that it opens the same on a login node, in a mail attachment or behind an air gap.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "partitioner/reports.h"

namespace onnxpipe::partitioner {
namespace {

constexpr const char* kStageColors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                        "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
const char* StageColor(int k) { return kStageColors[k % 10]; }

std::string Num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", x);
  return buf;
}

std::string Pct(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%", 100 * x);
  return buf;
}

// A "nice" tick step (1, 2, 5 x 10^k) giving about `count` ticks over `range`.
double TickStep(double range, int count) {
  if (range <= 0) return 1;
  const double raw = range / count;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) return m * mag;
  return 10 * mag;
}

std::string MemorySvg(const PartitionPlan& p) {
  struct Part {
    const char* name;
    const char* color;
    int64_t StageMemory::*field;
  };
  static const Part kParts[] = {
      {"parameters", "#4e79a7", &StageMemory::parameters},
      {"gradients", "#f28e2b", &StageMemory::gradients},
      {"optimizer state", "#e15759", &StageMemory::optimizer_state},
      {"constants", "#bab0ac", &StageMemory::constants},
      {"activations", "#59a14f", &StageMemory::activations},
      {"transient", "#76b7b2", &StageMemory::transient},
      {"kernel scratch", "#edc948", &StageMemory::kernel_scratch},
      {"boundary buffers", "#b07aa1", &StageMemory::boundary},
  };
  const int left = 70, width = 760, bar = 24, gap = 12, top = 30;
  int64_t largest = 0;
  for (const StagePlan& s : p.stages) largest = std::max(largest, s.memory.total);
  // Far below capacity, the bars are drawn to their own scale and the capacity is only named.
  const bool capacity_on_scale = largest * 4 >= p.capacity_bytes;
  const double scale =
      width / (1.08 * static_cast<double>(std::max<int64_t>(1, capacity_on_scale ? std::max(largest, p.capacity_bytes)
                                                                                 : largest)));
  const int rows = static_cast<int>(p.stages.size());
  const int height = top + rows * (bar + gap) + 60;
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" id=\"memory-chart\" width=\"" << left + width + 150
     << "\" height=\"" << height << "\" viewBox=\"0 0 " << left + width + 150 << " " << height << "\">\n";
  for (const StagePlan& s : p.stages) {
    const int y = top + s.index * (bar + gap);
    os << "<text x=\"" << left - 8 << "\" y=\"" << y + bar / 2 + 4 << "\" text-anchor=\"end\">stage " << s.index
       << "</text>\n";
    double x = left;
    for (const Part& part : kParts) {
      const int64_t bytes = s.memory.*(part.field);
      if (bytes <= 0) continue;
      const double w = bytes * scale;
      os << "<rect class=\"mem\" x=\"" << Num(x) << "\" y=\"" << y << "\" width=\"" << Num(std::max(w, 0.5))
         << "\" height=\"" << bar << "\" fill=\"" << part.color << "\"><title>stage " << s.index << " "
         << part.name << ": " << HtmlEscape(FormatBytes(bytes)) << "</title></rect>\n";
      x += w;
    }
    os << "<text x=\"" << Num(x + 6) << "\" y=\"" << y + bar / 2 + 4 << "\">" << HtmlEscape(FormatBytes(s.memory.total))
       << " (" << Pct(static_cast<double>(s.memory.total) / p.capacity_bytes) << ")</text>\n";
  }
  if (capacity_on_scale) {
    const double cx = left + p.capacity_bytes * scale;
    os << "<line x1=\"" << Num(cx) << "\" y1=\"" << top - 12 << "\" x2=\"" << Num(cx) << "\" y2=\""
       << top + rows * (bar + gap) - gap + 6 << "\" stroke=\"#d62728\" stroke-width=\"2\" stroke-dasharray=\"6 3\"/>\n";
    os << "<text x=\"" << Num(cx) << "\" y=\"" << top - 16 << "\" text-anchor=\"middle\" fill=\"#d62728\">capacity "
       << HtmlEscape(FormatBytes(p.capacity_bytes)) << "</text>\n";
  } else {
    os << "<text x=\"" << left << "\" y=\"" << top - 16 << "\" fill=\"#d62728\">capacity "
       << HtmlEscape(FormatBytes(p.capacity_bytes)) << " per stage (off this scale: the most loaded stage uses "
       << Pct(static_cast<double>(largest) / p.capacity_bytes) << ")</text>\n";
  }
  int lx = left;
  const int ly = top + rows * (bar + gap) + 20;
  for (const Part& part : kParts) {
    os << "<rect x=\"" << lx << "\" y=\"" << ly << "\" width=\"12\" height=\"12\" fill=\"" << part.color << "\"/>"
       << "<text x=\"" << lx + 16 << "\" y=\"" << ly + 11 << "\">" << part.name << "</text>\n";
    lx += 18 + 8 * static_cast<int>(std::string(part.name).size()) + 14;
  }
  os << "</svg>\n";
  return os.str();
}

std::string GanttSvg(const PartitionPlan& p) {
  const int left = 70, width = 860, row = 26, lane = 8, top = 16;
  const int rows = static_cast<int>(p.stages.size());
  const double span = std::max(p.timeline.step_s, 1e-12);
  const double scale = width / span;
  const int height = top + rows * (row + lane + 6) + 40;
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" id=\"gantt-chart\" width=\"" << left + width + 20
     << "\" height=\"" << height << "\" viewBox=\"0 0 " << left + width + 20 << " " << height << "\">\n";
  auto row_y = [&](int stage) { return top + stage * (row + lane + 6); };
  for (int s = 0; s < rows; ++s) {
    os << "<rect x=\"" << left << "\" y=\"" << row_y(s) << "\" width=\"" << width << "\" height=\"" << row
       << "\" fill=\"#f4f4f4\"/>\n";
    os << "<text x=\"" << left - 8 << "\" y=\"" << row_y(s) + row / 2 + 4 << "\" text-anchor=\"end\">stage " << s
       << "</text>\n";
  }
  for (const ScheduleEvent& e : p.timeline.events) {
    const double x = left + e.start_s * scale, w = std::max(0.5, (e.end_s - e.start_s) * scale);
    const bool transfer = e.kind == ScheduleEvent::kSendForward || e.kind == ScheduleEvent::kSendBackward;
    const int y = transfer ? row_y(e.stage) + row + 2 : row_y(e.stage);
    const int h = transfer ? lane : row;
    const char* fill = "#4e79a7";
    std::string label;
    switch (e.kind) {
      case ScheduleEvent::kForward: fill = "#4e79a7"; label = "F" + std::to_string(e.microbatch); break;
      case ScheduleEvent::kBackward: fill = "#59a14f"; label = "B" + std::to_string(e.microbatch); break;
      case ScheduleEvent::kRecompute: fill = "#76b7b2"; label = "R" + std::to_string(e.microbatch); break;
      case ScheduleEvent::kOptimizer: fill = "#f28e2b"; label = "optimizer"; break;
      case ScheduleEvent::kSendForward: fill = "#9c755f"; label = "send F" + std::to_string(e.microbatch); break;
      case ScheduleEvent::kSendBackward: fill = "#b07aa1"; label = "send B" + std::to_string(e.microbatch); break;
    }
    os << "<rect class=\"ev\" x=\"" << Num(x) << "\" y=\"" << y << "\" width=\"" << Num(w) << "\" height=\"" << h
       << "\" fill=\"" << fill << "\" stroke=\"white\" stroke-width=\"0.5\"><title>stage " << e.stage << " " << label
       << ": " << HtmlEscape(FormatMs(e.start_s * 1e3)) << " - " << HtmlEscape(FormatMs(e.end_s * 1e3))
       << "</title></rect>\n";
    if (!transfer && w > 8.0 * label.size()) {
      os << "<text x=\"" << Num(x + w / 2) << "\" y=\"" << y + row / 2 + 4 << "\" text-anchor=\"middle\" fill=\"white\">"
         << label << "</text>\n";
    }
  }
  const int axis_y = top + rows * (row + lane + 6) + 4;
  os << "<line x1=\"" << left << "\" y1=\"" << axis_y << "\" x2=\"" << left + width << "\" y2=\"" << axis_y
     << "\" stroke=\"#444\"/>\n";
  const double step = TickStep(span * 1e3, 8);
  for (double t = 0; t <= span * 1e3 + 1e-9; t += step) {
    const double x = left + t / 1e3 * scale;
    os << "<line x1=\"" << Num(x) << "\" y1=\"" << axis_y << "\" x2=\"" << Num(x) << "\" y2=\"" << axis_y + 5
       << "\" stroke=\"#444\"/><text x=\"" << Num(x) << "\" y=\"" << axis_y + 18 << "\" text-anchor=\"middle\">"
       << HtmlEscape(FormatMs(t)) << "</text>\n";
  }
  os << "</svg>\n";
  return os.str();
}

std::string LayerMapSvg(const PartitionPlan& p) {
  const int left = 10, width = 900, cell_h = 28, top = 10;
  const int n = std::max<int>(1, static_cast<int>(p.layers.size()));
  const double cell = static_cast<double>(width) / n;
  std::ostringstream os;
  const int height = top + cell_h + 40;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" id=\"layer-map\" width=\"" << left + width + 10
     << "\" height=\"" << height << "\" viewBox=\"0 0 " << left + width + 10 << " " << height << "\">\n";
  for (size_t i = 0; i < p.layers.size(); ++i) {
    const LayerPlan& l = p.layers[i];
    const double x = left + i * cell;
    const size_t parts = std::max<size_t>(1, l.stages.size());
    for (size_t k = 0; k < parts; ++k) {
      const int stage = l.stages.empty() ? 0 : l.stages[k];
      os << "<rect class=\"layer\" x=\"" << Num(x) << "\" y=\"" << Num(top + k * cell_h / static_cast<double>(parts))
         << "\" width=\"" << Num(std::max(cell - 1, 1.0)) << "\" height=\"" << Num(cell_h / static_cast<double>(parts))
         << "\" fill=\"" << StageColor(stage) << "\"><title>" << HtmlEscape(l.name) << ": stage";
      for (size_t q = 0; q < l.stages.size(); ++q) os << (q ? ", " : " ") << l.stages[q];
      os << "</title></rect>\n";
    }
  }
  // Stage labels under the first layer of each stage.
  for (const StagePlan& s : p.stages) {
    for (size_t i = 0; i < p.layers.size(); ++i) {
      if (std::find(p.layers[i].stages.begin(), p.layers[i].stages.end(), s.index) == p.layers[i].stages.end()) continue;
      os << "<text x=\"" << Num(left + i * cell) << "\" y=\"" << top + cell_h + 16 << "\" fill=\"" << StageColor(s.index)
         << "\">stage " << s.index << "</text>\n";
      break;
    }
  }
  os << "</svg>\n";
  return os.str();
}

}  // namespace

std::string ReportHtml(const PartitionPlan& p) {
  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>onnxpipe partition: "
     << HtmlEscape(p.model) << "</title>\n<style>\n"
     << "body{font-family:Helvetica,Arial,sans-serif;margin:24px;color:#222;background:#fff}\n"
     << "h1{font-size:20px}h2{font-size:16px;margin-top:28px}\n"
     << "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}\n"
     << "th{background:#eee}td.l{text-align:left}.chart text{font-size:11px;font-family:Helvetica,Arial,sans-serif}\n"
     << ".summary td{border:none;text-align:left;padding:1px 12px 1px 0}.warn{color:#a33}\n"
     << "</style>\n</head>\n<body>\n";
  os << "<h1>onnxpipe partition: " << HtmlEscape(p.model) << "</h1>\n<table class=\"summary\">\n";
  os << "<tr><td>device</td><td>" << HtmlEscape(p.device.name) << " (" << HtmlEscape(FormatBytes(p.device.memory_bytes))
     << ", " << HtmlEscape(FormatBytes(p.capacity_bytes)) << " usable per stage)</td></tr>\n";
  os << "<tr><td>configuration</td><td>" << HtmlEscape(DescribeBatch(p)) << (p.stages_auto ? " (auto)" : "") << ", "
     << ScheduleName(p.schedule) << ", recompute " << RecomputePolicyName(p.recompute) << ", "
     << PrecisionName(p.precision) << (p.optimizer.empty() ? "" : ", " + HtmlEscape(p.optimizer)) << "</td></tr>\n";
  const std::string parts = DescribeStepParts(p);
  os << "<tr><td>predicted step</td><td id=\"step\">" << HtmlEscape(FormatMs(p.step_ms))
     << (parts.empty() ? "" : " = " + HtmlEscape(parts)) << ", " << Num(p.samples_per_s) << " samples/s, bubble "
     << Pct(p.bubble_fraction) << "</td></tr>\n";
  if (p.data_parallel > 1) {
    os << "<tr><td>data parallel</td><td>each stage's gradients all-reduced in place over its " << p.data_parallel
       << " replicas after its backward (no memory added; the stage table's all-reduce column)</td></tr>\n";
  }
  os << "<tr><td>cost model</td><td>" << HtmlEscape(p.cost.source) << "</td></tr>\n</table>\n";
  for (const std::string& w : p.warnings) os << "<p class=\"warn\">" << HtmlEscape(w) << "</p>\n";

  os << "<h2>Memory per stage</h2>\n" << MemorySvg(p);
  os << "<h2>Schedule (one step)</h2>\n" << GanttSvg(p);
  os << "<p>F = forward, B = backward (with recompute), optimizer = the step's update; the thin lanes are "
        "transfers to the neighbouring stages.</p>\n";
  os << "<h2>Layers and stages</h2>\n" << LayerMapSvg(p);

  os << "<h2>Stages</h2>\n<table>\n<tr><th>stage</th><th>layers</th><th>forward</th><th>backward</th>"
        "<th>recompute</th><th>parameters</th><th>gradients</th><th>optimizer</th><th>activations</th>"
        "<th>in flight</th><th>transient</th><th>kernel scratch</th><th>total</th><th>use</th>"
     << (p.data_parallel > 1 ? "<th>all-reduce</th>" : "") << "</tr>\n";
  for (const StagePlan& s : p.stages) {
    const StageMemory& m = s.memory;
    os << "<tr><td>" << s.index << "</td><td class=\"l\">" << HtmlEscape(CompressLayers(s.layers)) << "</td><td>"
       << HtmlEscape(FormatMs(s.forward_ms)) << "</td><td>" << HtmlEscape(FormatMs(s.backward_ms)) << "</td><td>"
       << HtmlEscape(FormatMs(s.recompute_ms)) << "</td><td>" << HtmlEscape(FormatBytes(m.parameters)) << "</td><td>"
       << HtmlEscape(FormatBytes(m.gradients)) << "</td><td>" << HtmlEscape(FormatBytes(m.optimizer_state))
       << "</td><td>" << HtmlEscape(FormatBytes(m.activations)) << "</td><td>" << m.in_flight << "</td><td>"
       << HtmlEscape(FormatBytes(m.transient)) << "</td><td>" << HtmlEscape(FormatBytes(m.kernel_scratch))
       << "</td><td>" << HtmlEscape(FormatBytes(m.total)) << "</td><td>"
       << Pct(static_cast<double>(m.total) / p.capacity_bytes) << "</td>";
    if (p.data_parallel > 1) os << "<td>" << HtmlEscape(FormatMs(s.data_parallel_allreduce_ms)) << "</td>";
    os << "</tr>\n";
  }
  os << "</table>\n";
  os << "<h2>Layer table</h2>\n<table>\n<tr><th>layer</th><th>stage</th><th>forward</th><th>backward</th>"
        "<th>parameters</th></tr>\n";
  for (const LayerPlan& l : p.layers) {
    std::string stages;
    for (int32_t k : l.stages) stages += (stages.empty() ? "" : ", ") + std::to_string(k);
    os << "<tr><td class=\"l\">" << HtmlEscape(l.name) << "</td><td>" << stages << "</td><td>"
       << HtmlEscape(FormatMs(l.forward_ms)) << "</td><td>" << HtmlEscape(FormatMs(l.backward_ms)) << "</td><td>"
       << HtmlEscape(FormatBytes(l.parameter_bytes)) << "</td></tr>\n";
  }
  os << "</table>\n<p>Generated by onnxpipe partition. Search: " << p.search.cut_candidates << " cut candidates, "
     << p.search.units << " units, " << p.search.dp_runs << " DP runs, " << Num(p.search.seconds * 1e3)
     << " ms.</p>\n</body>\n</html>\n";
  return os.str();
}

}  // namespace onnxpipe::partitioner
