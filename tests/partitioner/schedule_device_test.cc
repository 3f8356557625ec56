// Phase 6 (schedule simulation) against hand-computed timelines and the closed forms of
// REFERENCES.md section 1; device profiles, byte sizes and the measured-times format.
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "partitioner/cost_model.h"
#include "partitioner/device.h"
#include "partitioner/schedule.h"

namespace onnxpipe::partitioner {
namespace {

using ::testing::HasSubstr;

std::vector<StageTiming> Uniform(int K, double f, double b) {
  return std::vector<StageTiming>(K, StageTiming{f, b, 0, 0, 0});
}

TEST(Schedule, UniformStagesMatchTheClosedForm) {
  // (M + K - 1)(f + b) and bubble (K - 1)/(M + K - 1), GPipe and 1F1B alike.
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    const ScheduleResult r = SimulateSchedule(kind, Uniform(4, 1.0, 2.0), 8);
    EXPECT_DOUBLE_EQ(r.step_s, 33.0) << ScheduleName(kind);
    EXPECT_NEAR(r.bubble_fraction, 3.0 / 11.0, 1e-12) << ScheduleName(kind);
    EXPECT_EQ(r.events.size(), 4u * 8u * 2u);
  }
}

TEST(Schedule, GPipeHandTimeline) {
  // f = (1, 2), b = (2, 4), M = 3. Stage 1 runs F0..F2 in [1,7], B0..B2 in [7,19]; stage 0 runs
  // B0 at [11,13], B1 [15,17], B2 [19,21]: step 21 = sum f + 2 max f + sum b + 2 max b.
  const std::vector<StageTiming> t = {{1, 2, 0, 0, 0}, {2, 4, 0, 0, 0}};
  const ScheduleResult r = SimulateSchedule(ScheduleKind::kGPipe, t, 3);
  EXPECT_DOUBLE_EQ(r.step_s, 21.0);
  bool found = false;
  for (const ScheduleEvent& e : r.events) {
    if (e.stage == 0 && e.kind == ScheduleEvent::kBackward && e.microbatch == 1) {
      EXPECT_DOUBLE_EQ(e.start_s, 15.0);
      EXPECT_DOUBLE_EQ(e.end_s, 17.0);
      found = true;
    }
  }
  EXPECT_TRUE(found);
  EXPECT_NEAR(r.bubble_fraction, 1.0 - (3 * 3 + 3 * 6) / (2 * 21.0), 1e-12);
}

TEST(Schedule, OneFOneBHandTimeline) {
  // K = 2, M = 3, f = 1, b = 2: stage 0 runs F0 F1 B0 F2 B1 B2 = [0,1] [1,2] [4,6] [6,7] [7,9] [10,12].
  const ScheduleResult r = SimulateSchedule(ScheduleKind::k1F1B, Uniform(2, 1, 2), 3);
  EXPECT_DOUBLE_EQ(r.step_s, 12.0);
  std::vector<std::pair<double, double>> stage0;
  for (const ScheduleEvent& e : r.events)
    if (e.stage == 0) stage0.push_back({e.start_s, e.end_s});
  const std::vector<std::pair<double, double>> want = {{0, 1}, {1, 2}, {4, 6}, {6, 7}, {7, 9}, {10, 12}};
  EXPECT_EQ(stage0, want);
}

TEST(Schedule, TransfersAndOptimizerExtendTheStep) {
  // GPipe with a transfer delay c per hop: F phase sum f + (K-1)c + (M-1) max f, the same for B.
  std::vector<StageTiming> t(3, StageTiming{1, 2, 0, 0.5, 0.5});
  t[2].optimizer_s = 3;  // the last stage's update ends the step only if it finishes last
  const ScheduleResult r = SimulateSchedule(ScheduleKind::kGPipe, t, 4);
  const double f_phase = 3 * 1 + 2 * 0.5 + 3 * 1, b_phase = 3 * 2 + 2 * 0.5 + 3 * 2;
  // Stage 0 ends B at f_phase + b_phase; stage 2 ends B at f_phase + 4*2 and then updates for 3.
  EXPECT_DOUBLE_EQ(r.step_s, std::max(f_phase + b_phase, f_phase + 8 + 3));
}

TEST(Schedule, InFlightMicrobatches) {
  EXPECT_EQ(InFlightMicrobatches(ScheduleKind::kGPipe, 4, 0, 8), 8);
  EXPECT_EQ(InFlightMicrobatches(ScheduleKind::k1F1B, 4, 0, 8), 4);
  EXPECT_EQ(InFlightMicrobatches(ScheduleKind::k1F1B, 4, 3, 8), 1);
  EXPECT_EQ(InFlightMicrobatches(ScheduleKind::k1F1B, 4, 0, 2), 2);
}

TEST(Device, ByteSizes) {
  EXPECT_EQ(*ParseByteSize("80GiB"), int64_t{80} << 30);
  EXPECT_EQ(*ParseByteSize("40 GB"), int64_t{40} * 1000000000);
  EXPECT_EQ(*ParseByteSize("1.5KiB"), 1536);
  EXPECT_EQ(*ParseByteSize("123"), 123);
  EXPECT_FALSE(ParseByteSize("80 parsecs").ok());
  EXPECT_FALSE(ParseByteSize("GiB").ok());
  EXPECT_FALSE(ParseByteSize("-4GB").ok());
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(512), "512 B");
}

