// `onnxpipe partition` and `onnxpipe profile` on models exported at test time: balance of a
// uniform 24-layer model, stage 0 of an embedding-heavy model, every report file written and read
// back by an independent reader (onnx.checker for the stage files, Graphviz for the DOT file,
// headless Chromium and Pillow for the HTML), tied weights against what `train --plan` measures,
// the sweep, the profile round trip, and the error contract.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "frontend/onnx/loader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "partitioner/device.h"
#include "partitioner/plan_io.h"
#include "tests/cli/cli_util.h"

namespace onnxpipe::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

class PartitionCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(MakeTempDir("partition_cli"));
    // Small widths keep the export fast; the layer structure is the benchmark's.
    Export("uniform24", "--family classifier --layers 24 --d-model 32 --heads 2 --ffn 128 --seq 16 --vocab 64");
    Export("embed", "--family classifier --layers 12 --d-model 32 --heads 2 --ffn 64 --seq 16 --vocab 50000");
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static void Export(const std::string& name, const std::string& flags) {
    const CommandResult r =
        RunCommand(Python() + " " + SourcePath("models/export.py") + " " + flags + " --out " + Path(name + ".onnx"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static std::string Path(const std::string& name) { return (*dir_ / name).string(); }
  static CommandResult Partition(const std::string& args) { return RunCommand(Onnxpipe() + " partition " + args); }
  static json Plan(const std::string& out) { return json::parse(ReadAll(out + "/plan.json")); }

  static std::filesystem::path* dir_;
};
std::filesystem::path* PartitionCli::dir_ = nullptr;

double StageMs(const json& stage) {
  const json& p = stage["predicted"];
  return p["forward_ms"].get<double>() + p["backward_ms"].get<double>() + p["recompute_ms"].get<double>();
}

// Layers ("…/layers.N") whose forward nodes all sit on stage `k`.
int WholeLayersOn(const json& plan, int k) {
  static const std::regex layer(R"(.*layers\.\d+$)");
  int n = 0;
  for (const json& l : plan["layers"]) {
    if (!std::regex_match(l["name"].get<std::string>(), layer)) continue;
    if (l["stages"].size() == 1 && l["stages"][0] == k) ++n;
  }
  return n;
}

TEST_F(PartitionCli, Uniform24LayersSplitWithinFivePercentOfIdeal) {
  const std::string out = Path("u24");
  const CommandResult r = Partition(Path("uniform24.onnx") +
                                    " --stages 4 --batch 32 --microbatches 8 --seq 16 "
                                    "--device h100-80gb --no-onnx --out " +
                                    out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json plan = Plan(out);
  ASSERT_EQ(plan["stages"].size(), 4u);
  double total = 0, worst = 0;
  for (const json& s : plan["stages"]) {
    total += StageMs(s);
    worst = std::max(worst, StageMs(s));
  }
  EXPECT_LE(worst, 1.05 * total / 4) << r.out;
  // Every layer is whole on one stage or split between two neighbours; 24 layers, 5-7 per stage.
  for (int k = 0; k < 4; ++k) {
    EXPECT_GE(WholeLayersOn(plan, k), 4) << "stage " << k << "\n" << r.out;
    EXPECT_LE(WholeLayersOn(plan, k), 7) << "stage " << k << "\n" << r.out;
  }
}

TEST_F(PartitionCli, EmbeddingHeavyModelGivesStageZeroFewerLayers) {
  // A 50000 x 32 embedding with AdamW (parameters, gradients and two moments: 25.6 MB) next to
  // layers of 12.7 K parameters: with the device barely larger than a quarter of the model,
  // stage 0 must take fewer than its share of the 12 layers.
  const std::string loose = Path("embed_loose");
  CommandResult r = Partition(Path("embed.onnx") +
                              " --stages 4 --batch 64 --microbatches 4 --seq 16 --optimizer adamw "
                              "--device h100-80gb --no-onnx --out " +
                              loose);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json base = Plan(loose);
  int64_t largest = 0;
  for (const json& s : base["stages"]) largest = std::max(largest, s["memory"]["total"].get<int64_t>());
  // Memory that fits the embedding plus a little: a third over the embedding stage's persistent
  // state (parameters, gradients, two moments: 4 embedding-sized buffers; with 4 micro-batches the
  // later ones' embedding gradient needs one more before it is added into its accumulator).
  const json& s0 = base["stages"][0]["memory"];
  const int64_t persistent0 =
      s0["parameters"].get<int64_t>() + s0["gradients"].get<int64_t>() + s0["optimizer_state"].get<int64_t>();
  const int64_t device = persistent0 + persistent0 / 3 + (int64_t{1} << 30);  // + the 1 GiB reserve
  const std::string tight = Path("embed_tight");
  r = Partition(Path("embed.onnx") +
                " --stages 4 --batch 64 --microbatches 4 --seq 16 --optimizer adamw "
                "--device h100-80gb --device-memory " +
                std::to_string(device) + " --no-onnx --out " + tight);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const json plan = Plan(tight);
  EXPECT_LT(WholeLayersOn(plan, 0), 3) << r.out;
  // The later stages take the rest: at least 10 layers touch no part of stage 0 (cuts inside a
  // layer between later stages are fine).
  int later = 0;
  for (const json& l : plan["layers"]) {
    if (!std::regex_match(l["name"].get<std::string>(), std::regex(R"(.*layers\.\d+$)"))) continue;
    if (std::none_of(l["stages"].begin(), l["stages"].end(), [](const json& k) { return k == 0; })) ++later;
  }
  EXPECT_GE(later, 10) << r.out;
  for (const json& s : plan["stages"]) {
    EXPECT_LE(s["memory"]["total"].get<int64_t>(), plan["device"]["capacity"].get<int64_t>());
  }
}

TEST_F(PartitionCli, EveryReportFileIsWrittenAndReadsBack) {
  const std::string out = Path("tiny");
  const std::string model = SourcePath("models/tiny_classifier.onnx");
  const CommandResult r = Partition(model +
                                    " --stages 2 --batch 8 --microbatches 4 --seq 32 --recompute selective "
                                    "--schedule 1f1b --device a100-40gb --out " +
                                    out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* f : {"plan.json", "report.txt", "report.html", "partition.dot", "schedule.trace.json",
                        "stage_0.onnx", "stage_1.onnx"}) {
    EXPECT_TRUE(std::filesystem::exists(out + "/" + f)) << f;
  }
  // plan.json: the fields issue 6 lists, by name, then the strict loader.
  const json pj = Plan(out);
  EXPECT_EQ(pj["schema_version"], 3);
  // A GPU target: its kernel scratch needs the device, and the plan says it did not count it.
  EXPECT_FALSE(pj["config"]["kernel_scratch_counted"].get<bool>());
  for (const json& st : pj["stages"]) EXPECT_EQ(st["memory"]["kernel_scratch"], 0);
  for (const char* k : {"step_ms", "bubble_fraction", "samples_per_s"})
    EXPECT_TRUE(pj["predicted"][k].is_number()) << k;
  for (const json& st : pj["stages"]) {
    for (const char* k : {"index", "nodes", "parameters", "boundary_inputs", "boundary_outputs", "recompute_regions"}) {
      EXPECT_TRUE(st.contains(k)) << k;
    }
    for (const char* k :
         {"parameters", "gradients", "optimizer_state", "activations", "transient", "kernel_scratch", "total"}) {
      EXPECT_TRUE(st["memory"][k].is_number_integer()) << k;
    }
    for (const char* k : {"forward_ms", "backward_ms", "recompute_ms"})
      EXPECT_TRUE(st["predicted"][k].is_number()) << k;
    for (const char* side : {"boundary_inputs", "boundary_outputs"}) {
      for (const json& b : st[side]) {
        EXPECT_TRUE(b["shape"].is_array()) << side;
        EXPECT_TRUE(b["bytes"].is_number_integer()) << side;
      }
    }
  }
  absl::StatusOr<partitioner::PartitionPlan> plan = partitioner::LoadPlan(out);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages.size(), 2u);
  EXPECT_EQ(plan->microbatch_size, 2);
  EXPECT_GT(plan->stages[0].recompute_regions.size(), 0u);
  // report.txt: one row per stage and the prediction.
  const std::string txt = ReadAll(out + "/report.txt");
  EXPECT_THAT(txt, HasSubstr("samples/s"));
  EXPECT_THAT(txt, HasSubstr("a100-40gb"));
  // schedule.trace.json: Chrome trace of the stages' action lists, one process per stage: F of each
  // of the 4 micro-batches, its backward (in parts around the recompute regions) and the update.
  const json trace = json::parse(ReadAll(out + "/schedule.trace.json"));
  std::map<std::string, int> count;  // by category
  std::set<std::pair<int, std::string>> backward;
  std::set<int> pids;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "X" && e["tid"] == 0) {
      ++count[e["cat"].get<std::string>()];
      pids.insert(e["pid"].get<int>());
      if (e["cat"] == "backward") backward.insert({e["pid"].get<int>(), e["name"].get<std::string>()});
      EXPECT_GE(e["dur"].get<double>(), 0);
    }
  }
  EXPECT_EQ(count["forward"], 2 * 4);
  EXPECT_EQ(count["optimizer"], 2);
  EXPECT_EQ(backward.size(), 2u * 4u);  // B0..B3 on both stages
  EXPECT_GT(count["recompute"], 0);     // --recompute selective: the regions run as R actions
  size_t actions = 0;
  for (const json& st : pj["stages"]) actions += st["actions"].size();
  EXPECT_EQ(static_cast<size_t>(count["forward"] + count["backward"] + count["recompute"] + count["optimizer"]),
            actions - 2 * 4 * 2);  // the rest: one send and one receive per micro-batch and stage
  EXPECT_EQ(pids, (std::set<int>{0, 1}));
  // partition.dot: Graphviz renders it (scripts/setup.sh installs graphviz; missing is a failure).
  const std::string dot = ReadAll(out + "/partition.dot");
  EXPECT_THAT(dot, HasSubstr("subgraph cluster_0"));
  EXPECT_THAT(dot, HasSubstr("subgraph cluster_1"));
  ASSERT_EQ(RunCommand("command -v dot").exit_code, 0) << "Graphviz `dot` is missing (scripts/setup.sh installs it)";
  const CommandResult d = RunCommand("dot -Tsvg " + out + "/partition.dot -o " + out + "/partition.svg");
  EXPECT_EQ(d.exit_code, 0) << d.err;
  const std::string svg = ReadAll(out + "/partition.svg");
  EXPECT_THAT(svg, HasSubstr("<svg"));
  EXPECT_THAT(svg, HasSubstr("cluster_1"));
  // stage_<k>.onnx: the ONNX checker (python onnx), full check with shape inference, and our loader.
  for (int k = 0; k < 2; ++k) {
    const std::string stage = out + "/stage_" + std::to_string(k) + ".onnx";
    const CommandResult c = RunCommand(Python() +
                                       " -c \"import onnx,sys; m=onnx.load(sys.argv[1]); "
                                       "onnx.checker.check_model(m, full_check=True); "
                                       "print(len(m.graph.node), len(m.graph.initializer))\" " +
                                       stage);
    EXPECT_EQ(c.exit_code, 0) << c.err;
    absl::StatusOr<onnx_frontend::LoadedModel> loaded = onnx_frontend::LoadOnnxModel(stage);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
  }
  // report.html: self-contained, the three charts present with one bar or block per item.
  const std::string html = ReadAll(out + "/report.html");
  for (const char* id : {"id=\"memory-chart\"", "id=\"gantt-chart\"", "id=\"layer-map\""}) {
    EXPECT_THAT(html, HasSubstr(id));
  }
  EXPECT_EQ(html.find("http://www.w3.org/2000/svg\"") != std::string::npos, true);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  // The Gantt chart draws one block per event of the trace; the memory chart one bar per stage.
  int trace_blocks = 0;
  for (const json& e : trace["traceEvents"]) trace_blocks += e["ph"] == "X";
  const std::regex ev("class=\"ev\""), mem("class=\"mem\"");
  EXPECT_EQ(std::distance(std::sregex_iterator(html.begin(), html.end(), ev), std::sregex_iterator()), trace_blocks);
  EXPECT_GE(std::distance(std::sregex_iterator(html.begin(), html.end(), mem), std::sregex_iterator()), 2 * 4);
  // Rendered by headless Chromium (scripts/setup.sh installs it; missing is a failure): the
  // screenshot, decoded with Pillow, has the window's size, many colours and plenty of ink.
  std::string browser;
  for (const char* b : {"chromium", "chromium-browser", "google-chrome"}) {
    if (browser.empty() && RunCommand(std::string("command -v ") + b).exit_code == 0) browser = b;
  }
  ASSERT_FALSE(browser.empty()) << "headless Chromium is missing (scripts/setup.sh installs chromium)";
  const std::string png = out + "/report.png";
  const CommandResult c = RunCommand(browser +
                                     " --headless --no-sandbox --disable-gpu --hide-scrollbars "
                                     "--window-size=1200,1600 --screenshot=" +
                                     png + " file://" + out + "/report.html");
  ASSERT_EQ(c.exit_code, 0) << c.err;
  const CommandResult px =
      RunCommand(Python() +
                 " -c \"import sys; from PIL import Image; im = Image.open(sys.argv[1]).convert('RGB'); "
                 "px = list(im.getdata()); ink = sum(1 for p in px if min(p) < 200); "
                 "print(im.size[0], im.size[1], len(set(px)), ink / len(px))\" " +
                 png);
  ASSERT_EQ(px.exit_code, 0) << px.err;
  std::istringstream in(px.out);
  int width = 0, height = 0, colours = 0;
  double ink = 0;
  in >> width >> height >> colours >> ink;
  EXPECT_EQ(width, 1200) << px.out;
  EXPECT_EQ(height, 1600) << px.out;
  EXPECT_GT(colours, 16) << px.out;  // stage colours, text anti-aliasing
  EXPECT_GT(ink, 0.01) << px.out;    // bars, blocks and text, not a white page
}

