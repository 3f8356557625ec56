// Schedules as action lists: the exact GPipe and 1F1B orders written out by hand from the
// definitions (REFERENCES.md section 1) for K = 2, 3, 4; the properties every list of the grid
// K = 2..8, M = 1..16 must have (every forward before its backward, sends matched by receives,
// 1F1B's micro-batches in flight bounded by K - stage) and that it simulates to the end; backwards in
// parts (recompute regions); the text form of actions; the simulator's closed forms and its
// deadlock report.
#include "partitioner/schedule.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onnxpipe::partitioner {
namespace {

using ::testing::HasSubstr;
using K = ActionKind;

// One line per stage with the compute actions: "s0: F0 F1 B0 B1 O".
std::string Text(const std::vector<ActionList>& lists) {
  std::string out;
  for (size_t s = 0; s < lists.size(); ++s) {
    out += "s" + std::to_string(s) + ":";
    for (const Action& a : lists[s]) {
      if (a.kind == K::kForward || a.kind == K::kBackward || a.kind == K::kRecompute || a.kind == K::kOptimizerStep) {
        out += " " + ActionToString(a);
      }
    }
    out += "\n";
  }
  return out;
}

// Micro-batches forwarded and not yet through the last part of their backward, at most.
int MaxInFlight(const ActionList& list, size_t parts) {
  std::map<int32_t, size_t> done;
  int now = 0, peak = 0;
  for (const Action& a : list) {
    if (a.kind == K::kForward) peak = std::max(peak, ++now);
    if ((a.kind == K::kBackward || a.kind == K::kRecompute) && ++done[a.microbatch] == parts) --now;
  }
  return peak;
}

std::vector<ActionList> Lists(ScheduleKind kind, int32_t stages, int32_t microbatches,
                              const std::vector<StageShape>& shapes = {}) {
  absl::StatusOr<std::vector<ActionList>> l = BuildSchedule(kind, stages, microbatches, shapes);
  EXPECT_TRUE(l.ok()) << l.status();
  return l.ok() ? *l : std::vector<ActionList>();
}

TEST(Schedule, GPipeTwoStagesTwoMicrobatchesWithTransfers) {
  const std::vector<ActionList> l = Lists(ScheduleKind::kGPipe, 2, 2);
  const ActionList s0 = {{K::kForward, 0, -1},       {K::kSendActivation, 0, 1}, {K::kForward, 1, -1},
                         {K::kSendActivation, 1, 1}, {K::kRecvGradient, 0, 1},   {K::kBackward, 0, -1},
                         {K::kRecvGradient, 1, 1},   {K::kBackward, 1, -1},      {K::kOptimizerStep, -1, -1}};
  const ActionList s1 = {{K::kRecvActivation, 0, 0}, {K::kForward, 0, -1},     {K::kRecvActivation, 1, 0},
                         {K::kForward, 1, -1},       {K::kBackward, 0, -1},    {K::kSendGradient, 0, 0},
                         {K::kBackward, 1, -1},      {K::kSendGradient, 1, 0}, {K::kOptimizerStep, -1, -1}};
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[0], s0);
  EXPECT_EQ(l[1], s1);
}

TEST(Schedule, OneFOneBTwoStagesTwoMicrobatchesWithTransfers) {
  const std::vector<ActionList> l = Lists(ScheduleKind::k1F1B, 2, 2);
  auto text = [](const ActionList& list) {
    std::string s;
    for (const Action& a : list) s += (s.empty() ? "" : " ") + ActionToString(a);
    return s;
  };
  // Stage 0 warms up with one forward, then alternates; stage 1 alternates from the start.
  EXPECT_EQ(text(l[0]), "F0 SEND_ACT0>1 F1 SEND_ACT1>1 RECV_GRAD0<1 B0 RECV_GRAD1<1 B1 O");
  EXPECT_EQ(text(l[1]), "RECV_ACT0<0 F0 B0 SEND_GRAD0>0 RECV_ACT1<0 F1 B1 SEND_GRAD1>0 O");
}

