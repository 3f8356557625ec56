// The sweep table: points, CSV and a self-contained HTML chart.
#include "partitioner/sweep.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "frontend/ir/status.h"
#include "partitioner/reports.h"

namespace onnxpipe::partitioner {
namespace {

constexpr const char* kSeriesColors[] = {"#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2",
                                         "#edc948", "#9c755f", "#ff9da7", "#bab0ac", "#e15759"};

std::string Fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, x);
  return buf;
}

}  // namespace

absl::StatusOr<SweepSpec> ParseSweepSpec(const std::string& spec) {
  SweepSpec s;
  std::istringstream is(spec);
  std::string item;
  std::set<std::string> seen;
  while (is >> item) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      return INVALID_ARGUMENT() << "--sweep: '" << item
                                << "' is not KEY=V1,V2,... (keys: batch, microbatches, stages, data_parallel)";
    }
    const std::string key = item.substr(0, eq);
    std::vector<int64_t>* out = nullptr;
    if (key == "batch") out = &s.batches;
    if (key == "microbatches") out = &s.microbatches;
    if (key == "stages") out = &s.stages;
    if (key == "data_parallel") {
      out = &s.data_parallel;
      out->clear();  // replaces the default {1}
    }
    if (!out) {
      return INVALID_ARGUMENT() << "--sweep: unknown key '" << key
                                << "'; expected batch, microbatches, stages or data_parallel";
    }
    if (!seen.insert(key).second) return INVALID_ARGUMENT() << "--sweep: '" << key << "' is given twice";
    std::istringstream vs(item.substr(eq + 1));
    std::string v;
    while (std::getline(vs, v, ',')) {
      char* end = nullptr;
      const long long x = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || x < 1) {
        return INVALID_ARGUMENT() << "--sweep: '" << key << "' value '" << v << "' is not a positive integer";
      }
      out->push_back(x);
    }
    if (out->empty()) return INVALID_ARGUMENT() << "--sweep: '" << key << "' has no values";
  }
  if (s.batches.empty() || s.microbatches.empty() || s.stages.empty()) {
    return INVALID_ARGUMENT() << "--sweep needs batch=..., microbatches=... and stages=... (e.g. \"batch=32,64 "
                                 "microbatches=1,2,4 stages=2,4\")";
  }
  return s;
}

namespace {

SweepRow Row(int64_t batch, int64_t microbatches, int64_t stages, int64_t data_parallel, const std::string& why) {
  SweepRow r;
  r.batch = batch;
  r.microbatches = microbatches;
  r.stages = stages;
  r.data_parallel = data_parallel;
  r.microbatch_size = microbatches * data_parallel > 0 ? batch / (microbatches * data_parallel) : 0;
  r.status = "invalid";
  r.note = why;
  return r;
}

}  // namespace

std::optional<SweepRow> InvalidSweepRow(int64_t batch, int64_t microbatches, int64_t stages, int64_t data_parallel) {
  const int64_t parts = microbatches * data_parallel;
  const std::string by = data_parallel > 1 ? "micro-batches x data-parallel replicas" : "micro-batches";
  if (parts > batch) return Row(batch, microbatches, stages, data_parallel, "more " + by + " than samples");
  if (batch % parts != 0) return Row(batch, microbatches, stages, data_parallel, "batch not divisible by " + by);
  return std::nullopt;
}

SweepRow SweepPoint(const PartitionContext& ctx, const PartitionOptions& base, int64_t batch, int64_t microbatches,
                    int64_t stages, int64_t data_parallel) {
  PartitionOptions o = base;
  o.batch = batch;
  o.microbatches = microbatches;
  o.num_stages = stages;
  o.data_parallel = data_parallel;
  SweepRow r = Row(batch, microbatches, stages, data_parallel, /*why=*/"");
  auto fill = [&](const PartitionPlan& p) {
    r.step_ms = p.step_ms;
    r.samples_per_s = p.samples_per_s;
    r.bubble_fraction = p.bubble_fraction;
    for (const StagePlan& s : p.stages) {
      r.stage_memory.push_back(s.memory.total);
      r.max_stage_memory = std::max(r.max_stage_memory, s.memory.total);
    }
  };
  absl::StatusOr<PartitionPlan> plan = Partition(ctx, o);
  if (plan.ok()) {
    r.status = "ok";
    fill(*plan);
    return r;
  }
  if (plan.status().code() != absl::StatusCode::kResourceExhausted) {
    r.note = std::string(plan.status().message());
    return r;
  }
  // Out of memory: what the fastest split would need.
  r.status = "oom";
  PartitionOptions unbounded = o;
  unbounded.memory_bytes = int64_t{1} << 60;
  absl::StatusOr<PartitionPlan> any = Partition(ctx, unbounded);
  if (any.ok()) {
    fill(*any);
    r.note = "needs " + FormatBytes(r.max_stage_memory) + " on its most loaded stage";
  } else {
    r.note = std::string(plan.status().message());
  }
  return r;
}

