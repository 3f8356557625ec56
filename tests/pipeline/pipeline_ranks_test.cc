// Ranks: one PipelineExecutor per rank over a world comm, threads standing in for processes. Claims:
// - each rank feeds only the data inputs its stage reads (and the labels where the loss is), and the ranks train bit
//   for bit as the one-process run;
// - a rank built from its stage program file (stage_file.h: no training graph, no other stage) trains bit for bit as
//   the one-process run, and the file holds the stage's nodes as the compiled plan has them;
// - a stage file that is truncated, of another plan, of another model, or of other training options is refused with
//   an error naming the file and what differs.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <thread>

#include "executor/comm/inprocess_comm.h"
#include "executor/io/atomic_file.h"
#include "executor/pipeline/stage_file.h"
#include "frontend/ir/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/pipeline/pipeline_test_util.h"

namespace onnxpipe::pipeline::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

const ModelFixture& Gpt() {
  static std::unique_ptr<ModelFixture> f = [] {
    absl::StatusOr<std::unique_ptr<ModelFixture>> m = ModelFixture::Load("tiny_gpt");
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *std::move(m) : nullptr;
  }();
  return *f;
}

RunConfig TwoStages() {
  RunConfig c;
  c.dtype = ir::DType::kF32;
  c.stages = 2;
  c.microbatches = 2;
  return c;
}

// The world of c.stages ranks, each running `work(rank)` on a thread of its own.
class Ranks {
 public:
  explicit Ranks(int32_t n) : n_(n), group_(comm::InProcessGroup::Create(n, 30)), status_(n) {
    for (int32_t r = 0; r < n; ++r) ends_.push_back(group_->Endpoint(r));
  }
  comm::Comm* end(int32_t r) { return ends_[r].get(); }
  // OK when every rank's work is.
  absl::Status OnEach(const std::function<absl::Status(int32_t)>& work) {
    std::vector<std::thread> threads;
    for (int32_t r = 0; r < n_; ++r) threads.emplace_back([&, r] { status_[r] = work(r); });
    for (std::thread& t : threads) t.join();
    for (int32_t r = 0; r < n_; ++r) {
      if (!status_[r].ok()) return Annotate(status_[r], "rank " + std::to_string(r));
    }
    return absl::OkStatus();
  }

 private:
  int32_t n_;
  std::shared_ptr<comm::InProcessGroup> group_;
  std::vector<std::unique_ptr<comm::Comm>> ends_;
  std::vector<absl::Status> status_;
};

ExecutorOptions RankOptions(const RunConfig& c, comm::Comm* world, int32_t rank) {
  ExecutorOptions eo;
  eo.seed = c.seed;
  eo.world = world;
  eo.topology = Topology{c.stages, 1, rank};
  return eo;
}

// c.steps steps of the ranks' executors, each fed only its data_inputs(); every rank's losses and norms must be the
// one-process run's, bit for bit.
void ExpectRanksTrainAs(const ModelFixture& f, const RunConfig& c, Ranks& ranks,
                        std::vector<std::unique_ptr<PipelineExecutor>>& ex, const RunResult& one) {
  for (int32_t k = 0; k < c.steps; ++k) {
    const StepFeeds feeds = f.Feeds(k, c.lr, c.dtype);
    std::vector<PipelineStepResult> got(c.stages);
    const absl::Status st = ranks.OnEach([&](int32_t r) -> absl::Status {
      StepFeeds mine = feeds;
      mine.batch.clear();
      for (const std::string& name : ex[r]->data_inputs()) mine.batch[name] = feeds.batch.at(name);
      ASSIGN_OR_RETURN(got[r], ex[r]->Step(mine));
      return absl::OkStatus();
    });
    ASSERT_TRUE(st.ok()) << st;
    for (int32_t r = 0; r < c.stages; ++r) {
      EXPECT_EQ(got[r].loss, one.losses[k]) << "rank " << r << " step " << k;
      EXPECT_EQ(got[r].grad_norm, one.grad_norms[k]) << "rank " << r << " step " << k;
    }
  }
}