TEST(Device, BuiltinsAndUnknownNames) {
  for (const std::string& name : BuiltinDeviceNames()) {
    absl::StatusOr<DeviceProfile> d = BuiltinDevice(name);
    ASSERT_TRUE(d.ok()) << name;
    EXPECT_GT(d->usable_bytes(), 0) << name;
    EXPECT_GT(d->gemm_flops(Precision::kBF16), 0) << name;
  }
  EXPECT_EQ(BuiltinDevice("a100-40gb")->memory_bytes, int64_t{40} << 30);
  EXPECT_DOUBLE_EQ(BuiltinDevice("h100-80gb")->gemm_flops(Precision::kBF16), 989e12);
  absl::Status st = BuiltinDevice("tpu-v9").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(st.message()), HasSubstr("h200"));
}

// The names NVIDIA's driver reports (cudaDeviceProp::name) with their total memory.
TEST(Device, BuiltinProfileOfAGpuByItsDriverName) {
  constexpr int64_t GiB = int64_t{1} << 30;
  EXPECT_EQ(BuiltinDeviceForGpu("NVIDIA H100 80GB HBM3", 80 * GiB), "h100-80gb");
  EXPECT_EQ(BuiltinDeviceForGpu("NVIDIA H100 PCIe", 80 * GiB), "h100-80gb");
  EXPECT_EQ(BuiltinDeviceForGpu("NVIDIA H200", 141 * GiB), "h200");
  EXPECT_EQ(BuiltinDeviceForGpu("NVIDIA A100-SXM4-80GB", 80 * GiB), "a100-80gb");
  EXPECT_EQ(BuiltinDeviceForGpu("NVIDIA A100-SXM4-40GB", 40 * GiB), "a100-40gb");
  EXPECT_EQ(BuiltinDeviceForGpu("Tesla V100-SXM2-32GB", 32 * GiB), "v100-32gb");
  EXPECT_EQ(BuiltinDeviceForGpu("NVIDIA GeForce RTX 4090", 24 * GiB), "");
  for (const char* gpu : {"NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-40GB", "Tesla V100-SXM2-32GB"}) {
    EXPECT_TRUE(BuiltinDevice(BuiltinDeviceForGpu(gpu, 40 * GiB)).ok()) << gpu;
  }
}

