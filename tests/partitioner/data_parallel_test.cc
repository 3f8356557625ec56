// Data parallelism in the partitioner (--data-parallel D): the plan is one replica's (batch B / D),
// each stage's step adds the ring all-reduce of its accumulated gradients over the D replicas, and
// nothing is added to memory. The all-reduce times are computed here by hand from the parameters'
// shapes and the fake device's round numbers, never from the partitioner's own numbers.
#include <algorithm>
#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "partitioner/partitioner.h"
#include "partitioner/plan_io.h"
#include "partitioner/reports.h"
#include "partitioner/sweep.h"
#include "tests/partitioner/test_graphs.h"

namespace onnxpipe::partitioner {
namespace {

using testing::BuildChain;
using testing::ChainSpec;
using testing::FakeDevice;
using ::testing::HasSubstr;

// 100 GB/s links without latency: an all-reduce is bytes / bandwidth alone.
DeviceProfile RoundDevice() {
  DeviceProfile d = FakeDevice(int64_t{1} << 40);
  d.link_bandwidth = 100e9;
  d.link_latency_s = 0;
  return d;
}

std::unique_ptr<PartitionContext> Context(const ir::Graph& g, const DeviceProfile& d, int64_t microbatch) {
  absl::StatusOr<std::unique_ptr<PartitionContext>> ctx =
      PartitionContext::Create(g, Cluster{d}, Precision::kFP32, nullptr, microbatch, /*cut_slack=*/1e9);
  EXPECT_TRUE(ctx.ok()) << ctx.status();
  return std::move(*ctx);
}

PartitionPlan Plan(const PartitionContext& ctx, int64_t stages, int64_t batch, int64_t microbatches,
                   int64_t data_parallel, int64_t bucket_bytes = int64_t{25} << 20) {
  PartitionOptions o;
  o.dp_bucket_bytes = bucket_bytes;
  o.num_stages = stages;
  o.batch = batch;
  o.microbatches = microbatches;
  o.data_parallel = data_parallel;
  absl::StatusOr<PartitionPlan> plan = Partition(ctx, o);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : PartitionPlan{};
}

void ExpectRelativelyNear(double actual, double expected) {
  EXPECT_NEAR(actual, expected, 1e-9 * std::abs(expected)) << "actual " << actual << ", expected " << expected;
}

// The fp32 gradient bytes of the named parameters, from their shapes.
int64_t GradientBytes(const ir::Graph& g, const std::vector<std::string>& parameters) {
  int64_t bytes = 0;
  for (const std::string& name : parameters) bytes += 4 * ir::NumElements(g.value(g.FindValue(name)).shape).value();
  return bytes;
}

TEST(DataParallel, OneStageAddsTheHandComputedRingAllReduce) {
  // x (2, 16) -> Linear 16x16 -> Relu -> Linear 16x16 -> Relu -> head Linear 16x4: 612 fp32
  // parameters in 6 tensors, all on the one stage.
  ChainSpec spec;
  spec.batch = 2;  // the micro-batch: B / (D x M)
  spec.widths = {16, 16, 16};
  const ir::Graph g = BuildChain(spec);
  const int64_t grad_bytes = 4 * (2 * (16 * 16 + 16) + 16 * 4 + 4);
  ASSERT_EQ(grad_bytes, 2448);
  const DeviceProfile device = RoundDevice();
  auto ctx = Context(g, device, spec.batch);
  const PartitionPlan one = Plan(*ctx, /*stages=*/1, /*batch=*/4, /*microbatches=*/2, /*data_parallel=*/1);
  EXPECT_EQ(one.data_parallel, 1);
  EXPECT_EQ(one.data_parallel_allreduce_ms, 0);
  EXPECT_EQ(one.stages[0].data_parallel_allreduce_ms, 0);
  for (const int64_t D : {2, 4}) {
    const PartitionPlan dp = Plan(*ctx, /*stages=*/1, /*batch=*/4 * D, /*microbatches=*/2, D);
    // 2 (D - 1) / D of the gradient bytes over 100 GB/s, in ms.
    const double allreduce_ms = 2.0 * (D - 1) / D * grad_bytes / 100e9 * 1e3;
    ExpectRelativelyNear(dp.step_ms, one.step_ms + allreduce_ms);
    ExpectRelativelyNear(dp.data_parallel_allreduce_ms, allreduce_ms);
    ExpectRelativelyNear(dp.stages[0].data_parallel_allreduce_ms, allreduce_ms);
    EXPECT_EQ(dp.stages[0].data_parallel_bytes, grad_bytes);
    EXPECT_EQ(dp.stages[0].data_parallel_tensors, 6);
    // The plan is one replica's; the throughput counts the global batch.
    EXPECT_EQ(dp.data_parallel, D);
    EXPECT_EQ(dp.batch, 4);
    EXPECT_EQ(dp.microbatch_size, 2);
    ExpectRelativelyNear(dp.samples_per_s, 4.0 * D / (dp.step_ms * 1e-3));
    // In place on the gradient accumulators: not a byte more.
    EXPECT_EQ(dp.stages[0].memory.total, one.stages[0].memory.total);
  }
  // A latency is paid 2 (D - 1) times by each tensor's all-reduce (the executor issues one per
  // accumulated gradient): D = 2, 6 tensors, 3 us -> 36 us more.
  DeviceProfile slow = device;
  slow.link_latency_s = 3e-6;
  auto slow_ctx = Context(g, slow, spec.batch);
  const PartitionPlan slow_one = Plan(*slow_ctx, 1, 4, 2, 1);
  const PartitionPlan slow_two = Plan(*slow_ctx, 1, 8, 2, 2);
  ExpectRelativelyNear(slow_two.step_ms, slow_one.step_ms + grad_bytes / 100e9 * 1e3 + 6 * 2 * 3e-3);
}

// Four 100-byte gradients completed evenly over a 10 s backward, 2 ranks, 10 B/s: 10 s per tensor's ring.
TEST(DataParallel, BucketsStartAsTheBackwardCompletesThemOneAfterAnother) {
  const std::vector<int64_t> grads = {100, 100, 100, 100};
  // Buckets of 200 B: the first is complete at 5 s and runs to 25 s, the second waits for it: 45 s, 35 s past.
  BucketedAllReduce r = BucketedAllReduceSeconds(grads, 200, 10, 2, 10, 0);
  EXPECT_EQ(r.buckets, 2);
  EXPECT_DOUBLE_EQ(r.seconds, 40);
  EXPECT_DOUBLE_EQ(r.exposed_s, 35);
  // One bucket larger than all: everything after the backward.
  r = BucketedAllReduceSeconds(grads, 1000, 10, 2, 10, 0);
  EXPECT_EQ(r.buckets, 0);
  EXPECT_DOUBLE_EQ(r.exposed_s, 40);
  // A fast link (0.1 s per tensor), a tensor per bucket: only the last one's time is left after the backward.
  r = BucketedAllReduceSeconds(grads, 0, 10, 2, 1000, 0);
  EXPECT_EQ(r.buckets, 4);
  EXPECT_NEAR(r.exposed_s, 0.1, 1e-12);
  // 3 of 100 B, buckets of 150 B: the first (200 B) at 6.67 s, the third alone after the backward.
  r = BucketedAllReduceSeconds({100, 100, 100}, 150, 9, 2, 10, 0);
  EXPECT_EQ(r.buckets, 1);
  EXPECT_DOUBLE_EQ(r.exposed_s, 6 + 20 + 10 - 9);
}

// Each gradient in its own bucket as the backward makes it: the plan's step holds only what runs past the backward.
TEST(DataParallel, PerTensorBucketsHideTheAllReduceUnderTheBackward) {
  ChainSpec spec;
  spec.batch = 2;
  spec.widths = {16, 16, 16};
  const ir::Graph g = BuildChain(spec);
  DeviceProfile device = RoundDevice();
  auto ctx = Context(g, device, spec.batch);
  const PartitionPlan one = Plan(*ctx, 1, 4, 2, 1);
  const PartitionPlan after = Plan(*ctx, 1, 8, 2, 2);
  const PartitionPlan during = Plan(*ctx, 1, 8, 2, 2, /*bucket_bytes=*/0);
  EXPECT_EQ(after.stages[0].data_parallel_buckets, 0);
  ExpectRelativelyNear(after.data_parallel_exposed_ms, after.data_parallel_allreduce_ms);
  EXPECT_EQ(during.stages[0].data_parallel_buckets, 6);
  ExpectRelativelyNear(during.data_parallel_allreduce_ms, after.data_parallel_allreduce_ms);
  EXPECT_LT(during.data_parallel_exposed_ms, during.data_parallel_allreduce_ms);
  EXPECT_GT(during.data_parallel_exposed_ms, 0);  // at least the last gradient's all-reduce
  ExpectRelativelyNear(during.step_ms, one.step_ms + during.data_parallel_exposed_ms);
  // Written and read back.
  absl::StatusOr<PartitionPlan> back = PlanFromJson(nlohmann::json::parse(PlanToJson(during).dump()), "plan.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_DOUBLE_EQ(back->data_parallel_exposed_ms, during.data_parallel_exposed_ms);
  EXPECT_EQ(back->stages[0].data_parallel_buckets, 6);
}

TEST(DataParallel, TheSlowestStagesAllReduceFollowsThePipeline) {
  ChainSpec spec;
  spec.batch = 2;
  const ir::Graph g = BuildChain(spec);
  DeviceProfile device = RoundDevice();
  device.data_parallel_bandwidth = 10e9;  // the replicas on other nodes: 10 GB/s, not the stages' 100
  auto ctx = Context(g, device, spec.batch);
  const PartitionPlan one = Plan(*ctx, /*stages=*/2, /*batch=*/8, /*microbatches=*/4, /*data_parallel=*/1);
  const PartitionPlan two = Plan(*ctx, /*stages=*/2, /*batch=*/16, /*microbatches=*/4, /*data_parallel=*/2);
  ASSERT_EQ(two.stages.size(), 2u);
  double slowest_ms = 0;
  int64_t all_bytes = 0;
  for (size_t k = 0; k < two.stages.size(); ++k) {
    const StagePlan& s = two.stages[k];
    EXPECT_EQ(s.forward_nodes, one.stages[k].forward_nodes) << "stage " << k;  // the same cut
    const int64_t bytes = GradientBytes(g, s.parameters);
    EXPECT_EQ(s.data_parallel_bytes, bytes) << "stage " << k;
    const double ms = 2.0 * (2 - 1) / 2 * bytes / 10e9 * 1e3;
    ExpectRelativelyNear(s.data_parallel_allreduce_ms, ms);
    slowest_ms = std::max(slowest_ms, ms);
    all_bytes += bytes;
    EXPECT_EQ(s.memory.total, one.stages[k].memory.total) << "stage " << k;
  }
  // Every parameter's gradient, once: 4 layers of 16x16 + 16 and a 16x4 + 4 head.
  EXPECT_EQ(all_bytes, 4 * (4 * (16 * 16 + 16) + 16 * 4 + 4));
  ExpectRelativelyNear(two.step_ms, one.step_ms + slowest_ms);
  ExpectRelativelyNear(two.data_parallel_allreduce_ms, slowest_ms);

  // Reported: D, the world, the per-replica batch and the all-reduce per stage.
  const std::string text = ReportText(two);
  EXPECT_THAT(text, HasSubstr("batch 16 = 2 replicas x 8 = 2 x 4 micro-batches x 2, 2 stages x 2 replicas = 4 ranks"));
  EXPECT_THAT(text, HasSubstr("+ data-parallel all-reduce " + FormatMs(slowest_ms)));
  EXPECT_THAT(text, HasSubstr("all-reduce stage 1: "));
  EXPECT_THAT(text, HasSubstr("in place (no memory added)"));
  const std::string html = ReportHtml(two);
  EXPECT_THAT(html, HasSubstr("<th>all-reduce</th>"));
  EXPECT_THAT(html, HasSubstr("2 stages x 2 replicas = 4 ranks"));
  EXPECT_EQ(ReportText(one).find("all-reduce"), std::string::npos);

  // plan.json keeps one replica's batch (what `train --plan --data-parallel` checks) and D.
  const nlohmann::json j = nlohmann::json::parse(PlanToJson(two).dump());
  EXPECT_EQ(j["config"]["batch"], 8);
  EXPECT_EQ(j["config"]["data_parallel"], 2);
  EXPECT_EQ(j["config"]["world"], 4);
  absl::StatusOr<PartitionPlan> back = PlanFromJson(j, "plan.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->data_parallel, 2);
  EXPECT_EQ(back->batch, 8);
  EXPECT_DOUBLE_EQ(back->data_parallel_allreduce_ms, two.data_parallel_allreduce_ms);
  for (size_t k = 0; k < back->stages.size(); ++k) {
    EXPECT_DOUBLE_EQ(back->stages[k].data_parallel_allreduce_ms, two.stages[k].data_parallel_allreduce_ms);
    EXPECT_EQ(back->stages[k].data_parallel_bytes, two.stages[k].data_parallel_bytes);
  }
  // A plan written before data parallelism loads as one replica.
  nlohmann::json old = j;
  old["config"].erase("data_parallel");
  old["config"].erase("world");
  old["predicted"].erase("data_parallel_allreduce_ms");
  for (nlohmann::json& s : old["stages"]) {
    for (const char* key : {"data_parallel_allreduce_ms", "data_parallel_bytes", "data_parallel_tensors"}) {
      s["predicted"].erase(key);
    }
  }
  absl::StatusOr<PartitionPlan> older = PlanFromJson(old, "plan.json");
  ASSERT_TRUE(older.ok()) << older.status();
  EXPECT_EQ(older->data_parallel, 1);
  nlohmann::json zero = j;
  zero["config"]["data_parallel"] = 0;
  EXPECT_THAT(std::string(PlanFromJson(zero, "plan.json").status().message()), HasSubstr("config.data_parallel"));
}

TEST(DataParallel, DeviceKeyForTheReplicasLink) {
  const nlohmann::json base = {{"name", "x"},
                               {"memory", "1GiB"},
                               {"peak_tflops", {{"bf16", 1}}},
                               {"memory_bandwidth_gbps", 1},
                               {"link_bandwidth_gbps", 100}};
  absl::StatusOr<DeviceProfile> plain = DeviceFromJson(base, "d.json");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->data_parallel_link(), 100e9);  // default: the stages' link
  nlohmann::json with = base;
  with["data_parallel_bandwidth_gbps"] = 25;
  absl::StatusOr<DeviceProfile> dp = DeviceFromJson(with, "d.json");
  ASSERT_TRUE(dp.ok()) << dp.status();
  EXPECT_EQ(dp->data_parallel_link(), 25e9);
  EXPECT_EQ(DeviceToJson(*dp)["data_parallel_bandwidth_gbps"], 25);
  with["data_parallel_bandwidth_gbps"] = 0;
  EXPECT_THAT(std::string(DeviceFromJson(with, "d.json").status().message()),
              HasSubstr("'data_parallel_bandwidth_gbps' must be positive"));
}

TEST(DataParallel, BadOptionsNameTheFlags) {
  PartitionOptions o;
  o.batch = 8;
  o.microbatches = 2;
  o.data_parallel = 0;
  EXPECT_THAT(std::string(ValidateBatch(o).message()), HasSubstr("--data-parallel must be >= 1, got 0"));
  o.data_parallel = 3;
  EXPECT_THAT(std::string(ValidateBatch(o).message()),
              HasSubstr("--batch 8 is not divisible by --microbatches 2 x --data-parallel 3"));
  o.data_parallel = 8;
  EXPECT_THAT(std::string(ValidateBatch(o).message()),
              HasSubstr("--microbatches 2 x --data-parallel 8 is larger than --batch 8"));
  o.data_parallel = 4;
  EXPECT_TRUE(ValidateBatch(o).ok());
}

TEST(DataParallel, SweepAxis) {
  absl::StatusOr<SweepSpec> plain = ParseSweepSpec("batch=8 microbatches=2 stages=1");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->data_parallel, std::vector<int64_t>{1});
  absl::StatusOr<SweepSpec> spec = ParseSweepSpec("data_parallel=1,2,4 batch=8 microbatches=2 stages=1");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data_parallel, (std::vector<int64_t>{1, 2, 4}));
  EXPECT_THAT(std::string(ParseSweepSpec("batch=8 microbatches=2 stages=1 data_parallel=0").status().message()),
              HasSubstr("'data_parallel' value '0'"));