// A GPT whose output projection reuses the token embedding: Megatron style, each stage that reads
// the tied weight holds it with its gradient and optimizer state, and `train --plan` measures
// exactly the plan's gradient and parameter bytes on every stage (the executor's accumulators and
// its parameters and replicas).
TEST_F(PartitionCli, TiedWeightsAreHeldOnEveryStageThatReadsThem) {
  const std::string model = SourcePath("models/tiny_gpt.onnx");
  const std::string common = " --batch 4 --momentum 0.9 --clip-norm 1 --freeze '^blocks\\..\\.attn\\.mask$'";
  for (int K : {2, 3}) {
    const std::string plan_dir = Path("gpt_plan" + std::to_string(K)), report = Path("gpt_report" + std::to_string(K));
    CommandResult r = Partition(model + common + " --stages " + std::to_string(K) +
                                " --microbatches 4 --seq 32 --device cpu --no-onnx --out " + plan_dir);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json plan = Plan(plan_dir);
    const json& first = plan["stages"][0];
    const json& last = plan["stages"][K - 1];
    for (const json* s : {&first, &last}) {
      EXPECT_THAT((*s)["parameters"].get<std::vector<std::string>>(), ::testing::Contains("tok_emb.weight"));
      int shared = 0;
      for (const json& b : (*s)["boundary_inputs"]) shared += b["kind"] == "shared_gradient";
      EXPECT_EQ(shared, 1);
    }
    r = RunCommand(Onnxpipe() + " train " + model + common + " --data " + SourcePath("models/golden/tiny_gpt/data") +
                   " --steps 1 --optimizer sgd --lr 0.05 --plan " + plan_dir + " --report " + report);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json m = json::parse(ReadAll(report + "/measured.json"));
    ASSERT_EQ(m["stages"].size(), static_cast<size_t>(K));
    for (int s = 0; s < K; ++s) {
      const json& pm = plan["stages"][s]["memory"];
      EXPECT_EQ(m["stages"][s]["measured"]["memory"]["accumulators"], pm["gradients"]) << "K=" << K << " stage " << s;
      EXPECT_EQ(m["stages"][s]["predicted"]["memory"]["parameters"], pm["parameters"]) << "K=" << K << " stage " << s;
    }
  }
}

