#include "partitioner/transfer_order.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "frontend/ir/status.h"

namespace onnxpipe::partitioner {
namespace {

// Stage k's posts, built in the executor's order with the comm's send holding (see the header).
class Poster {
 public:
  explicit Poster(const StageProgram& sp) : sp_(sp) {}

  // The values node `id` makes for peers in `sends` (per peer), as it ends.
  bool Made(ir::NodeId id, const ValueLists& sends, int32_t m) {
    bool any = false;
    for (ir::ValueId v : sp_.graph.node(id).outputs) {
      if (v == ir::kNoValue) continue;
      for (const auto& [peer, vs] : sends) {
        if (std::find(vs.begin(), vs.end(), v) == vs.end()) continue;
        Send(peer, m, v);
        any = true;
      }
    }
    return any;
  }
  void Send(int32_t peer, int32_t m, ir::ValueId v) { held_.push_back({TransferOp::kSend, peer, m, v}); }
  // A group of receives (with the held sends).
  void Receive(std::string action, int32_t peer, int32_t m, const std::vector<ir::ValueId>& values) {
    TransferGroup g{std::move(action), std::move(held_), optimizer_};
    held_.clear();
    for (ir::ValueId v : values) g.ops.push_back({TransferOp::kRecv, peer, m, v});
    out_.push_back(std::move(g));
  }
  // More receives in the last group (a run of RECV actions).
  void JoinReceive(const std::string& action, int32_t peer, int32_t m, const std::vector<ir::ValueId>& values) {
    TransferGroup& g = out_.back();
    g.action += "+" + action;
    for (ir::ValueId v : values) g.ops.push_back({TransferOp::kRecv, peer, m, v});
  }
  void Flush(const std::string& action) {
    if (!held_.empty()) Receive(action, -1, -1, {});
  }
  // The groups from here on are the optimizer phase's.
  void Optimizer() { optimizer_ = true; }
  std::vector<TransferGroup> Take() { return std::move(out_); }

