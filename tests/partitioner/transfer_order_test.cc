// The transfers as NCCL runs them (transfer_order.h): NCCL's blocking rules on hand-made programs (a
// send-then-receive exchange deadlocks unless grouped), the posts of a planned 1F1B pipeline (a stage's
// activation send rides in one group with its next gradient receive), and plans whose two sides post in
// different orders refused naming the channel and both values.
#include "partitioner/transfer_order.h"

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "partitioner/partitioner.h"
#include "partitioner/plan_io.h"
#include "tests/partitioner/test_graphs.h"

namespace onnxpipe::partitioner {
namespace {

using ::testing::HasSubstr;

TransferOp Send(int32_t peer, ir::ValueId v) { return {TransferOp::kSend, peer, 0, v}; }
TransferOp Recv(int32_t peer, ir::ValueId v) { return {TransferOp::kRecv, peer, 0, v}; }

TEST(SimulateTransfers, AnExchangeInSeparateGroupsDeadlocksAndInOneGroupCompletes) {
  // Both stages send first, each send its own group: neither receive is ever posted.
  std::vector<std::vector<TransferGroup>> apart = {{{"send", {Send(1, 0)}}, {"recv", {Recv(1, 1)}}},
                                                   {{"send", {Send(0, 1)}}, {"recv", {Recv(0, 0)}}}};
  const absl::Status st = SimulateTransfers(apart);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("deadlock under NCCL's ordering: stage 0 at send; stage 1 at send"));
  // The same exchange with each stage's send and receive in one group.
  std::vector<std::vector<TransferGroup>> together = {{{"x", {Send(1, 0), Recv(1, 1)}}},
                                                      {{"x", {Send(0, 1), Recv(0, 0)}}}};
  EXPECT_TRUE(SimulateTransfers(together).ok());
  // One side receiving first is fine too: its receive is posted when the other's send waits.
  std::vector<std::vector<TransferGroup>> ordered = {{{"send", {Send(1, 0)}}, {"recv", {Recv(1, 1)}}},
                                                     {{"recv", {Recv(0, 0)}}, {"send", {Send(0, 1)}}}};
  EXPECT_TRUE(SimulateTransfers(ordered).ok());
  // A three-stage ring of sends deadlocks; the optimizer phase is not simulated (its comms stage their sends).
  std::vector<std::vector<TransferGroup>> ring = {{{"a", {Send(1, 0)}}, {"b", {Recv(2, 2)}}},
                                                  {{"a", {Send(2, 1)}}, {"b", {Recv(0, 0)}}},
                                                  {{"a", {Send(0, 2)}}, {"b", {Recv(1, 1)}}}};
  EXPECT_FALSE(SimulateTransfers(ring).ok());
  for (auto& stage : ring)
    for (TransferGroup& g : stage) g.optimizer = true;
  EXPECT_TRUE(SimulateTransfers(ring).ok());
}

// A stage that receives one micro-batch's activations from two peers (a value skipping a stage, as an encoder's
// output reaching a later decoder stage) under 1F1B, micro-batches 0 and 1, three stages; stage 0 sends to 1 and 2.
// Stage 2 has done F0 and B0 and receives micro-batch 1; stage 0 holds F1's sends in the group that receives
// micro-batch 0's gradients; stage 1 holds F1's send in the group receiving stage 2's gradient. Receiving from one
// peer at a time, each waits on the next: a deadlock. Receiving a micro-batch's run from both peers as one group
// (ReceiveRunEnd), every group finds its counterparts.
TEST(SimulateTransfers, ReceivingFromTwoPeersAtOnceLets1F1BWithASkipComplete) {
  auto op = [](TransferOp::Kind k, int32_t peer, int32_t m, ir::ValueId v) { return TransferOp{k, peer, m, v}; };
  const auto S = TransferOp::kSend, R = TransferOp::kRecv;
  // Values: 1 = stage 0's activation, 2 = stage 1's, 3 = stage 2's gradient for 1, 4 = for 0, 5 = stage 1's for 0.
  auto program = [&](bool together) {
    std::vector<TransferGroup> s0 = {{"F0", {op(S, 1, 0, 1), op(S, 2, 0, 1)}}};
    std::vector<TransferGroup> s2;
    if (together) {
      s2.push_back({"RECV_ACT0<0+RECV_ACT0<1", {op(R, 0, 0, 1), op(R, 1, 0, 2)}});
      s2.push_back({"RECV_ACT1<0+RECV_ACT1<1", {op(S, 1, 0, 3), op(S, 0, 0, 4), op(R, 0, 1, 1), op(R, 1, 1, 2)}});
      s0.push_back({"RECV_GRAD0<1+RECV_GRAD0<2", {op(S, 1, 1, 1), op(S, 2, 1, 1), op(R, 1, 0, 5), op(R, 2, 0, 4)}});
    } else {
      s2.push_back({"RECV_ACT0<0", {op(R, 0, 0, 1)}});
      s2.push_back({"RECV_ACT0<1", {op(R, 1, 0, 2)}});
      s2.push_back({"RECV_ACT1<0", {op(S, 1, 0, 3), op(S, 0, 0, 4), op(R, 0, 1, 1)}});
      s2.push_back({"RECV_ACT1<1", {op(R, 1, 1, 2)}});
      s0.push_back({"RECV_GRAD0<1", {op(S, 1, 1, 1), op(S, 2, 1, 1), op(R, 1, 0, 5)}});
      s0.push_back({"RECV_GRAD0<2", {op(R, 2, 0, 4)}});
    }
    const std::vector<TransferGroup> s1 = {{"RECV_ACT0<0", {op(R, 0, 0, 1)}},
                                           {"RECV_ACT1<0", {op(S, 2, 0, 2), op(R, 0, 1, 1)}},
                                           {"RECV_GRAD0<2", {op(S, 2, 1, 2), op(R, 2, 0, 3)}},
                                           {"B0", {op(S, 0, 0, 5)}}};
    return std::vector<std::vector<TransferGroup>>{s0, s1, s2};
  };
  const absl::Status apart = SimulateTransfers(program(false));
  EXPECT_THAT(apart.message(), HasSubstr("stage 0 at RECV_GRAD0<1; stage 1 at RECV_GRAD0<2; stage 2 at RECV_ACT1<0"));
  EXPECT_TRUE(SimulateTransfers(program(true)).ok()) << SimulateTransfers(program(true));
}

TEST(ReceiveRunEnd, TakesTheRecvsOfOneMicrobatchAndDirectionThatFollow) {
  auto list = [](const std::vector<std::string>& names) {
    ActionList l;
    for (const std::string& n : names) l.push_back(*ParseAction(n));
    return l;
  };
  EXPECT_EQ(ReceiveRunEnd(list({"RECV_ACT1<0", "RECV_ACT1<1", "F1"}), 0), 2u);
  EXPECT_EQ(ReceiveRunEnd(list({"F0", "RECV_ACT1<0", "SEND_ACT0>2", "RECV_ACT1<1", "F1"}), 1), 4u);
  EXPECT_EQ(ReceiveRunEnd(list({"RECV_ACT1<0", "RECV_ACT2<1"}), 0), 1u);   // another micro-batch
  EXPECT_EQ(ReceiveRunEnd(list({"RECV_GRAD0<2", "RECV_ACT1<0"}), 0), 1u);  // another direction
  EXPECT_EQ(ReceiveRunEnd(list({"RECV_GRAD0<2"}), 0), 1u);
}

// A 5-layer chain with a tied head (a parameter held on the first and last stage), planned and compiled as train
// runs it.
CompiledPlan Plan(ScheduleKind schedule, int32_t stages, int64_t microbatches, RecomputePolicy recompute) {
  testing::ChainSpec spec;
  spec.batch = 4;
  spec.widths = {16, 8, 8, 8, 8, 16};
  spec.classes = 8;
  spec.tie_head = true;
  const ir::Graph g = testing::BuildChain(spec);
  PartitionOptions o;
  o.num_stages = stages;
  o.batch = 8;
  o.microbatches = microbatches;
  o.schedule = schedule;
  o.recompute = recompute;
  absl::StatusOr<PartitionPlan> plan = Partition(g, Cluster{testing::FakeDevice(int64_t{1} << 40)}, o);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return {};
  absl::StatusOr<CompiledPlan> c = CompilePlan(g, *plan);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : CompiledPlan{};
}

TEST(ProveTransferOrder, PlannedPipelinesPostInTheSameOrderAndCompleteUnderNccl) {
  for (ScheduleKind schedule : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    for (int32_t K : {2, 3, 4}) {
      for (RecomputePolicy r : {RecomputePolicy::kNone, RecomputePolicy::kFull}) {
        const CompiledPlan c = Plan(schedule, K, 4, r);
        ASSERT_EQ(c.program.num_stages, K);
        const absl::Status st = ProveTransferOrder(c.program, c.actions);
        EXPECT_TRUE(st.ok()) << ScheduleName(schedule) << " K=" << K << ": " << st;
      }
    }
  }
}

TEST(ProveTransferOrder, A1F1BStageSendsItsActivationWithItsNextGradientReceive) {
  const CompiledPlan c = Plan(ScheduleKind::k1F1B, 2, 4, RecomputePolicy::kNone);
  ASSERT_EQ(c.program.num_stages, 2);
  // Stage 0 of 2 warms up with one forward; then each forward's send goes out with the receive of the gradient the
  // stage waits for next: F1's activation with the gradient of micro-batch 0.
  bool paired = false;
  for (const TransferGroup& g : TransferProgram(c.program, c.actions, 0)) {
    bool sends = false, receives = false;
    for (const TransferOp& op : g.ops) {
      sends |= op.kind == TransferOp::kSend && op.microbatch == 1;
      receives |= op.kind == TransferOp::kRecv && op.microbatch == 0;
    }
    paired |= sends && receives && g.action == "RECV_GRAD0<1";
  }
  EXPECT_TRUE(paired);
}

TEST(ProveTransferOrder, ReceivingInAnotherOrderNamesTheChannelAndBothValues) {
  CompiledPlan c = Plan(ScheduleKind::kGPipe, 2, 2, RecomputePolicy::kNone);
  ASSERT_EQ(c.program.num_stages, 2);
  // Stage 1 receives micro-batch 1's activations before micro-batch 0's.
  std::vector<Action*> recvs;
  for (Action& a : c.actions[1])
    if (a.kind == ActionKind::kRecvActivation) recvs.push_back(&a);
  ASSERT_EQ(recvs.size(), 2u);
  std::swap(recvs[0]->microbatch, recvs[1]->microbatch);
  const absl::Status st = ProveTransferOrder(c.program, c.actions);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("stage 0 -> stage 1, message 0: the sender's is '"));
  EXPECT_THAT(st.message(), HasSubstr("of micro-batch 0, the receiver's is '"));
  EXPECT_THAT(st.message(), HasSubstr("of micro-batch 1 (NCCL matches sends and receives by their order)"));
}

}  // namespace
}  // namespace onnxpipe::partitioner
