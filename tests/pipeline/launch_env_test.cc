// The launcher's environment as a rank reads it (tools/distributed.h): torchrun's and Slurm's variables, and the
// CPU threads a rank takes when it shares its node.
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "executor/comm/inprocess_comm.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/distributed.h"

namespace onnxpipe::tools {
namespace {

using ::testing::HasSubstr;

EnvLookup MapEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

TEST(LaunchEnv, TorchrunLocalWorldSize) {
  std::map<std::string, std::string> vars = {{"RANK", "5"},         {"WORLD_SIZE", "8"},
                                             {"LOCAL_RANK", "1"},   {"LOCAL_WORLD_SIZE", "4"},
                                             {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "29500"}};
  absl::StatusOr<std::optional<LaunchEnv>> e = ReadLaunchEnv(MapEnv(vars));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(e->has_value());
  EXPECT_EQ((*e)->local_rank, 1);
  EXPECT_EQ((*e)->local_world_size, 4);
  vars.erase("LOCAL_WORLD_SIZE");
  e = ReadLaunchEnv(MapEnv(vars));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->local_world_size, 0);  // not told
  vars["LOCAL_WORLD_SIZE"] = "four";
  e = ReadLaunchEnv(MapEnv(vars));
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("LOCAL_WORLD_SIZE='four'"));
}

TEST(LaunchEnv, SlurmTasksOnThisNode) {
  std::map<std::string, std::string> vars = {{"SLURM_PROCID", "9"},
                                             {"SLURM_STEP_ID", "0"},
                                             {"SLURM_STEP_NUM_TASKS", "11"},
                                             {"SLURM_LOCALID", "1"},
                                             {"SLURM_NODEID", "2"},
                                             {"SLURM_STEP_TASKS_PER_NODE", "4(x2),3"},
                                             {"SLURM_STEP_NODELIST", "gpu[01-03]"},
                                             {"SLURM_JOB_ID", "7"}};
  absl::StatusOr<std::optional<LaunchEnv>> e = ReadLaunchEnv(MapEnv(vars));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->local_world_size, 3);
  vars["SLURM_NODEID"] = "1";
  e = ReadLaunchEnv(MapEnv(vars));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->local_world_size, 4);
  vars.erase("SLURM_NODEID");
  e = ReadLaunchEnv(MapEnv(vars));
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("SLURM_NODEID is not set"));
}

TEST(LaunchEnv, SlurmTasksPerNodeList) {
  EXPECT_EQ(SlurmTasksOnNode("8", 0).value(), 8);
  EXPECT_EQ(SlurmTasksOnNode("2(x3),1,5(x2)", 0).value(), 2);
  EXPECT_EQ(SlurmTasksOnNode("2(x3),1,5(x2)", 2).value(), 2);
  EXPECT_EQ(SlurmTasksOnNode("2(x3),1,5(x2)", 3).value(), 1);
  EXPECT_EQ(SlurmTasksOnNode("2(x3),1,5(x2)", 5).value(), 5);
  absl::StatusOr<int> past = SlurmTasksOnNode("2(x3),1,5(x2)", 6);
  ASSERT_FALSE(past.ok());
  EXPECT_THAT(past.status().message(), HasSubstr("list 6 nodes, none for SLURM_NODEID 6"));
  for (const char* bad : {"", "x", "2(x)", "2(x3", "0", "2(x0)", "3,,1"}) {
    absl::StatusOr<int> r = SlurmTasksOnNode(bad, 5);
    EXPECT_FALSE(r.ok()) << "'" << bad << "'";
  }
}

TEST(LaunchEnv, RankThreadsShareAnUnboundNode) {
  EXPECT_EQ(RankThreads(16, 16, 4), 4);  // four ranks on a 16-CPU node, none bound
  EXPECT_EQ(RankThreads(16, 16, 3), 5);
  EXPECT_EQ(RankThreads(2, 2, 4), 1);     // never below one
  EXPECT_EQ(RankThreads(16, 16, 1), 16);  // alone
  EXPECT_EQ(RankThreads(16, 16, 0), 16);  // not told
  EXPECT_EQ(RankThreads(4, 64, 8), 4);    // bound by the launcher to 4 CPUs: they are its own
}

// Each rank of an in-process world of `profiles.size()` calls AgreeOnDeviceProfile with its own profile.
std::vector<absl::Status> Agree(const std::vector<std::string>& profiles) {
  std::shared_ptr<comm::InProcessGroup> group = comm::InProcessGroup::Create(static_cast<int>(profiles.size()), 30);
  std::vector<absl::Status> got(profiles.size());
  std::vector<std::thread> ranks;
  for (size_t r = 0; r < profiles.size(); ++r) {
    ranks.emplace_back([&, r] {
      std::unique_ptr<comm::Comm> c = group->Endpoint(static_cast<int>(r));
      got[r] = AgreeOnDeviceProfile(*c, profiles[r]);
    });
  }
  for (std::thread& t : ranks) t.join();
  return got;
}

TEST(AgreeOnDeviceProfile, RanksOfOneKindOfDeviceAgree) {
  for (const absl::Status& st : Agree({"h100-80gb", "h100-80gb", "h100-80gb", "h100-80gb"})) EXPECT_TRUE(st.ok()) << st;
  for (const absl::Status& st : Agree({"cpu", "cpu"})) EXPECT_TRUE(st.ok()) << st;
}

// Every rank refuses, the odd one out anywhere (a sum of indices alone would miss {0, 2, 1}'s middle rank).
TEST(AgreeOnDeviceProfile, EveryRankRefusesWhenOneRunsOnAnotherKind) {
  for (const std::vector<std::string>& profiles : {std::vector<std::string>{"h100-80gb", "a100-80gb"},
                                                   {"h200", "h100-80gb", "a100-80gb", "h100-80gb"},
                                                   {"h100-80gb", "h100-80gb", "h100-80gb", "h200"}}) {
    const std::vector<absl::Status> got = Agree(profiles);
    for (size_t r = 0; r < got.size(); ++r) {
      EXPECT_TRUE(absl::IsInvalidArgument(got[r])) << "rank " << r << ": " << got[r];
      EXPECT_THAT(std::string(got[r].message()), ::testing::AllOf(::testing::HasSubstr("this one: " + profiles[r]),
                                                                  ::testing::HasSubstr("--plan DIR")));
    }
  }
}

}  // namespace
}  // namespace onnxpipe::tools