TEST(Device, JsonFile) {
  nlohmann::json j = nlohmann::json::parse(R"({"name": "lab-gpu", "memory": "24GiB", "reserved": "512MiB",
      "peak_tflops": {"bf16": 100}, "memory_bandwidth_gbps": 1000, "link_bandwidth_gbps": 25,
      "op_overhead_us": 3})");
  absl::StatusOr<DeviceProfile> d = DeviceFromJson(j, "dev.json");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->usable_bytes(), (int64_t{24} << 30) - (int64_t{512} << 20));
  EXPECT_DOUBLE_EQ(d->gemm_flops_bf16, 100e12);
  EXPECT_DOUBLE_EQ(d->gemm_flops_fp32, 50e12);  // derived from bf16 when absent
  EXPECT_DOUBLE_EQ(d->memory_bandwidth, 1e12);
  EXPECT_DOUBLE_EQ(d->op_overhead_s, 3e-6);
  EXPECT_EQ(d->backend, "cuda");  // the default
  j["backend"] = "cpu";
  d = DeviceFromJson(j, "dev.json");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->backend, "cpu");
  EXPECT_EQ(BuiltinDevice("cpu")->backend, "cpu");
  EXPECT_EQ(BuiltinDevice("h200")->backend, "cuda");
  for (const char* backend : {R"("tpu")", "1"}) {
    j["backend"] = nlohmann::json::parse(backend);
    const absl::Status st = DeviceFromJson(j, "dev.json").status();
    EXPECT_THAT(std::string(st.message()), HasSubstr("dev.json: 'backend' must be \"cpu\" or \"cuda\"")) << backend;
  }
  for (
      const char* bad :
      {R"({"name": "x"})",
       R"({"name": "x", "memory": "1GiB", "peak_tflops": {"fp8": 1}, "memory_bandwidth_gbps": 1, "link_bandwidth_gbps": 1})",
       R"({"name": "x", "memory": "1GiB", "peak_tflops": {"bf16": -1}, "memory_bandwidth_gbps": 1, "link_bandwidth_gbps": 1})",
       R"({"name": "x", "memory": "1GiB", "peak_tflops": {"bf16": 1}, "memory_bandwidth_gbps": 1, "link_bandwidth_gbps": 1, "colour": "red"})"}) {
    EXPECT_FALSE(DeviceFromJson(nlohmann::json::parse(bad), "dev.json").ok()) << bad;
  }
}

TEST(CostModel, GemmRooflineByHand) {
  // (8, 64) x (64, 32): 2*8*32*64 = 32768 FLOPs; bytes 4*(512 + 2048 + 256) = 11264.
  ir::Graph g;
  const ir::ValueId a = g.AddValue("a", ir::DType::kF32, ir::FromInts({8, 64}));
  const ir::ValueId b = g.AddConstant("b", ir::Tensor(ir::DType::kF32, {64, 32}), true);
  const ir::ValueId c = g.AddValue("c", ir::DType::kF32, ir::FromInts({8, 32}));
  const ir::NodeId id = g.AddNode(ir::OpKind::kMatMul, "mm", {a, b}, {c});
  const OpCost cost = EstimateOpCost(g, g.node(id));
  EXPECT_TRUE(cost.gemm);
  EXPECT_DOUBLE_EQ(cost.flops, 32768);
  EXPECT_DOUBLE_EQ(cost.bytes, 11264);
  DeviceProfile d;
  d.gemm_flops_fp32 = 1e12;
  d.memory_bandwidth = 1e9;
  d.vector_flops = 1e12;
  d.compute_efficiency = d.memory_efficiency = 1;
  d.op_overhead_s = 1e-6;
  // Memory-bound: 11264 bytes at 1 GB/s = 11.264 us, plus the 1 us overhead.
  EXPECT_NEAR(RooflineSeconds(cost, d, Precision::kFP32), 12.264e-6, 1e-15);
  // The same product on bf16 values (a bf16 training graph's activations and weight copies) moves
  // half the bytes; the precision only picks the GEMM peak.
  for (ir::ValueId v : {a, b, c}) g.value(v).dtype = ir::DType::kBF16;
  EXPECT_DOUBLE_EQ(EstimateOpCost(g, g.node(id)).bytes, 11264 / 2);
}