 private:
  const StageProgram& sp_;
  std::vector<TransferOp> held_;
  std::vector<TransferGroup> out_;
  bool optimizer_ = false;
};

std::string Describe(const PipelineProgram& p, int32_t stage, const TransferOp& op) {
  std::ostringstream s;
  s << "'" << p.stages[stage].graph.value(op.value).name << "' of ";
  if (op.microbatch >= 0) {
    s << "micro-batch " << op.microbatch;
  } else {
    s << "the optimizer phase";
  }
  return s.str();
}

}  // namespace

bool ReceivesNext(const ActionList& list, size_t i) {
  size_t next = i + 1;
  while (next < list.size() &&
         (list[next].kind == ActionKind::kSendActivation || list[next].kind == ActionKind::kSendGradient)) {
    ++next;
  }
  return next < list.size() &&
         (list[next].kind == ActionKind::kRecvActivation || list[next].kind == ActionKind::kRecvGradient);
}

size_t ReceiveRunEnd(const ActionList& list, size_t i) {
  const Action& first = list[i];
  size_t end = i + 1;
  for (size_t j = i + 1; j < list.size(); ++j) {
    const Action& a = list[j];
    if (a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kSendGradient) continue;
    if (a.kind != first.kind || a.microbatch != first.microbatch) break;
    end = j + 1;
  }
  return end;
}

std::vector<TransferGroup> TransferProgram(const PipelineProgram& p, const std::vector<ActionList>& lists, int32_t k) {
  const StageProgram& sp = p.stages[k];
  Poster post(sp);
  for (size_t i = 0; i < lists[k].size(); ++i) {
    const Action& a = lists[k][i];
    const std::string name = ActionToString(a);
    // A compute action's sends go out as one group at its end, or with the receives of a RECV right after it.
    const bool recv_next = ReceivesNext(lists[k], i);
    switch (a.kind) {
      case ActionKind::kRecvActivation:
      case ActionKind::kRecvGradient: {
        const std::map<int32_t, std::vector<ir::ValueId>>& from =
            a.kind == ActionKind::kRecvActivation ? sp.recv_forward : sp.recv_backward;
        post.Receive(name, a.peer, a.microbatch, from.at(a.peer));
        const size_t end = ReceiveRunEnd(lists[k], i);
        for (size_t j = i + 1; j < end; ++j) {
          const Action& b = lists[k][j];
          if (b.kind == a.kind) post.JoinReceive(ActionToString(b), b.peer, b.microbatch, from.at(b.peer));
        }
        i = end - 1;
        break;
      }
      case ActionKind::kForward:
        for (ir::NodeId id : sp.forward) post.Made(id, sp.send_forward, a.microbatch);
        if (!recv_next) post.Flush(name);
        break;
      case ActionKind::kBackward:
      case ActionKind::kRecompute: {
        const BackwardPart& part = sp.parts.at(a.part);
        for (int32_t j = part.begin; j < part.end; ++j) post.Made(sp.backward[j], sp.send_backward, a.microbatch);
        if (!recv_next) post.Flush(name);
        break;
      }
      case ActionKind::kSendActivation:
      case ActionKind::kSendGradient:
        break;
      case ActionKind::kOptimizerStep: {
        post.Flush(name);
        post.Optimizer();
        const std::map<ir::NodeId, std::vector<int32_t>>& reduced = p.all_reduced.at(k);
        std::set<ir::ValueId> sent(sp.accumulate.begin(), sp.accumulate.end()), have = sent, reduced_inputs;
        for (const auto& [id, group] : reduced) {
          for (ir::ValueId v : sp.graph.node(id).inputs) {
            sent.erase(v);
            reduced_inputs.insert(v);
          }
        }
        // The accumulated contributions as the phase begins, then per post node what it receives and sends.
        for (const auto& [peer, vs] : sp.send_post)
          for (ir::ValueId v : vs)
            if (sent.count(v)) post.Send(peer, -1, v);
        for (ir::NodeId id : sp.post) {
          const ir::Node& n = sp.graph.node(id);
          if (!reduced.count(id)) {  // an all-reduced Sum receives nothing
            // A peer's value after the ones it sent before it (the executor receives those first).
            for (ir::ValueId v : n.inputs) {
              if (v == ir::kNoValue || sp.graph.value(v).constant || have.count(v)) continue;
              for (const auto& [peer, vs] : sp.recv_post) {
                const auto at = std::find(vs.begin(), vs.end(), v);
                for (auto u = vs.begin(); at != vs.end() && u <= at; ++u)
                  if (!reduced_inputs.count(*u) && have.insert(*u).second) post.Receive(name, peer, -1, {*u});
              }
            }
          }
          for (ir::ValueId v : n.outputs) have.insert(v);
          if (post.Made(id, sp.send_post, -1)) post.Flush(name);
        }
        break;
      }
    }
  }
  post.Flush("the end of the step");
  return post.Take();
}

absl::Status SimulateTransfers(const std::vector<std::vector<TransferGroup>>& program) {
  const int32_t K = static_cast<int32_t>(program.size());
  std::vector<size_t> at(K, 0);
  // The optimizer phase's transfers are few and small and every comm stages them (its sends do not wait for their
  // receives): the simulation ends where it begins.
  auto current = [&](int32_t k) -> const TransferGroup* {
    return at[k] < program[k].size() && !program[k][at[k]].optimizer ? &program[k][at[k]] : nullptr;
  };
  std::map<std::pair<int32_t, int32_t>, int64_t> sends_done, recvs_done;
  for (bool moved = true; moved;) {
    moved = false;
    // How far each channel's sends and receives reach, counting the current groups.
    std::map<std::pair<int32_t, int32_t>, int64_t> sends_posted = sends_done, recvs_posted = recvs_done;
    for (int32_t k = 0; k < K; ++k) {
      if (const TransferGroup* g = current(k)) {
        for (const TransferOp& op : g->ops) {
          if (op.kind == TransferOp::kSend) ++sends_posted[{k, op.peer}];
          if (op.kind == TransferOp::kRecv) ++recvs_posted[{op.peer, k}];
        }
      }
    }
    for (int32_t k = 0; k < K; ++k) {
      const TransferGroup* g = current(k);
      if (g == nullptr) continue;
      bool ready = true;
      std::map<std::pair<int32_t, int32_t>, int64_t> s = sends_done, r = recvs_done;
      for (const TransferOp& op : g->ops) {
        if (op.kind == TransferOp::kSend) ready &= ++s[{k, op.peer}] <= recvs_posted[{k, op.peer}];
        if (op.kind == TransferOp::kRecv) ready &= ++r[{op.peer, k}] <= sends_posted[{op.peer, k}];
      }
      if (!ready) continue;
      // Done: both sides of every transfer in it (the peers' halves complete with their own groups).
      for (const TransferOp& op : g->ops) {
        if (op.kind == TransferOp::kSend) ++sends_done[{k, op.peer}];
        if (op.kind == TransferOp::kRecv) ++recvs_done[{op.peer, k}];
      }
      ++at[k];
      moved = true;
      break;  // recount what is posted
    }
  }
  std::ostringstream blocked;
  for (int32_t k = 0; k < K; ++k) {
    if (const TransferGroup* g = current(k)) blocked << (blocked.tellp() > 0 ? "; " : "") << "stage " << k << " at " << g->action;
  }
  if (blocked.tellp() > 0) {
    return FAILED_PRECONDITION() << "the transfers deadlock under NCCL's ordering: " << blocked.str();
  }
  return absl::OkStatus();
}

absl::Status ProveTransferOrder(const PipelineProgram& p, const std::vector<ActionList>& lists) {
  RET_CHECK(static_cast<int32_t>(lists.size()) == p.num_stages);
  const int32_t K = p.num_stages;
  std::vector<std::vector<TransferGroup>> program(K);
  for (int32_t k = 0; k < K; ++k) program[k] = TransferProgram(p, lists, k);

  // (1) Each channel's messages, as the sender posts them and as the receiver does.
  std::map<std::pair<int32_t, int32_t>, std::vector<const TransferOp*>> sent, received;
  for (int32_t k = 0; k < K; ++k) {
    for (const TransferGroup& g : program[k]) {
      for (const TransferOp& op : g.ops) {
        if (op.kind == TransferOp::kSend) sent[{k, op.peer}].push_back(&op);
        if (op.kind == TransferOp::kRecv) received[{op.peer, k}].push_back(&op);
      }
    }
  }
  std::set<std::pair<int32_t, int32_t>> channels;
  for (const auto& [c, ops] : sent) channels.insert(c);
  for (const auto& [c, ops] : received) channels.insert(c);
  for (const auto& [src, dst] : channels) {
    const std::vector<const TransferOp*>& s = sent[{src, dst}];
    const std::vector<const TransferOp*>& r = received[{src, dst}];
    for (size_t i = 0; i < std::max(s.size(), r.size()); ++i) {
      if (i < s.size() && i < r.size() && s[i]->microbatch == r[i]->microbatch && s[i]->value == r[i]->value) continue;
      return FAILED_PRECONDITION() << "stage " << src << " -> stage " << dst << ", message " << i
                                   << ": the sender's is " << (i < s.size() ? Describe(p, src, *s[i]) : "none")
                                   << ", the receiver's is " << (i < r.size() ? Describe(p, dst, *r[i]) : "none")
                                   << " (NCCL matches sends and receives by their order)";
    }
  }

  return SimulateTransfers(program);
}

}  // namespace onnxpipe::partitioner