TEST(PipelineRanks, EachRankFeedsOnlyItsStagesInputsAndTrainsAsOneProcess) {
  const ModelFixture& f = Gpt();
  const RunConfig c = TwoStages();
  absl::StatusOr<ir::Graph> g = f.MicrobatchTrainingGraph(c);
  ASSERT_TRUE(g.ok()) << g.status();
  absl::StatusOr<RunResult> one = f.Pipeline(c, &*g);
  ASSERT_TRUE(one.ok()) << one.status();
  absl::StatusOr<partitioner::PartitionPlan> plan = f.Plan(c, *g);
  ASSERT_TRUE(plan.ok()) << plan.status();
  Ranks ranks(c.stages);
  std::vector<std::unique_ptr<PipelineExecutor>> ex(c.stages);
  ASSERT_TRUE(ranks
                  .OnEach([&](int32_t r) -> absl::Status {
                    ASSIGN_OR_RETURN(partitioner::CompiledPlan compiled, partitioner::CompilePlan(*g, *plan));
                    ASSIGN_OR_RETURN(
                        ex[r], PipelineExecutor::Create(*g, std::move(compiled), RankOptions(c, ranks.end(r), r)));
                    return absl::OkStatus();
                  })
                  .ok());
  const StepFeeds all = f.Feeds(0, c.lr, c.dtype);
  std::set<std::string> fed_anywhere;
  for (int32_t r = 0; r < c.stages; ++r) {
    const PipelineProgram& p = ex[r]->program();
    std::set<std::string> want;
    for (ir::ValueId v : p.stages[r].data_inputs) want.insert(p.stages[r].graph.value(v).name);
    if (p.loss_stage == r) want.insert("labels");
    const std::vector<std::string>& fed = ex[r]->data_inputs();
    EXPECT_EQ(std::set<std::string>(fed.begin(), fed.end()), want) << "rank " << r;
    EXPECT_LT(fed.size(), all.batch.size()) << "rank " << r << " feeds every input";
    fed_anywhere.insert(fed.begin(), fed.end());
  }
  EXPECT_EQ(fed_anywhere.size(), all.batch.size());
  ExpectRanksTrainAs(f, c, ranks, ex, *one);
}

// The plan, its compiled program and the stage files of tiny_gpt at K = 2, M = 2, in a folder of their own.
struct WrittenPlan {
  ir::Graph graph;
  partitioner::PartitionPlan plan;
  partitioner::CompiledPlan compiled;
  autodiff::TrainingGraphSpec spec;
  fs::path dir;
};

absl::StatusOr<WrittenPlan> WritePlan(const ModelFixture& f, const RunConfig& c, const std::string& tag) {
  WrittenPlan w;
  ASSIGN_OR_RETURN(w.graph, f.MicrobatchTrainingGraph(c));
  ASSIGN_OR_RETURN(w.plan, f.Plan(c, w.graph));
  ASSIGN_OR_RETURN(w.compiled, partitioner::CompilePlan(w.graph, w.plan));
  ASSIGN_OR_RETURN(const train::TrainOptions options, f.Options(c, f.batch()));
  w.spec = options;
  autodiff::TrainingGraph tg;
  tg.graph = w.graph;
  w.dir = fs::temp_directory_path() / ("onnxpipe_stage_file_" + tag + "_" + std::to_string(getpid()));
  fs::remove_all(w.dir);
  fs::create_directories(w.dir);
  StageFileSource src;
  src.training = &tg;
  src.model = &f.imported();
  src.spec = w.spec;
  RETURN_IF_ERROR(WriteStageFiles(w.dir.string(), w.compiled, src));
  return w;
}

// Node by node: the loaded stage runs the compiled stage's nodes (op, attributes, operands by name) in its order.
void ExpectSameNodes(const partitioner::StageProgram& got, const partitioner::StageProgram& want) {
  const std::vector<ir::NodeId>* lists[][2] = {
      {&got.forward, &want.forward}, {&got.backward, &want.backward}, {&got.post, &want.post}};
  for (const auto& [g, w] : lists) {
    ASSERT_EQ(g->size(), w->size());
    for (size_t i = 0; i < w->size(); ++i) {
      const ir::Node& a = got.graph.node((*g)[i]);
      const ir::Node& b = want.graph.node((*w)[i]);
      EXPECT_EQ(a.name, b.name);
      EXPECT_EQ(a.op, b.op) << b.name;
      EXPECT_TRUE(a.attrs == b.attrs) << b.name;
      ASSERT_EQ(a.inputs.size(), b.inputs.size()) << b.name;
      for (size_t k = 0; k < b.inputs.size(); ++k) {
        if (b.inputs[k] == ir::kNoValue) {
          EXPECT_EQ(a.inputs[k], ir::kNoValue);
          continue;
        }
        const ir::Value& va = got.graph.value(a.inputs[k]);
        const ir::Value& vb = want.graph.value(b.inputs[k]);
        EXPECT_EQ(va.name, vb.name) << b.name << " input " << k;
        EXPECT_EQ(va.constant.has_value(), vb.constant.has_value()) << vb.name;
        if (va.constant && vb.constant && vb.constant->has_data()) {
          EXPECT_TRUE(va.constant->BitwiseEquals(*vb.constant)) << vb.name;
        }
      }
    }
  }
}