std::string SweepCsv(const std::vector<SweepRow>& rows, int64_t capacity) {
  std::ostringstream os;
  os << "batch,microbatches,stages,data_parallel,microbatch_size,status,step_ms,samples_per_s,bubble_fraction,"
        "max_stage_memory_bytes,capacity_bytes,stage_memory_bytes,note\n";
  for (const SweepRow& r : rows) {
    std::string mem;
    for (int64_t m : r.stage_memory) mem += (mem.empty() ? "" : ";") + std::to_string(m);
    std::string note = r.note;
    std::replace(note.begin(), note.end(), '"', '\'');
    os << r.batch << "," << r.microbatches << "," << r.stages << "," << r.data_parallel << "," << r.microbatch_size
       << "," << r.status << "," << Fmt("%.4f", r.step_ms) << "," << Fmt("%.2f", r.samples_per_s) << ","
       << Fmt("%.4f", r.bubble_fraction) << "," << r.max_stage_memory << "," << capacity << "," << mem << ",\"" << note
       << "\"\n";
  }
  return os.str();
}

std::string SweepHtml(const std::vector<SweepRow>& rows, const std::string& model, const DeviceProfile& device,
                      int64_t capacity, const std::string& config) {
  std::set<int64_t> batch_set, mb_set;
  std::set<std::pair<int64_t, int64_t>> charts;  // (stages, data-parallel replicas)
  for (const SweepRow& r : rows) {
    charts.insert({r.stages, r.data_parallel});
    batch_set.insert(r.batch);
    mb_set.insert(r.microbatches);
  }
  const std::vector<int64_t> batches(batch_set.begin(), batch_set.end());
  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>onnxpipe sweep: "
     << HtmlEscape(model) << "</title>\n<style>\nbody{font-family:Helvetica,Arial,sans-serif;margin:24px;color:#222}"
     << "h1{font-size:20px}h2{font-size:16px}table{border-collapse:collapse;font-size:13px}"
     << "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#eee}tr.oom td{color:#c00}"
     << "tr.invalid td{color:#888}svg text{font-size:11px}\n</style>\n</head>\n<body>\n";
  os << "<h1>onnxpipe sweep: " << HtmlEscape(model) << "</h1>\n<p>" << HtmlEscape(device.name) << ", "
     << HtmlEscape(FormatBytes(capacity)) << " usable per stage; " << HtmlEscape(config)
     << ". Predicted before any run; OOM = the fastest split does not fit.</p>\n";
  const int left = 70, width = 520, height = 220, top = 20;
  auto x_of = [&](int64_t batch) {
    const size_t i = std::find(batches.begin(), batches.end(), batch) - batches.begin();
    return left + (batches.size() <= 1 ? width / 2.0 : width * static_cast<double>(i) / (batches.size() - 1));
  };
  for (const auto& [k, d] : charts) {
    const std::string title = std::to_string(k) + " stages" + (d > 1 ? " x " + std::to_string(d) + " replicas" : "");
    auto in_chart = [&](const SweepRow& r) { return r.stages == k && r.data_parallel == d; };
    for (int chart = 0; chart < 2; ++chart) {
      double ymax = chart == 0 ? 0 : static_cast<double>(capacity);
      for (const SweepRow& r : rows) {
        if (!in_chart(r) || r.status == "invalid") continue;
        ymax = std::max(ymax, chart == 0 ? r.samples_per_s : static_cast<double>(r.max_stage_memory));
      }
      if (ymax <= 0) ymax = 1;
      ymax *= 1.1;
      auto y_of = [&](double v) { return top + height - height * v / ymax; };
      os << "<h2>" << title << ": " << (chart == 0 ? "throughput (samples/s)" : "memory of the most loaded stage")
         << "</h2>\n<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"sweep\" width=\"" << left + width + 160
         << "\" height=\"" << top + height + 40 << "\">\n";
      os << "<line x1=\"" << left << "\" y1=\"" << top + height << "\" x2=\"" << left + width << "\" y2=\"" << top + height
         << "\" stroke=\"#444\"/><line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left << "\" y2=\""
         << top + height << "\" stroke=\"#444\"/>\n";
      for (int t = 0; t <= 4; ++t) {
        const double v = ymax / 1.1 * t / 4;
        os << "<text x=\"" << left - 6 << "\" y=\"" << Fmt("%.1f", y_of(v) + 4) << "\" text-anchor=\"end\">"
           << HtmlEscape(chart == 0 ? Fmt("%.0f", v) : FormatBytes(static_cast<int64_t>(v))) << "</text>\n";
      }
      for (int64_t b : batches) {
        os << "<text x=\"" << Fmt("%.1f", x_of(b)) << "\" y=\"" << top + height + 16 << "\" text-anchor=\"middle\">" << b
           << "</text>\n";
      }
      os << "<text x=\"" << left + width / 2 << "\" y=\"" << top + height + 34 << "\" text-anchor=\"middle\">batch</text>\n";
      if (chart == 1) {
        os << "<line x1=\"" << left << "\" y1=\"" << Fmt("%.1f", y_of(capacity)) << "\" x2=\"" << left + width
           << "\" y2=\"" << Fmt("%.1f", y_of(capacity)) << "\" stroke=\"#d62728\" stroke-dasharray=\"6 3\"/>"
           << "<text x=\"" << left + width + 4 << "\" y=\"" << Fmt("%.1f", y_of(capacity) + 4)
           << "\" fill=\"#d62728\">capacity</text>\n";
      }
      int series = 0;
      for (int64_t m : mb_set) {
        const char* color = kSeriesColors[series % 10];
        std::string points;
        for (const SweepRow& r : rows) {
          if (!in_chart(r) || r.microbatches != m || r.status != "ok") continue;
          const double v = chart == 0 ? r.samples_per_s : static_cast<double>(r.max_stage_memory);
          points += Fmt("%.1f", x_of(r.batch)) + "," + Fmt("%.1f", y_of(v)) + " ";
        }
        if (!points.empty()) {
          os << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\" points=\"" << points << "\"/>\n";
        }
        for (const SweepRow& r : rows) {
          if (!in_chart(r) || r.microbatches != m || r.status == "invalid") continue;
          const double v = chart == 0 ? r.samples_per_s : static_cast<double>(r.max_stage_memory);
          const double x = x_of(r.batch), y = y_of(v);
          if (r.status == "ok") {
            os << "<circle class=\"ok\" cx=\"" << Fmt("%.1f", x) << "\" cy=\"" << Fmt("%.1f", y) << "\" r=\"3.5\" fill=\""
               << color << "\"><title>batch " << r.batch << ", " << m << " micro-batches: "
               << Fmt("%.1f", r.samples_per_s) << " samples/s, " << HtmlEscape(FormatBytes(r.max_stage_memory))
               << "</title></circle>\n";
          } else {
            os << "<g class=\"oom\"><title>batch " << r.batch << ", " << m << " micro-batches: OOM, "
               << HtmlEscape(r.note) << "</title><path d=\"M" << Fmt("%.1f", x - 5) << " " << Fmt("%.1f", y - 5) << " L"
               << Fmt("%.1f", x + 5) << " " << Fmt("%.1f", y + 5) << " M" << Fmt("%.1f", x - 5) << " "
               << Fmt("%.1f", y + 5) << " L" << Fmt("%.1f", x + 5) << " " << Fmt("%.1f", y - 5)
               << "\" stroke=\"#d62728\" stroke-width=\"2\"/></g>\n";
          }
        }
        os << "<rect x=\"" << left + width + 20 << "\" y=\"" << top + series * 16 << "\" width=\"10\" height=\"10\" fill=\""
           << color << "\"/><text x=\"" << left + width + 34 << "\" y=\"" << top + series * 16 + 9 << "\">M = " << m
           << "</text>\n";
        ++series;
      }
      os << "<text x=\"" << left + width + 20 << "\" y=\"" << top + series * 16 + 9 << "\" fill=\"#d62728\">x = OOM</text>\n";
      os << "</svg>\n";
    }
  }
  os << "<h2>All points</h2>\n<table>\n<tr><th>batch</th><th>micro-batches</th><th>stages</th><th>replicas</th>"
        "<th>status</th><th>step</th><th>samples/s</th><th>bubble</th><th>most loaded stage</th><th>note</th></tr>\n";
  for (const SweepRow& r : rows) {
    os << "<tr class=\"" << r.status << "\"><td>" << r.batch << "</td><td>" << r.microbatches << "</td><td>" << r.stages
       << "</td><td>" << r.data_parallel << "</td><td>" << r.status << "</td><td>"
       << (r.status == "invalid" ? "" : HtmlEscape(FormatMs(r.step_ms))) << "</td><td>"
       << (r.status == "invalid" ? "" : Fmt("%.1f", r.samples_per_s)) << "</td><td>"
       << (r.status == "invalid" ? "" : Fmt("%.1f%%", 100 * r.bubble_fraction)) << "</td><td>"
       << (r.status == "invalid" ? "" : HtmlEscape(FormatBytes(r.max_stage_memory)))
       << "</td><td style=\"text-align:left\">" << HtmlEscape(r.note) << "</td></tr>\n";
  }
  os << "</table>\n</body>\n</html>\n";
  return os.str();
}

}  // namespace onnxpipe::partitioner
