// The memory planner on a real training graph (tiny_gpt with AdamW, tied embedding): the persistent
// regions hold exactly the parameters, their gradients and two Adam moments each, and no two arena
// values that are live at the same time share a byte (brute force over all pairs).
#include <algorithm>
#include <cmath>

#include "executor/cpu/workspace.h"
#include "executor/train/training_graph.h"
#include "gtest/gtest.h"
#include "partitioner/memory_planner.h"
#include "tools/model.h"

namespace onnxpipe {
namespace {

using partitioner::MemoryRegion;

int64_t Align64(int64_t x) { return (x + 63) / 64 * 64; }

TEST(TrainingPlan, TinyGptAdamW) {
  const std::string src = ONNXPIPE_SOURCE_DIR;
  absl::StatusOr<tools::Model> model = tools::ImportModel(src + "/models/tiny_gpt.onnx", false);
  ASSERT_TRUE(model.ok()) << model.status();
  tools::ModelOptions mo;
  mo.batch = 2;
  mo.seq = 16;
  ASSERT_TRUE(tools::PrepareModel(*model, mo).ok());
  train::TrainOptions o;
  o.batch = 2;
  o.steps = 1;
  o.lr = 1e-3;
  o.optimizer.kind = autodiff::OptimizerKind::kAdamW;
  o.logits = "logits";
  o.freeze_regex = "^(blocks\\.0\\.attn\\.mask|blocks\\.1\\.attn\\.mask)$";
  absl::StatusOr<autodiff::TrainingGraph> tg = autodiff::BuildTrainingGraph(*model->graph, o);
  ASSERT_TRUE(tg.ok()) << tg.status();
  const ir::Graph& g = tg->graph;
  partitioner::MemoryPlanOptions popts;
  popts.workspace_bytes = cpu::CpuWorkspaceBytes;  // kernel scratch is planned too
  absl::StatusOr<partitioner::MemoryPlan> plan = partitioner::PlanMemory(g, g.LiveNodes(), popts);
  ASSERT_TRUE(plan.ok()) << plan.status();

  int64_t param_bytes = 0;
  for (ir::ValueId v : tg->params) {
    EXPECT_EQ(plan->values[v].region, MemoryRegion::kParameters) << g.value(v).name;
    param_bytes += Align64(g.value(v).constant->num_bytes());
  }
  EXPECT_EQ(plan->parameter_bytes, param_bytes);
  EXPECT_EQ(plan->gradient_bytes, param_bytes);  // one gradient per parameter, same dtype/shape
  EXPECT_EQ(plan->optimizer_state_bytes, 2 * param_bytes);
  EXPECT_EQ(tg->optimizer.state_bytes, 2 * tg->num_trainable_parameters() * 4);
  // The frozen causal masks are not parameters (folding may even have dropped them).
  EXPECT_NE(plan->values[g.FindValue("blocks.0.attn.mask")].region, MemoryRegion::kParameters);
  EXPECT_GE(plan->arena_bytes, plan->peak_bytes);
  EXPECT_GT(plan->peak_bytes, 0);

  std::vector<ir::ValueId> arena;
  for (ir::ValueId v = 0; v < g.num_values(); ++v)
    if (plan->values[v].region == MemoryRegion::kArena && plan->values[v].bytes > 0) arena.push_back(v);
  ASSERT_GT(arena.size(), 100u);
  for (size_t i = 0; i < arena.size(); ++i) {
    const auto& a = plan->values[arena[i]];
    ASSERT_LE(a.offset + a.bytes, plan->arena_bytes);
    for (size_t j = i + 1; j < arena.size(); ++j) {
      const auto& b = plan->values[arena[j]];
      if (a.buffer == b.buffer) continue;
      const bool live = a.live_begin <= b.live_end && b.live_begin <= a.live_end;
      const bool overlap = a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
      ASSERT_FALSE(live && overlap) << g.value(arena[i]).name << " and " << g.value(arena[j]).name;
    }
  }
}

}  // namespace
}  // namespace onnxpipe
