// Schedules: the exact GPipe and 1F1B lists for small cases (written out by hand from the
// definitions in REFERENCES.md section 1), their validation over a grid of K and M, in-flight
// counts, bubble fractions against the closed forms, and the simulator's deadlock detection.
#include "executor/pipeline/schedule.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onnxpipe::pipeline {
namespace {

using ::testing::HasSubstr;

TEST(Schedule, GPipeTwoStagesTwoMicrobatches) {
  absl::StatusOr<std::vector<ActionList>> l = BuildSchedule(ScheduleKind::kGPipe, 2, 2);
  ASSERT_TRUE(l.ok()) << l.status();
  using K = ActionKind;
  const ActionList s0 = {{K::kForward, 0, -1},      {K::kSendActivation, 0, 1}, {K::kForward, 1, -1},
                         {K::kSendActivation, 1, 1}, {K::kRecvGradient, 0, 1},   {K::kBackward, 0, -1},
                         {K::kRecvGradient, 1, 1},   {K::kBackward, 1, -1},      {K::kOptimizerStep, -1, -1}};
  const ActionList s1 = {{K::kRecvActivation, 0, 0}, {K::kForward, 0, -1},     {K::kRecvActivation, 1, 0},
                         {K::kForward, 1, -1},       {K::kBackward, 0, -1},    {K::kSendGradient, 0, 0},
                         {K::kBackward, 1, -1},      {K::kSendGradient, 1, 0}, {K::kOptimizerStep, -1, -1}};
  EXPECT_EQ((*l)[0], s0);
  EXPECT_EQ((*l)[1], s1);
}

TEST(Schedule, OneFOneBFourStagesEightMicrobatchesText) {
  absl::StatusOr<std::vector<ActionList>> l = BuildSchedule(ScheduleKind::k1F1B, 4, 8);
  ASSERT_TRUE(l.ok()) << l.status();
  // Warm-up K-s-1 forwards, then alternate, then cool down (Megatron's non-interleaved 1F1B).
  EXPECT_EQ(ScheduleToText(*l),
            "s0: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7 O\n"
            "s1: F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7 O\n"
            "s2: F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7 O\n"
            "s3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 O\n");
}

TEST(Schedule, OneFOneBWithFewerMicrobatchesThanStages) {
  absl::StatusOr<std::vector<ActionList>> l = BuildSchedule(ScheduleKind::k1F1B, 4, 2);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(ScheduleToText(*l),
            "s0: F0 F1 B0 B1 O\n"
            "s1: F0 F1 B0 B1 O\n"
            "s2: F0 F1 B0 B1 O\n"
            "s3: F0 B0 F1 B1 O\n");
}

TEST(Schedule, ValidOverAGridWithTheReferenceInFlightCounts) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    for (int K = 1; K <= 8; ++K) {
      for (int M = 1; M <= 16; ++M) {
        absl::StatusOr<std::vector<ActionList>> l = BuildSchedule(kind, K, M);
        ASSERT_TRUE(l.ok()) << l.status();
        ASSERT_EQ(static_cast<int>(l->size()), K);
        EXPECT_TRUE(ValidateSchedule(*l, kind, M).ok())
            << ScheduleKindName(kind) << " K=" << K << " M=" << M << ": " << ValidateSchedule(*l, kind, M);
        for (int s = 0; s < K; ++s) {
          // GPipe holds every micro-batch; 1F1B at most K - s (stage 0 holds K, the last one 1).
          const int want = kind == ScheduleKind::kGPipe ? M : std::min(M, K - s);
          EXPECT_EQ(MaxInFlight((*l)[s]), want) << ScheduleKindName(kind) << " K=" << K << " M=" << M << " s=" << s;
        }
      }
    }
  }
}

TEST(Schedule, MakespanAndBubbleMatchTheClosedForms) {
  // Unit forward, two-unit backward, no transfer time: both schedules take (M + K - 1) * (1 + 2)
  // and leave a bubble of (K - 1) / (M + K - 1) (REFERENCES.md section 1).
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    for (int K : {1, 2, 4, 8}) {
      for (int M : {1, 4, 8, 32}) {
        absl::StatusOr<std::vector<ActionList>> l = BuildSchedule(kind, K, M);
        ASSERT_TRUE(l.ok());
        absl::StatusOr<SimResult> r = SimulateSchedule(*l);
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_DOUBLE_EQ(r->makespan, 3.0 * (M + K - 1)) << ScheduleKindName(kind) << " K=" << K << " M=" << M;
        EXPECT_NEAR(r->bubble_fraction, static_cast<double>(K - 1) / (M + K - 1), 1e-12);
      }
    }
  }
}