TEST(CostModel, NormsCostTheirElementwiseWork) {
  // The roofline charges a norm per element of its larger side (inputs or outputs): RMSNorm 5 FLOPs (square,
  // add, the row's rsqrt share, x*r, *scale) over x and scale (64 + 16 > y and the (4, 1) statistics, 68);
  // bytes: x 256 + scale 64 + y 256 + statistics 16. Its gradient 9 per element over dY, X and scale.
  ir::Graph g;
  const ir::ValueId x = g.AddValue("x", ir::DType::kF32, ir::FromInts({4, 16}));
  const ir::ValueId w = g.AddConstant("w", ir::Tensor(ir::DType::kF32, {16}), true);
  const ir::ValueId y = g.AddValue("y", ir::DType::kF32, ir::FromInts({4, 16}));
  const ir::ValueId r = g.AddValue("r", ir::DType::kF32, ir::FromInts({4, 1}));
  const OpCost fwd = EstimateOpCost(g, g.node(g.AddNode(ir::OpKind::kRMSNorm, "rms", {x, w}, {y, r})));
  EXPECT_FALSE(fwd.gemm);
  EXPECT_DOUBLE_EQ(fwd.bytes, 256 + 64 + 256 + 16);
  EXPECT_DOUBLE_EQ(fwd.flops, 5 * (64 + 16));
  const ir::ValueId dx = g.AddValue("dx", ir::DType::kF32, ir::FromInts({4, 16}));
  const OpCost bwd = EstimateOpCost(g, g.node(g.AddNode(ir::OpKind::kRMSNormGrad, "rms_grad", {y, x, w}, {dx})));
  EXPECT_DOUBLE_EQ(bwd.flops, 9 * (64 + 64 + 16));
}

TEST(CostModel, ProfileFormat) {
  nlohmann::json ok = nlohmann::json::parse(R"({"format": "onnxpipe-op-times/1", "microbatch": 4,
      "ops": [{"node": "a", "ms": 1.5}, {"node": "b", "op": "Relu", "phase": "forward", "ms": 0}]})");
  absl::StatusOr<OpTimes> t = OpTimesFromJson(ok, "t.json");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->ops.size(), 2u);
  // Round trip.
  absl::StatusOr<OpTimes> back = OpTimesFromJson(nlohmann::json::parse(OpTimesToJson(*t).dump()), "t2");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->ops[0].node, "a");
  EXPECT_DOUBLE_EQ(back->ops[0].ms, 1.5);
  // The device it was measured on: "" when the file has none (older profiles), kept through a round trip.
  EXPECT_EQ(back->device, "");
  nlohmann::json on_h100 = ok;
  on_h100["device"] = "h100-80gb";
  absl::StatusOr<OpTimes> h100 = OpTimesFromJson(on_h100, "t.json");
  ASSERT_TRUE(h100.ok()) << h100.status();
  absl::StatusOr<OpTimes> h100_back = OpTimesFromJson(nlohmann::json::parse(OpTimesToJson(*h100).dump()), "t3");
  ASSERT_TRUE(h100_back.ok()) << h100_back.status();
  EXPECT_EQ(h100_back->device, "h100-80gb");
  on_h100["device"] = 100;
  EXPECT_THAT(std::string(OpTimesFromJson(on_h100, "t.json").status().message()),
              HasSubstr("t.json: \"device\" must be a string"));
  const char* bad[] = {
      R"({"microbatch": 4, "ops": []})",
      R"({"format": "onnxpipe-op-times/1", "ops": []})",
      R"({"format": "onnxpipe-op-times/1", "microbatch": 4, "ops": [{"node": "a", "ms": -1}]})",
      R"({"format": "onnxpipe-op-times/1", "microbatch": 4, "ops": [{"node": "a", "ms": 1}, {"node": "a", "ms": 2}]})",
      R"({"format": "onnxpipe-op-times/1", "microbatch": 0, "ops": []})",
      R"({"format": "onnxpipe-op-times/1", "microbatch": 2, "ops": [{"ms": 1}]})"};
  for (const char* b : bad) EXPECT_FALSE(OpTimesFromJson(nlohmann::json::parse(b), "t.json").ok()) << b;
  const std::string path = ::testing::TempDir() + "/malformed_times.json";
  std::ofstream(path) << "{\"format\": \"onnxpipe-op-times/1\", ";
  absl::Status st = LoadOpTimes(path).status();
  EXPECT_THAT(std::string(st.message()), HasSubstr("malformed profile"));
}