TEST_F(PartitionCli, ProfileRoundTrip) {
  const std::string times = Path("times.json");
  const std::string model = SourcePath("models/tiny_classifier.onnx");
  const std::string device = Path("calibrated.json");
  CommandResult r = RunCommand(Onnxpipe() + " profile " + model + " --batch 2 --seq 16 --repeats 2 --out " + times +
                               " --device-out " + device);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The calibrated device file: the device loader accepts it, and a plan can use it.
  EXPECT_THAT(r.out, HasSubstr("calibrated roofline: GEMM"));
  // Node outputs share an arena laid out by the memory plan (a training step's reuse), not a buffer each.
  double arena_mib = 0, values_mib = 0;
  const size_t at = r.out.find("node outputs in a ");
  ASSERT_NE(at, std::string::npos) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + at, "node outputs in a %lf MiB arena (the memory plan of this order) for %lf",
                        &arena_mib, &values_mib),
            2)
      << r.out.substr(at, 200);
  EXPECT_GT(arena_mib, 0);
  EXPECT_LT(arena_mib, 0.75 * values_mib) << "no reuse between values whose lifetimes do not overlap";
  absl::StatusOr<partitioner::DeviceProfile> d = partitioner::LoadDeviceFile(device);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->name, "cpu-calibrated");
  EXPECT_EQ(d->backend, "cpu");  // so a plan for it counts the CPU backend's kernel scratch
  EXPECT_GT(d->gemm_flops_fp32, 0);
  EXPECT_GT(d->memory_bandwidth, 0);
  const CommandResult with_device = Partition(model + " --stages 2 --batch 8 --microbatches 4 --seq 16 --device " +
                                              device + " --no-onnx --out " + Path("calibrated_plan"));
  ASSERT_EQ(with_device.exit_code, 0) << with_device.err;
  EXPECT_EQ(Plan(Path("calibrated_plan"))["device"]["name"], "cpu-calibrated");
  EXPECT_TRUE(Plan(Path("calibrated_plan"))["config"]["kernel_scratch_counted"].get<bool>());
  const json t = json::parse(ReadAll(times));
  EXPECT_EQ(t["format"], "onnxpipe-op-times/1");
  EXPECT_EQ(t["microbatch"], 2);
  ASSERT_GT(t["ops"].size(), 50u);
  std::set<std::string> phases;
  for (const json& op : t["ops"]) phases.insert(op["phase"].get<std::string>());
  EXPECT_EQ(phases, (std::set<std::string>{"forward", "backward", "optimizer"}));
  const std::string out = Path("profiled");
  r = Partition(model + " --stages 2 --batch 8 --microbatches 4 --seq 16 --profile " + times +
                " --device cpu --no-onnx --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json plan = Plan(out);
  EXPECT_EQ(plan["predicted"]["cost_source"], "profile");
  EXPECT_EQ(plan["predicted"]["roofline_nodes"], 0);
  EXPECT_EQ(plan["predicted"]["measured_nodes"].get<size_t>(), t["ops"].size());
  // The measured forward times, summed over the stages, are the profile's forward total.
  double fwd = 0, want = 0;
  for (const json& s : plan["stages"]) fwd += s["predicted"]["forward_ms"].get<double>();
  for (const json& op : t["ops"])
    if (op["phase"] == "forward") want += op["ms"].get<double>();
  EXPECT_NEAR(fwd, want, 1e-6 * want + 1e-9);
}