TEST(Schedule, GPipeFourByEightBubbleIsThreeElevenths) {
  absl::StatusOr<std::vector<ActionList>> l = BuildSchedule(ScheduleKind::kGPipe, 4, 8);
  ASSERT_TRUE(l.ok());
  absl::StatusOr<SimResult> r = SimulateSchedule(*l);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->bubble_fraction, 3.0 / 11.0, 1e-12);
  // Stage 3 starts its first forward after the three stages before it: time 3.
  EXPECT_DOUBLE_EQ(r->times[3][1].first, 3.0);  // [0] is RECV_ACT 0
}

TEST(Schedule, ValidationRejectsBackwardBeforeForward) {
  absl::StatusOr<std::vector<ActionList>> l = BuildSchedule(ScheduleKind::kGPipe, 1, 2);
  ASSERT_TRUE(l.ok());
  std::swap((*l)[0][0], (*l)[0][2]);  // B0 F1 F0 B1 -> B0 first
  absl::Status st = ValidateSchedule(*l, ScheduleKind::kGPipe, 2);
  EXPECT_THAT(st.message(), HasSubstr("backward before the micro-batch's forward"));
}

TEST(Schedule, ValidationRejectsAMissingReceive) {
  absl::StatusOr<std::vector<ActionList>> l = BuildSchedule(ScheduleKind::k1F1B, 2, 2);
  ASSERT_TRUE(l.ok());
  ActionList& s1 = (*l)[1];
  s1.erase(s1.begin());  // RECV_ACT 0 gone
  absl::Status st = ValidateSchedule(*l, ScheduleKind::k1F1B, 2);
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("stage 1"));
}

TEST(Schedule, ValidationRejectsTooManyInFlight) {
  // A GPipe list set passed off as 1F1B holds M micro-batches on the last stage, not 1.
  absl::StatusOr<std::vector<ActionList>> l = BuildSchedule(ScheduleKind::kGPipe, 2, 4);
  ASSERT_TRUE(l.ok());
  absl::Status st = ValidateSchedule(*l, ScheduleKind::k1F1B, 4);
  EXPECT_THAT(st.message(), HasSubstr("in flight"));
}

TEST(Schedule, SimulatorReportsADeadlock) {
  // Stage 1 runs its backwards in the opposite order from stage 0's expectation... and stage 0
  // waits for gradient 1 before it sends activation 1: a cycle.
  absl::StatusOr<std::vector<ActionList>> l = BuildSchedule(ScheduleKind::kGPipe, 2, 2);
  ASSERT_TRUE(l.ok());
  ActionList& s0 = (*l)[0];
  // s0: F0 SA0 F1 SA1 RG0 B0 RG1 B1 O  ->  F0 SA0 RG0 B0 F1 SA1 RG1 B1 O, while stage 1 (GPipe) wants
  // both activations before its first backward.
  ActionList reordered = {s0[0], s0[1], s0[4], s0[5], s0[2], s0[3], s0[6], s0[7], s0[8]};
  s0 = reordered;
  absl::StatusOr<SimResult> r = SimulateSchedule(*l);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("deadlocks"));
  EXPECT_THAT(r.status().message(), HasSubstr("stage 0 waits in 'RECV_GRAD0'"));
  EXPECT_THAT(r.status().message(), HasSubstr("stage 1 waits in 'RECV_ACT1'"));
}

TEST(Schedule, SimulatorRejectsUnreceivedAndDoubleMessages) {
  std::vector<std::vector<SimAction>> a(2);
  a[0].push_back({"send", 1, {}, {7}});
  a[1].push_back({"idle", 1, {}, {}});
  EXPECT_THAT(Simulate(a).status().message(), HasSubstr("never received"));
  a[1][0].recvs = {7};
  a[0].push_back({"send again", 1, {}, {7}});
  EXPECT_THAT(Simulate(a).status().message(), HasSubstr("a second time"));
}

TEST(Schedule, ParseNames) {
  EXPECT_EQ(*ParseScheduleKind("gpipe"), ScheduleKind::kGPipe);
  EXPECT_EQ(*ParseScheduleKind("1f1b"), ScheduleKind::k1F1B);
  EXPECT_THAT(ParseScheduleKind("zb").status().message(), HasSubstr("expected gpipe or 1f1b"));
  EXPECT_FALSE(BuildSchedule(ScheduleKind::kGPipe, 0, 1).ok());
  EXPECT_FALSE(BuildSchedule(ScheduleKind::kGPipe, 1, 0).ok());
}

}  // namespace
}  // namespace onnxpipe::pipeline