TEST(CostModel, ProfileScratchBytes) {
  // Optional per entry: kept through a round trip, absent stays absent (older profiles).
  const nlohmann::json j = nlohmann::json::parse(R"({"format": "onnxpipe-op-times/1", "microbatch": 4,
      "ops": [{"node": "a", "ms": 1, "scratch_bytes": 4096}, {"node": "b", "ms": 1, "scratch_bytes": 0},
              {"node": "c", "ms": 1}]})");
  absl::StatusOr<OpTimes> t = OpTimesFromJson(j, "t.json");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->has_scratch());
  const nlohmann::ordered_json written = OpTimesToJson(*t);
  EXPECT_FALSE(written["ops"][2].contains("scratch_bytes"));
  absl::StatusOr<OpTimes> back = OpTimesFromJson(nlohmann::json::parse(written.dump()), "t2");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->ops.size(), 3u);
  EXPECT_EQ(back->ops[0].scratch_bytes, std::optional<int64_t>(4096));
  EXPECT_EQ(back->ops[1].scratch_bytes, std::optional<int64_t>(0));
  EXPECT_EQ(back->ops[2].scratch_bytes, std::nullopt);
  nlohmann::json old = j;
  for (nlohmann::json& e : old["ops"]) e.erase("scratch_bytes");
  absl::StatusOr<OpTimes> without = OpTimesFromJson(old, "old.json");
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_FALSE(without->has_scratch());
  // Bad values: the error names the file, the entry, its node and the field.
  for (const char* bad : {"-1", "1.5", "\"4096\"", "null", "18446744073709551615"}) {
    nlohmann::json b = j;
    b["ops"][1]["scratch_bytes"] = nlohmann::json::parse(bad);
    const absl::Status st = OpTimesFromJson(b, "times.json").status();
    EXPECT_FALSE(st.ok()) << bad;
    EXPECT_THAT(std::string(st.message()),
                HasSubstr("times.json: ops[1] (node 'b'): \"scratch_bytes\" must be an integer >= 0"))
        << bad;
  }
}

TEST(CostModel, ProfileScratchPerNode) {
  // a and its recompute clone take a's scratch; b the profile's; c (no scratch_bytes) and d (not
  // named) count as 0 and as unknown; a backward node with origin a is not a's clone.
  const nlohmann::json j = nlohmann::json::parse(R"({"format": "onnxpipe-op-times/1", "microbatch": 4,
      "ops": [{"node": "a", "ms": 1, "scratch_bytes": 8192}, {"node": "b", "ms": 1, "scratch_bytes": 256},
              {"node": "c", "ms": 1}]})");
  absl::StatusOr<OpTimes> t = OpTimesFromJson(j, "t.json");
  ASSERT_TRUE(t.ok()) << t.status();
  ir::Graph g;
  const ir::ValueId x = g.AddValue("x", ir::DType::kF32, ir::FromInts({4}));
  auto node = [&](const std::string& name, const std::string& origin) {
    const ir::ValueId y = g.AddValue(name + "_out", ir::DType::kF32, ir::FromInts({4}));
    const ir::NodeId id = g.AddNode(ir::OpKind::kRelu, name, {x}, {y});
    g.node(id).origin = origin;
    return id;
  };
  const ir::NodeId a = node("a", ""), clone = node("recompute/a", "a"), b = node("b", ""), c = node("c", "");
  const ir::NodeId d = node("d", ""), grad = node("a_grad", "a");
  const auto scratch = ProfileScratch(std::make_shared<const OpTimes>(*t));
  EXPECT_EQ(scratch(g, g.node(a)), 8192);
  EXPECT_EQ(scratch(g, g.node(clone)), 8192);
  EXPECT_EQ(scratch(g, g.node(b)), 256);
  EXPECT_EQ(scratch(g, g.node(c)), 0);
  EXPECT_EQ(scratch(g, g.node(d)), 0);
  EXPECT_EQ(scratch(g, g.node(grad)), 0);
  EXPECT_EQ(NodesWithoutScratch(g, *t), 3);  // c, d, a_grad
}

}  // namespace
}  // namespace onnxpipe::partitioner