// Compute order by hand: GPipe runs every forward, then every backward; 1F1B warms up with
// min(M, K-s-1) forwards, alternates F and B, and cools down with the remaining backwards.
TEST(Schedule, HandCheckedOrders) {
  struct Case {
    ScheduleKind kind;
    int32_t K, M;
    std::string text;
  } cases[] = {
      {ScheduleKind::kGPipe, 2, 1, "s0: F0 B0 O\ns1: F0 B0 O\n"},
      {ScheduleKind::kGPipe, 3, 2, "s0: F0 F1 B0 B1 O\ns1: F0 F1 B0 B1 O\ns2: F0 F1 B0 B1 O\n"},
      {ScheduleKind::kGPipe, 4, 3,
       "s0: F0 F1 F2 B0 B1 B2 O\ns1: F0 F1 F2 B0 B1 B2 O\ns2: F0 F1 F2 B0 B1 B2 O\ns3: F0 F1 F2 B0 B1 B2 O\n"},
      {ScheduleKind::k1F1B, 2, 1, "s0: F0 B0 O\ns1: F0 B0 O\n"},
      {ScheduleKind::k1F1B, 2, 3, "s0: F0 F1 B0 F2 B1 B2 O\ns1: F0 B0 F1 B1 F2 B2 O\n"},
      {ScheduleKind::k1F1B, 3, 2, "s0: F0 F1 B0 B1 O\ns1: F0 F1 B0 B1 O\ns2: F0 B0 F1 B1 O\n"},
      {ScheduleKind::k1F1B, 3, 4,
       "s0: F0 F1 F2 B0 F3 B1 B2 B3 O\ns1: F0 F1 B0 F2 B1 F3 B2 B3 O\ns2: F0 B0 F1 B1 F2 B2 F3 B3 O\n"},
      {ScheduleKind::k1F1B, 4, 1, "s0: F0 B0 O\ns1: F0 B0 O\ns2: F0 B0 O\ns3: F0 B0 O\n"},
      {ScheduleKind::k1F1B, 4, 2, "s0: F0 F1 B0 B1 O\ns1: F0 F1 B0 B1 O\ns2: F0 F1 B0 B1 O\ns3: F0 B0 F1 B1 O\n"},
      {ScheduleKind::k1F1B, 4, 8,
       "s0: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7 O\n"
       "s1: F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7 O\n"
       "s2: F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7 O\n"
       "s3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 O\n"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(Text(Lists(c.kind, c.K, c.M)), c.text) << ScheduleName(c.kind) << " K=" << c.K << " M=" << c.M;
  }
}

// The grid: each forward once and before its backward, each backward once; every send has its
// receive on the peer and the other way round; in flight: GPipe M, 1F1B min(M, K - s), never more
// than K - s; the optimizer step last; and the lists run to the end in the simulator.
TEST(Schedule, EveryListOfTheGridHasThePropertiesOfItsSchedule) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    for (int32_t Kn = 2; Kn <= 8; ++Kn) {
      for (int32_t M = 1; M <= 16; ++M) {
        const std::string where =
            std::string(ScheduleName(kind)) + " K=" + std::to_string(Kn) + " M=" + std::to_string(M);
        const std::vector<ActionList> l = Lists(kind, Kn, M);
        ASSERT_EQ(static_cast<int32_t>(l.size()), Kn) << where;
        std::multiset<std::tuple<int, int, int, int>> sends, recvs;  // (gradient?, m, from, to)
        for (int32_t s = 0; s < Kn; ++s) {
          std::vector<int> forwarded(M, 0), backwarded(M, 0);
          int in_flight = 0, peak = 0;
          for (size_t i = 0; i < l[s].size(); ++i) {
            const Action& a = l[s][i];
            switch (a.kind) {
              case K::kForward:
                ++forwarded[a.microbatch];
                peak = std::max(peak, ++in_flight);
                break;
              case K::kBackward:
                EXPECT_EQ(forwarded[a.microbatch], 1) << where << " s" << s << " B" << a.microbatch;
                ++backwarded[a.microbatch];
                --in_flight;
                break;
              case K::kSendActivation:
                EXPECT_EQ(a.peer, s + 1) << where;
                EXPECT_EQ(l[s][i - 1], (Action{K::kForward, a.microbatch, -1})) << where;  // right after its forward
                sends.insert({0, a.microbatch, s, a.peer});
                break;
              case K::kSendGradient:
                EXPECT_EQ(a.peer, s - 1) << where;
                EXPECT_EQ(l[s][i - 1], (Action{K::kBackward, a.microbatch, -1})) << where;
                sends.insert({1, a.microbatch, s, a.peer});
                break;
              case K::kRecvActivation:
                EXPECT_EQ(l[s][i + 1], (Action{K::kForward, a.microbatch, -1})) << where;  // right before it
                recvs.insert({0, a.microbatch, a.peer, s});
                break;
              case K::kRecvGradient:
                EXPECT_EQ(l[s][i + 1], (Action{K::kBackward, a.microbatch, -1})) << where;
                recvs.insert({1, a.microbatch, a.peer, s});
                break;
              case K::kOptimizerStep:
                EXPECT_EQ(i + 1, l[s].size()) << where;
                break;
              case K::kRecompute:
                ADD_FAILURE() << where << ": recompute without a shape";
                break;
            }
          }
          for (int32_t m = 0; m < M; ++m) {
            EXPECT_EQ(forwarded[m], 1) << where << " s" << s << " m" << m;
            EXPECT_EQ(backwarded[m], 1) << where << " s" << s << " m" << m;
          }
          EXPECT_EQ(peak, kind == ScheduleKind::kGPipe ? M : std::min(M, Kn - s)) << where << " s" << s;
          EXPECT_EQ(peak, InFlightMicrobatches(kind, Kn, s, M)) << where << " s" << s;
          if (kind == ScheduleKind::k1F1B) {
            EXPECT_LE(peak, Kn - s) << where << " s" << s;
          }
        }
        EXPECT_EQ(sends, recvs) << where;
        // Chain: M activations and M gradients over each of the K - 1 boundaries.
        EXPECT_EQ(sends.size(), static_cast<size_t>(2 * M * (Kn - 1))) << where;
        std::vector<StageTiming> t(Kn, StageTiming{1, 2, 0, 0, 0});
        EXPECT_TRUE(Simulate(l, t).ok()) << where << ": " << Simulate(l, t).status();
      }
    }
  }
}

