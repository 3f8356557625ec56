// report.html of `onnxpipe train --report`: self-contained (inline SVG, no script, no network), the
// measured timeline under the predicted one and the per-stage memory, measured against predicted.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "executor/pipeline/report.h"
#include "nlohmann/json.hpp"
#include "partitioner/reports.h"

namespace onnxpipe::pipeline {
namespace {

using partitioner::HtmlEscape;

struct Bar {
  int stage = 0, lane = 0;
  std::string name;
  double start = 0, dur = 0;
};

// A JSON number with three decimals (integers as they are).
std::string Num(const nlohmann::ordered_json& v) {
  if (!v.is_number_float()) return v.dump();
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", v.get<double>());
  return buf;
}

std::vector<Bar> BarsOfTrace(const nlohmann::json& trace) {
  std::vector<Bar> bars;
  if (!trace.contains("traceEvents")) return bars;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    bars.push_back({e.value("pid", 0), e.value("tid", 0), e.value("name", ""), e.value("ts", 0.0), e.value("dur", 0.0)});
  }
  return bars;
}

std::string Gantt(const std::string& title, const std::vector<Bar>& bars, int32_t stages) {
  double end = 0;
  for (const Bar& b : bars) end = std::max(end, b.start + b.dur);
  if (end <= 0) end = 1;
  const int width = 900, row = 34, left = 70;
  std::ostringstream os;
  char ms[32];
  std::snprintf(ms, sizeof(ms), "%.3f", end / 1000.0);
  os << "<h3>" << HtmlEscape(title) << " — " << ms << " ms</h3>\n";
  os << "<svg width=\"" << width + left + 10 << "\" height=\"" << stages * row + 20 << "\" font-size=\"10\">\n";
  for (int32_t s = 0; s < stages; ++s) {
    os << "<text x=\"2\" y=\"" << s * row + 20 << "\">stage " << s << "</text>\n";
    os << "<line x1=\"" << left << "\" x2=\"" << left + width << "\" y1=\"" << s * row + row - 2 << "\" y2=\""
       << s * row + row - 2 << "\" stroke=\"#ddd\"/>\n";
  }
  for (const Bar& b : bars) {
    const double x = left + b.start / end * width, w = std::max(0.5, b.dur / end * width);
    const char* fill = b.lane == 1 ? "#e06666" : b.name.rfind("F", 0) == 0 ? "#6fa8dc" : b.name.rfind("B", 0) == 0 ? "#93c47d" : "#999";
    const int y = b.stage * row + (b.lane == 1 ? 24 : 4), h = b.lane == 1 ? 6 : 18;
    os << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << w << "\" height=\"" << h << "\" fill=\"" << fill
       << "\"><title>" << HtmlEscape(b.name) << ": " << b.dur / 1000.0 << " ms</title></rect>\n";
    if (b.lane == 0 && w > 14) {
      os << "<text x=\"" << x + 2 << "\" y=\"" << y + 13 << "\" fill=\"white\">" << HtmlEscape(b.name) << "</text>\n";
    }
  }
  os << "</svg>\n";
  return os.str();
}

}  // namespace

std::string RunReportHtml(const nlohmann::ordered_json& measured, const std::string& measured_trace,
                          const std::string& predicted_trace) {
  const int32_t K = measured["config"]["num_stages"].get<int32_t>();
  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>onnxpipe pipelined run</title>\n"
     << "<style>body{font-family:sans-serif;margin:20px}table{border-collapse:collapse}"
     << "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}</style></head><body>\n";
  os << "<h2>Pipelined run: " << HtmlEscape(measured.value("model", "")) << "</h2>\n<p>" << K << " stages, "
     << measured["config"]["microbatches"] << " micro-batches of " << measured["config"]["microbatch_size"] << ", "
     << HtmlEscape(measured["config"]["schedule"].get<std::string>()) << "; measured step "
     << Num(measured["measured"]["step_ms"]) << " ms (" << Num(measured["measured"]["samples_per_s"])
     << " samples/s, mean over the steps after the first).</p>\n";
  os << "<h3>Memory per stage (bytes): high-water measured | planned</h3>\n<table><tr><th>stage</th>"
     << "<th>saved / micro-batch</th><th>in flight</th><th>activations</th><th>arena</th><th>accumulators</th>"
     << "<th>kernel scratch</th><th>fwd ms</th><th>bwd ms</th></tr>\n";
  for (const auto& s : measured["stages"]) {
    const auto& m = s["measured"]["memory"];
    const auto& p = s["predicted"]["memory"];
    os << "<tr><td>" << s["index"] << "</td>";
    for (const char* k : {"saved_per_microbatch", "in_flight", "activations", "arena", "accumulators", "kernel_scratch"}) {
      os << "<td>" << m[k] << " | " << p[k] << "</td>";
    }
    os << "<td>" << Num(s["measured"]["forward_ms"]) << "</td><td>" << Num(s["measured"]["backward_ms"])
       << "</td></tr>\n";
  }
  os << "</table>\n";
  const nlohmann::json pt = nlohmann::json::parse(predicted_trace, nullptr, /*allow_exceptions=*/false);
  const nlohmann::json mt = nlohmann::json::parse(measured_trace, nullptr, /*allow_exceptions=*/false);
  os << Gantt("Predicted (" + measured["predicted"].value("source", std::string("?")) + ")",
              pt.is_discarded() ? std::vector<Bar>{} : BarsOfTrace(pt), K);
  os << Gantt("Measured (last step; red: waiting for a receive)", mt.is_discarded() ? std::vector<Bar>{} : BarsOfTrace(mt), K);
  os << "<p>F: forward, B: backward (recompute included), O: optimizer step.</p>\n</body></html>\n";
  return os.str();
}

}  // namespace onnxpipe::pipeline