  EXPECT_FALSE(InvalidSweepRow(8, 2, 1, 4).has_value());
  std::optional<SweepRow> more = InvalidSweepRow(8, 2, 1, 8);
  ASSERT_TRUE(more.has_value());
  EXPECT_EQ(more->note, "more micro-batches x data-parallel replicas than samples");
  std::optional<SweepRow> uneven = InvalidSweepRow(8, 2, 1, 3);
  ASSERT_TRUE(uneven.has_value());
  EXPECT_EQ(uneven->note, "batch not divisible by micro-batches x data-parallel replicas");

  ChainSpec chain;
  chain.batch = 2;
  const ir::Graph g = BuildChain(chain);
  auto ctx = Context(g, RoundDevice(), chain.batch);
  const SweepRow row = SweepPoint(*ctx, PartitionOptions{}, /*batch=*/8, /*microbatches=*/2, /*stages=*/1,
                                  /*data_parallel=*/2);
  EXPECT_EQ(row.status, "ok");
  EXPECT_EQ(row.data_parallel, 2);
  EXPECT_EQ(row.microbatch_size, 2);
  EXPECT_DOUBLE_EQ(row.step_ms, Plan(*ctx, 1, 8, 2, 2).step_ms);
  EXPECT_THAT(SweepCsv({row}, 1), HasSubstr("batch,microbatches,stages,data_parallel,microbatch_size,status"));
  EXPECT_THAT(SweepCsv({row}, 1), HasSubstr("\n8,2,1,2,2,ok,"));
}

}  // namespace
}  // namespace onnxpipe::partitioner