// A stage whose backward recomputes two regions: R0 B0.1 R0.2 B0.3 per micro-batch, the gradient
// received before the first part and sent after the last; the micro-batch stays in flight until
// its last part.
TEST(Schedule, BackwardInPartsWithRecomputeRegions) {
  std::vector<StageShape> shapes = {ChainShape(2, 0), ChainShape(2, 1)};
  shapes[0].backward = {K::kRecompute, K::kBackward, K::kRecompute, K::kBackward};
  const std::vector<ActionList> l = Lists(ScheduleKind::k1F1B, 2, 2, shapes);
  EXPECT_EQ(Text(l), "s0: F0 F1 R0 B0.1 R0.2 B0.3 R1 B1.1 R1.2 B1.3 O\ns1: F0 B0 F1 B1 O\n");
  std::string s0;
  for (const Action& a : l[0]) s0 += ActionToString(a) + " ";
  EXPECT_THAT(s0, HasSubstr("RECV_GRAD0<1 R0 B0.1 R0.2 B0.3 RECV_GRAD1<1"));
  EXPECT_EQ(MaxInFlight(l[0], 4), 2);
  // Timed by part: the backward takes the parts' sum.
  std::vector<StageTiming> t(2, StageTiming{1, 2, 0, 0, 0});
  absl::StatusOr<ScheduleResult> r = Simulate(l, t, {{0.5, 1, 0.25, 1}, {2}});
  ASSERT_TRUE(r.ok()) << r.status();
  int recompute_events = 0;
  for (const ScheduleEvent& e : r->events) recompute_events += e.kind == ScheduleEvent::kRecompute;
  EXPECT_EQ(recompute_events, 4);
  EXPECT_DOUBLE_EQ(r->busy_s[0], 2 * 1 + 2 * 2.75);
}