TEST(PipelineRanks, RanksBuiltFromTheirStageFilesTrainAsOneProcess) {
  const ModelFixture& f = Gpt();
  const RunConfig c = TwoStages();
  absl::StatusOr<WrittenPlan> w = WritePlan(f, c, "run");
  ASSERT_TRUE(w.ok()) << w.status();
  absl::StatusOr<RunResult> one = f.Pipeline(c, &w->graph);
  ASSERT_TRUE(one.ok()) << one.status();
  Ranks ranks(c.stages);
  std::vector<std::unique_ptr<PipelineExecutor>> ex(c.stages);
  std::vector<LoadedStage> loaded(c.stages);
  for (int32_t r = 0; r < c.stages; ++r) {
    absl::StatusOr<LoadedStage> l = ReadStageFile(w->dir.string(), r, w->plan, f.imported());
    ASSERT_TRUE(l.ok()) << l.status();
    ExpectSameNodes(l->plan.program.stages[r], w->compiled.program.stages[r]);
    EXPECT_LT(l->num_nodes, static_cast<int64_t>(w->graph.num_live_nodes())) << "rank " << r << " holds every node";
    const absl::Status matches = CheckStageMatchesRun(*l, "stage file", w->spec, f.imported());
    EXPECT_TRUE(matches.ok()) << matches;
    loaded[r] = *std::move(l);
  }
  const absl::Status created = ranks.OnEach([&](int32_t r) -> absl::Status {
    ASSIGN_OR_RETURN(ex[r], PipelineExecutor::Create(std::move(loaded[r].facts), std::move(loaded[r].plan),
                                                     RankOptions(c, ranks.end(r), r)));
    return absl::OkStatus();
  });
  ASSERT_TRUE(created.ok()) << created;
  ExpectRanksTrainAs(f, c, ranks, ex, *one);
  fs::remove_all(w->dir);
}

TEST(PipelineRanks, AStageFileThatDoesNotFitTheRunIsRefusedNamingWhatDiffers) {
  const ModelFixture& f = Gpt();
  const RunConfig c = TwoStages();
  absl::StatusOr<WrittenPlan> w = WritePlan(f, c, "errors");
  ASSERT_TRUE(w.ok()) << w.status();
  const std::string dir = w->dir.string(), file = StageFilePath(dir, 1);

  absl::StatusOr<LoadedStage> good = ReadStageFile(dir, 1, w->plan, f.imported());
  ASSERT_TRUE(good.ok()) << good.status();
  // Other training options, another trained set.
  autodiff::TrainingGraphSpec clipped = w->spec;
  clipped.optimizer.clip_norm += 0.5;
  EXPECT_THAT(std::string(CheckStageMatchesRun(*good, file, clipped, f.imported()).message()),
              AllOf(HasSubstr(file), HasSubstr("--clip-norm"), HasSubstr("re-run onnxpipe partition")));
  ir::Graph frozen = f.imported();
  const auto& params = good->facts.parameters;
  std::string trained_here;
  for (const auto& [name, stage] : params)
    if (stage == 1 && frozen.FindValue(name) != ir::kNoValue) trained_here = name;
  ASSERT_FALSE(trained_here.empty());
  frozen.value(frozen.FindValue(trained_here)).param_state = ir::ParamState::kFrozen;
  EXPECT_THAT(std::string(CheckStageMatchesRun(*good, file, w->spec, frozen).message()),
              AllOf(HasSubstr(trained_here), HasSubstr("--freeze")));

  // Another model: one of the stage's initializers changed.
  ir::Graph other = f.imported();
  ir::Tensor& t = *other.value(other.FindValue(trained_here)).constant;
  ir::Tensor changed(t.dtype(), t.dims());
  std::memcpy(changed.raw(), t.raw(), static_cast<size_t>(t.num_bytes()));
  changed.mutable_data<float>()[0] += 1.0f;
  t = changed;
  EXPECT_THAT(std::string(ReadStageFile(dir, 1, w->plan, other).status().message()),
              AllOf(HasSubstr(file), HasSubstr(trained_here), HasSubstr("re-run onnxpipe partition")));

  // Another plan's file (the actions differ), and a truncated file.
  partitioner::PartitionPlan gpipe = w->plan;
  std::swap(gpipe.stages[0].actions, gpipe.stages[1].actions);
  EXPECT_THAT(std::string(ReadStageFile(dir, 1, gpipe, f.imported()).status().message()),
              AllOf(HasSubstr(file), HasSubstr("another plan")));
  absl::StatusOr<std::string> bytes = io::ReadFileToString(file);
  ASSERT_TRUE(bytes.ok());
  // Damaged files (bytes flipped anywhere) are refused by their checksum, never read.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 100; ++trial) {
    std::string damaged = *bytes;
    for (int k = 0; k < 1 + trial % 4; ++k) damaged[rng() % damaged.size()] ^= static_cast<char>(1 + rng() % 255);
    std::ofstream(file, std::ios::binary | std::ios::trunc) << damaged;
    EXPECT_THAT(std::string(ReadStageFile(dir, 1, w->plan, f.imported()).status().message()),
                AllOf(HasSubstr(file), HasSubstr("damaged or incomplete")))
        << "trial " << trial;
  }
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes->substr(0, bytes->size() / 2);
  EXPECT_THAT(std::string(ReadStageFile(dir, 1, w->plan, f.imported()).status().message()),
              AllOf(HasSubstr(file), HasSubstr("damaged or incomplete")));
  fs::remove(file);
  EXPECT_THAT(std::string(ReadStageFile(dir, 1, w->plan, f.imported()).status().message()), HasSubstr(file));
  fs::remove_all(w->dir);
}

}  // namespace
}  // namespace onnxpipe::pipeline::testing