// A profile names the device it was measured on, and partition plans for it unless --device says otherwise: then
// a warning that the times are used as measured. --device auto is this machine's GPU, or an error naming the flag.
TEST_F(PartitionCli, ProfilesDeviceIsTheDefault) {
  const std::string model = SourcePath("models/tiny_classifier.onnx");
  const std::string times = Path("device_times.json");
  CommandResult r =
      RunCommand(Onnxpipe() + " profile " + model + " --batch 2 --seq 16 --repeats 1 --warmup 0 --out " + times);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("on the cpu backend (device cpu)"));
  json t = json::parse(ReadAll(times));
  EXPECT_EQ(t["device"], "cpu");
  const std::string args = " --stages 1 --batch 4 --seq 16 --no-onnx --profile ";
  r = Partition(model + args + times + " --out " + Path("device_default"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Plan(Path("device_default"))["device"]["name"], "cpu");
  EXPECT_THAT(r.out, HasSubstr("device cpu: where " + times + " was measured"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("used as measured")));
  // A profile from a GPU run: that GPU's built-in device, its memory.
  t["device"] = "h100-80gb";
  const std::string h100_times = Path("device_h100_times.json");
  std::ofstream(h100_times) << t.dump(1);
  r = Partition(model + args + h100_times + " --out " + Path("device_h100"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json h100 = Plan(Path("device_h100"));
  EXPECT_EQ(h100["device"]["name"], "h100-80gb");
  EXPECT_EQ(h100["device"]["memory"].get<int64_t>(), partitioner::BuiltinDevice("h100-80gb")->memory_bytes);
  // --device overrides, with a warning on stderr and in the plan.
  r = Partition(model + args + h100_times + " --device h200 --out " + Path("device_h200"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string note = h100_times + " was measured on h100-80gb: its times are used as measured for h200";
  EXPECT_THAT(r.err, HasSubstr(note));
  const json h200 = Plan(Path("device_h200"));
  EXPECT_EQ(h200["device"]["name"], "h200");
  EXPECT_THAT(h200["warnings"].dump(), HasSubstr(note));
  // Without a device in the profile (older files): h200, as before.
  t.erase("device");
  const std::string old_times = Path("device_old_times.json");
  std::ofstream(old_times) << t.dump(1);
  r = Partition(model + args + old_times + " --out " + Path("device_old"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Plan(Path("device_old"))["device"]["name"], "h200");
  // A device name the partitioner does not know: the error names the profile.
  t["device"] = "tpu-v9";
  std::ofstream(old_times) << t.dump(1);
  r = Partition(model + args + old_times + " --out " + Path("device_bad"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr(old_times + "'s device: unknown device 'tpu-v9'"));
  // auto: a GPU's built-in profile where this machine has one, else an error naming the flag.
  r = Partition(model + " --stages 1 --batch 4 --seq 16 --no-onnx --device auto --out " + Path("device_auto"));
  if (r.exit_code == 0) {
    const std::vector<std::string> gpus = {"h200", "h100-80gb", "a100-80gb", "a100-40gb", "v100-32gb"};
    EXPECT_THAT(gpus, ::testing::Contains(Plan(Path("device_auto"))["device"]["name"].get<std::string>()));
  } else {
    EXPECT_THAT(r.err, HasSubstr("--device auto: "));
  }
}

// The largest of `bytes` over the nodes plan.json lists on `stage` (forward, backward, optimizer,
// replicated), 0 when it lists none of them.
int64_t LargestOnStage(const json& stage, const std::map<std::string, int64_t>& bytes) {
  int64_t largest = 0;
  for (const char* list : {"forward", "backward", "optimizer", "replicated"}) {
    for (const json& n : stage["nodes"][list]) {
      auto it = bytes.find(n.get<std::string>());
      if (it != bytes.end()) largest = std::max(largest, it->second);
    }
  }
  return largest;
}

// A GPU plan counts the kernel scratch of a profile measured on the cuda backend. `onnxpipe profile`
// on the CPU backend gives the training graph's node names; relabelled as a cuda profile, every fifth
// node gets a size of the test's own (multiples of 4 KiB: no alignment rounding) and the others
// none, so each stage's kernel_scratch must be the largest size among the nodes plan.json lists
// there.
TEST_F(PartitionCli, CudaProfileScratchIsCountedForAGpuDevice) {
  const std::string model = SourcePath("models/tiny_classifier.onnx");
  const std::string cpu_times = Path("scratch_cpu_times.json");
  CommandResult r =
      RunCommand(Onnxpipe() + " profile " + model + " --batch 2 --seq 16 --repeats 1 --warmup 0 --out " + cpu_times);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json measured = json::parse(ReadAll(cpu_times));
  ASSERT_EQ(measured["backend"], "cpu");
  for (const json& op : measured["ops"]) {  // written for every node, on every backend
    ASSERT_TRUE(op.contains("scratch_bytes") && op["scratch_bytes"].is_number_integer()) << op.dump();
    EXPECT_GE(op["scratch_bytes"].get<int64_t>(), 0) << op.dump();
  }
  json cuda = measured;
  cuda["backend"] = "cuda";
  cuda["device"] = "h200";
  std::map<std::string, int64_t> chosen;
  for (size_t i = 0; i < cuda["ops"].size(); ++i) {
    json& op = cuda["ops"][i];
    if (i % 5 == 2) {
      const int64_t bytes = static_cast<int64_t>((i * 7919) % 997 + 1) * 4096;
      op["scratch_bytes"] = bytes;
      chosen[op["node"].get<std::string>()] = bytes;
    } else {
      op.erase("scratch_bytes");
    }
  }
  const std::string cuda_times = Path("scratch_cuda_times.json");
  std::ofstream(cuda_times) << cuda.dump(1);
  const size_t unknown = cuda["ops"].size() - chosen.size();
  const std::string gpu = " --stages 2 --batch 8 --seq 16 --device h200 --no-onnx --profile ";
  auto expect_counted = [&](const std::string& out, const std::string& what) {
    const json plan = Plan(out);
    EXPECT_TRUE(plan["config"]["kernel_scratch_counted"].get<bool>()) << what;
    for (const json& st : plan["stages"]) {
      const int64_t want = LargestOnStage(st, chosen);
      EXPECT_GT(want, 0) << what << " stage " << st["index"];
      EXPECT_EQ(st["memory"]["kernel_scratch"].get<int64_t>(), want) << what << " stage " << st["index"];
    }
    const std::string note = std::to_string(unknown) + " nodes have no scratch_bytes in " + cuda_times;
    EXPECT_THAT(plan["warnings"].dump(), HasSubstr(note)) << what;
  };
  // At the profile's micro-batch (8 / 4 = 2): no micro-batch warning.
  r = Partition(model + gpu + cuda_times + " --microbatches 4 --out " + Path("scratch_mb2"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_counted(Path("scratch_mb2"), "micro-batch 2");
  EXPECT_THAT(r.err, HasSubstr(std::to_string(unknown) + " nodes have no scratch_bytes"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("measured at micro-batch")));
  // At micro-batch 4 the sizes are used as measured, with one warning saying so.
  r = Partition(model + gpu + cuda_times + " --microbatches 2 --out " + Path("scratch_mb4"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_counted(Path("scratch_mb4"), "micro-batch 4");
  const std::string mb_note = "kernel scratch was measured at micro-batch 2";
  const size_t first = r.err.find(mb_note);
  ASSERT_NE(first, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(mb_note, first + 1), std::string::npos) << r.err;
  // Not counted for a GPU, as today: a profile without scratch_bytes, and one measured on the CPU.
  json without = cuda;
  for (json& op : without["ops"]) op.erase("scratch_bytes");
  const std::string without_times = Path("scratch_none_times.json");
  std::ofstream(without_times) << without.dump(1);
  for (const std::string& times : {without_times, cpu_times}) {
    const std::string out = Path("scratch_uncounted");
    r = Partition(model + gpu + times + " --microbatches 4 --out " + out);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json plan = Plan(out);
    EXPECT_FALSE(plan["config"]["kernel_scratch_counted"].get<bool>()) << times;
    for (const json& st : plan["stages"]) EXPECT_EQ(st["memory"]["kernel_scratch"], 0) << times;
    if (times == cpu_times) {
      EXPECT_THAT(r.err, HasSubstr("kernel scratch measured on the cpu backend is not counted for device h200"));
    }
  }
  // The CPU device keeps the CPU backend's scratch, whatever a cuda profile says (same times, so
  // the same cuts as with the CPU profile).
  const std::string cpu = " --stages 2 --batch 8 --microbatches 4 --seq 16 --device cpu --no-onnx --profile ";
  r = Partition(model + cpu + cpu_times + " --out " + Path("scratch_cpu_own"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Partition(model + cpu + cuda_times + " --out " + Path("scratch_cpu_cuda"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json own = Plan(Path("scratch_cpu_own")), with_cuda = Plan(Path("scratch_cpu_cuda"));
  ASSERT_EQ(own["stages"].size(), with_cuda["stages"].size());
  for (size_t k = 0; k < own["stages"].size(); ++k) {
    EXPECT_EQ(with_cuda["stages"][k]["nodes"], own["stages"][k]["nodes"]) << "stage " << k;
    EXPECT_EQ(with_cuda["stages"][k]["memory"]["kernel_scratch"], own["stages"][k]["memory"]["kernel_scratch"])
        << "stage " << k;
    EXPECT_NE(with_cuda["stages"][k]["memory"]["kernel_scratch"].get<int64_t>(),
              LargestOnStage(with_cuda["stages"][k], chosen))
        << "stage " << k;
  }
}

TEST_F(PartitionCli, SweepWritesTheTableWithOomMarked) {
  const std::string out = Path("sweep");
  const std::string model = SourcePath("models/tiny_classifier.onnx");
  CommandResult r = Partition(model +
                              " --seq 16 --sweep \"batch=8,64 microbatches=1,4,16 stages=1,2 data_parallel=1,2\" "
                              "--schedule gpipe --device h100-80gb --device-memory 1030MiB --out " +
                              out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream csv(out + "/sweep.csv");
  std::string line;
  std::getline(csv, line);
  EXPECT_THAT(line, HasSubstr("batch,microbatches,stages,data_parallel,microbatch_size,status"));
  std::map<std::string, int> status;
  int rows = 0;
  while (std::getline(csv, line)) {
    ++rows;
    std::vector<std::string> f;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) f.push_back(cell);
    ++status[f[5]];
    if (f[0] == "8" && f[1] == "16") {
      EXPECT_EQ(f[5], "invalid");  // more micro-batches than samples
    }
    // Each of 2 replicas trains half the batch: 8 = 2 x 4 micro-batches x 1.
    if (f[3] == "2" && f[5] != "invalid") {
      EXPECT_EQ(std::stoll(f[4]) * std::stoll(f[1]) * 2, std::stoll(f[0])) << line;
    }
  }
  EXPECT_EQ(rows, 2 * 3 * 2 * 2);
  EXPECT_GT(status["ok"], 0);
  EXPECT_GT(status["oom"], 0) << ReadAll(out + "/sweep.csv");
  const std::string html = ReadAll(out + "/sweep.html");
  EXPECT_THAT(html, HasSubstr("class=\"oom\""));
  EXPECT_EQ(html.find("<script"), std::string::npos);
}

// Exports we did not tune for: a BERT with a padding mask, a GPT with a tied embedding at opset 14
// with fixed shapes (batch 4 baked in), a pre-LN classifier with external data, and the same
// classifier with every node and initializer renamed (no scopes, no module names). Each is cut into
// 3 stages; the plan loads, every stage's ONNX file passes the checker, and `train --plan` runs it:
// with one micro-batch its losses equal the unpartitioned run's bit for bit, and the saved bytes
// per micro-batch it measures equal the plan's.
TEST_F(PartitionCli, ExportsOfOtherArchitecturesPartitionAndTrain) {
  struct Case {
    std::string name, flags;
  } cases[] = {
      {"bert_mask", "--family bert --layers 3 --d-model 32 --heads 2 --seq 16 --vocab 100"},
      {"gpt_fixed14",
       "--family gpt --layers 3 --d-model 32 --heads 2 --seq 16 --vocab 100 --opset 14 "
       "--no-dynamic-axes --export-batch 4"},
      {"cls_prenorm_ext",
       "--family classifier --layers 3 --d-model 32 --heads 2 --seq 16 --vocab 100 --norm-first "
       "--external-data"},
      {"cls_scopeless", "--family classifier --layers 3 --d-model 32 --heads 2 --seq 16 --vocab 100"},
  };
  for (const Case& c : cases) {
    Export(c.name, c.flags);
    const std::string model = Path(c.name + ".onnx");
    const json sidecar = json::parse(ReadAll(Path(c.name + ".json")));
    if (c.name == "cls_scopeless") {  // rename every node and initializer (and their uses)
      const CommandResult r =
          RunCommand(Python() +
                     " -c \"import onnx,sys; m=onnx.load(sys.argv[1]); g=m.graph; "
                     "ren={t.name: 'w%d' % i for i, t in enumerate(g.initializer)}; "
                     "[setattr(t, 'name', ren[t.name]) for t in g.initializer]; "
                     "[n.input.__setitem__(j, ren.get(x, x)) for n in g.node for j, x in enumerate(n.input)]; "
                     "[setattr(n, 'name', 'n%d' % i) for i, n in enumerate(g.node)]; "
                     "onnx.checker.check_model(m); onnx.save(m, sys.argv[1])\" " +
                     model);
      ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    // Random data: token ids, all-ones masks, labels per token (GPT) or per sample.
    const std::string data = Path(c.name + "_data");
    const bool per_token = sidecar["loss"]["per"] == "token";
    std::string inputs;
    for (const json& in : sidecar["inputs"]) inputs += in["name"].get<std::string>() + ",";
    CommandResult r = RunCommand(
        Python() +
        " -c \"import numpy as np,os,sys; d=sys.argv[1]; os.makedirs(d); r=np.random.default_rng(0); "
        "[np.save(d+'/'+n+'.npy', np.ones((8,16),np.int64) if 'mask' in n else r.integers(0,100,(8,16))) "
        "for n in sys.argv[2].split(',') if n]; "
        "np.save(d+'/labels.npy', r.integers(0, int(sys.argv[3]), (8,16) if sys.argv[4]=='1' else (8,)))\" " +
        data + " " + inputs + " " + std::to_string(per_token ? 100 : sidecar["classes"].get<int>()) + " " +
        (per_token ? "1" : "0"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::string freeze;
    if (sidecar.contains("freeze_regex") && sidecar["freeze_regex"].is_string()) {
      freeze = " --freeze '" + sidecar["freeze_regex"].get<std::string>() + "'";
    }
    const std::string out = Path(c.name + "_plan");
    r = Partition(model + " --stages 3 --batch 4 --microbatches 1 --seq 16 --device cpu" + freeze + " --out " + out);
    ASSERT_EQ(r.exit_code, 0) << c.name << ": " << r.err;
    absl::StatusOr<partitioner::PartitionPlan> plan = partitioner::LoadPlan(out);
    ASSERT_TRUE(plan.ok()) << c.name << ": " << plan.status();
    ASSERT_EQ(plan->stages.size(), 3u) << c.name;
    for (int k = 0; k < 3; ++k) {
      const CommandResult check = RunCommand(Python() +
                                             " -c \"import onnx,sys; onnx.checker.check_model("
                                             "onnx.load(sys.argv[1]), full_check=True)\" " +
                                             out + "/stage_" + std::to_string(k) + ".onnx");
      EXPECT_EQ(check.exit_code, 0) << c.name << " stage " << k << ": " << check.err;
    }
    const std::string train = Onnxpipe() + " train " + model + " --data " + data +
                              " --batch 4 --steps 2 --optimizer sgd --lr 0.05 --seed 3" + freeze;
    const std::string report = Path(c.name + "_report");
    r = RunCommand(train + " --metrics " + Path(c.name + "_pipe.jsonl") + " --plan " + out + " --report " + report);
    ASSERT_EQ(r.exit_code, 0) << c.name << ": " << r.err;
    r = RunCommand(train + " --metrics " + Path(c.name + "_ref.jsonl"));
    ASSERT_EQ(r.exit_code, 0) << c.name << ": " << r.err;
    std::istringstream pipe(ReadAll(Path(c.name + "_pipe.jsonl"))), ref(ReadAll(Path(c.name + "_ref.jsonl")));
    int steps = 0;
    for (std::string a, b; std::getline(pipe, a) && std::getline(ref, b); ++steps) {
      EXPECT_EQ(json::parse(a)["loss"].get<double>(), json::parse(b)["loss"].get<double>())
          << c.name << " step " << steps;
    }
    EXPECT_EQ(steps, 2) << c.name;
    const json m = json::parse(ReadAll(report + "/measured.json"));
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(m["stages"][k]["measured"]["memory"]["saved_per_microbatch"].get<int64_t>(),
                plan->stages[k].memory.saved)
          << c.name << " stage " << k;
      EXPECT_EQ(m["stages"][k]["measured"]["memory"]["accumulators"].get<int64_t>(), plan->stages[k].memory.gradients)
          << c.name << " stage " << k;
    }
  }
}

// --data-parallel D on a device file with round numbers: the plan is one replica's, and each stage's all-reduce is
// 2 (D - 1) / D of its parameters' fp32 gradient bytes (their shapes read from the ONNX file) over 100 GB/s.
TEST_F(PartitionCli, DataParallelAddsTheGradientAllReduce) {
  const std::string model = SourcePath("models/tiny_classifier.onnx");
  const std::string device = Path("round_device.json");
  std::ofstream(device) << R"({"name": "round", "memory": "80GiB", "peak_tflops": {"fp32": 100},
      "memory_bandwidth_gbps": 1000, "link_bandwidth_gbps": 100, "link_latency_us": 0})";
  const std::string common = " --stages 2 --microbatches 2 --seq 16 --no-onnx --device " + device;
  CommandResult r = Partition(model + common + " --batch 4 --out " + Path("dp1"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Partition(model + common + " --batch 8 --data-parallel 2 --out " + Path("dp2"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json one = Plan(Path("dp1")), two = Plan(Path("dp2"));
  EXPECT_EQ(two["config"]["batch"], 4);
  EXPECT_EQ(two["config"]["data_parallel"], 2);
  EXPECT_EQ(two["config"]["world"], 4);
  EXPECT_EQ(one["config"]["data_parallel"], 1);
  absl::StatusOr<onnx_frontend::LoadedModel> loaded = onnx_frontend::LoadOnnxModel(model);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(loaded->graph.has_value());
  const ir::Graph& g = *loaded->graph;
  double slowest_ms = 0;
  for (const json& st : two["stages"]) {
    int64_t bytes = 0;
    for (const json& name : st["parameters"]) {
      const ir::ValueId v = g.FindValue(name.get<std::string>());
      ASSERT_NE(v, ir::kNoValue) << name;
      bytes += 4 * ir::NumElements(g.value(v).shape).value();
    }
    EXPECT_EQ(st["predicted"]["data_parallel_bytes"], bytes);
    const double ms = 2.0 * (2 - 1) / 2 * static_cast<double>(bytes) / 100e9 * 1e3;
    EXPECT_NEAR(st["predicted"]["data_parallel_allreduce_ms"].get<double>(), ms, 1e-9 * ms);
    slowest_ms = std::max(slowest_ms, ms);
    EXPECT_EQ(st["memory"]["total"], one["stages"][st["index"].get<int>()]["memory"]["total"]);
  }
  const double step = one["predicted"]["step_ms"].get<double>() + slowest_ms;
  EXPECT_NEAR(two["predicted"]["step_ms"].get<double>(), step, 1e-9 * step);
  EXPECT_NEAR(two["predicted"]["samples_per_s"].get<double>(), 8 / (step * 1e-3), 1e-6 * 8 / (step * 1e-3));
  EXPECT_THAT(r.out, HasSubstr("batch 8 = 2 replicas x 4 = 2 x 2 micro-batches x 2, 2 stages x 2 replicas = 4 ranks"));
  EXPECT_THAT(r.out, HasSubstr("all-reduce stage 0: "));
  EXPECT_THAT(ReadAll(Path("dp2") + "/report.html"), HasSubstr("<th>all-reduce</th>"));
}

TEST_F(PartitionCli, BadInputsFailClearly) {
  const std::string model = SourcePath("models/tiny_classifier.onnx");
  const std::string out = " --out " + Path("bad");
  struct Case {
    std::string args, message;
  } cases[] = {
      {" --stages 2 --batch 4 --microbatches 8", "larger than --batch"},
      {" --stages 2 --batch 10 --microbatches 4", "not divisible"},
      {" --stages 2 --batch 8 --microbatches 2 --data-parallel 0", "--data-parallel must be >= 1, got 0"},
      {" --stages 2 --batch 8 --microbatches 2 --data-parallel 3",
       "--batch 8 is not divisible by --microbatches 2 x --data-parallel 3"},
      {" --sweep \"batch=8 microbatches=1 stages=1 data_parallel=2\" --data-parallel 2", "keep one"},
      {" --stages 2 --batch 8 --microbatches 4 --device tpu-v9", "unknown device 'tpu-v9'"},
      {" --stages 500 --batch 8 --microbatches 4 --seq 16", "cut candidates"},
      {" --stages 2 --batch 8 --microbatches 4 --profile " + Path("broken.json"), "malformed profile"},
      {" --stages 2 --batch 8 --recompute sometimes", "unknown recompute policy"},
      {" --stages 2 --batch 8 --dtype fp16", "--dtype: unknown dtype 'fp16'; expected fp32 or bf16"},
      {" --stages 1 --batch 64 --microbatches 1 --seq 64 --device h100-80gb --device-memory 1026MiB --schedule gpipe",
       "It would fit on devices with"},
  };
  std::ofstream(Path("broken.json")) << "{\"format\": \"onnxpipe-op-times/1\", \"microbatch\": 2, \"ops\": [";
  for (const Case& c : cases) {
    const CommandResult r = Partition(model + c.args + out);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << c.args;
  }
}

}  // namespace
}  // namespace onnxpipe::testing