TEST(Schedule, ActionsReadBackFromTheirText) {
  for (const Action& a : std::vector<Action>{{K::kForward, 3, -1},
                                             {K::kBackward, 12, -1, 2},
                                             {K::kRecompute, 0, -1, 0},
                                             {K::kRecvActivation, 4, 0},
                                             {K::kSendGradient, 7, 11},
                                             {K::kOptimizerStep, -1, -1}}) {
    absl::StatusOr<Action> back = ParseAction(ActionToString(a));
    ASSERT_TRUE(back.ok()) << ActionToString(a) << ": " << back.status();
    EXPECT_EQ(*back, a) << ActionToString(a);
  }
  EXPECT_EQ(ActionToString({K::kRecvGradient, 3, 2}), "RECV_GRAD3<2");
  for (const char* bad : {"", "X3", "F", "F3x", "RECV_ACT3>2", "SEND_ACT3", "B3.", "O1"}) {
    EXPECT_FALSE(ParseAction(bad).ok()) << bad;
  }
}

TEST(Schedule, MakespanAndBubbleMatchTheClosedForms) {
  // Unit forward, two-unit backward, no transfer time: both schedules take (M + K - 1) * (1 + 2)
  // and leave a bubble of (K - 1) / (M + K - 1) (REFERENCES.md section 1).
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    for (int32_t Kn : {1, 2, 4, 8}) {
      for (int32_t M : {1, 4, 8, 32}) {
        const ScheduleResult r = SimulateSchedule(kind, std::vector<StageTiming>(Kn, StageTiming{1, 2, 0, 0, 0}), M);
        EXPECT_DOUBLE_EQ(r.step_s, 3.0 * (M + Kn - 1)) << ScheduleName(kind) << " K=" << Kn << " M=" << M;
        EXPECT_NEAR(r.bubble_fraction, static_cast<double>(Kn - 1) / (M + Kn - 1), 1e-12);
      }
    }
  }
}

TEST(Schedule, SimulatorReportsADeadlock) {
  // Stage 0 waits for gradient 0 before it sends activation 1, while stage 1 (GPipe) wants both
  // activations before its first backward: a cycle.
  std::vector<ActionList> l = Lists(ScheduleKind::kGPipe, 2, 2);
  const ActionList s0 = l[0];
  // s0: F0 SA0 F1 SA1 RG0 B0 RG1 B1 O  ->  F0 SA0 RG0 B0 F1 SA1 RG1 B1 O
  l[0] = {s0[0], s0[1], s0[4], s0[5], s0[2], s0[3], s0[6], s0[7], s0[8]};
  std::vector<StageTiming> t(2, StageTiming{1, 2, 0, 0, 0});
  absl::StatusOr<ScheduleResult> r = Simulate(l, t);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("deadlocks"));
  EXPECT_THAT(r.status().message(), HasSubstr("stage 0 waits in 'RECV_GRAD0<1'"));
  EXPECT_THAT(r.status().message(), HasSubstr("stage 1 waits in 'RECV_ACT1<0'"));
}

TEST(Schedule, SimulatorRejectsUnsentAndDoubleMessages) {
  std::vector<std::vector<SimStep>> a(2);
  a[0].push_back({"send", 1, {}, {{7}}});
  a[1].push_back({"wait", 1, {8}, {}});
  EXPECT_THAT(SimulateSteps(a).status().message(), HasSubstr("which no step sends"));
  a[1][0].waits = {7};
  a[0].push_back({"send again", 1, {}, {{7}}});
  EXPECT_THAT(SimulateSteps(a).status().message(), HasSubstr("a second time"));
}

TEST(Schedule, ParseNames) {
  EXPECT_EQ(*ParseSchedule("gpipe"), ScheduleKind::kGPipe);
  EXPECT_EQ(*ParseSchedule("1f1b"), ScheduleKind::k1F1B);
  EXPECT_THAT(ParseSchedule("zb").status().message(), HasSubstr("expected gpipe or 1f1b"));
  EXPECT_FALSE(BuildSchedule(ScheduleKind::kGPipe, 0, 1).ok());
  EXPECT_FALSE(BuildSchedule(ScheduleKind::kGPipe, 1, 0).ok());
}

}  // namespace
}  // namespace onnxpipe::partitioner
