#include "frontend/passes/repeat_kv_fold.h"

#include "frontend/ir/verifier.h"
#include "gtest/gtest.h"
#include "tests/passes/test_util.h"

namespace onnxpipe::passes {
namespace {

using ir::Dim;
using ir::OpKind;
using ir::Shape;
using ir::ValueId;
using testing::GraphBuilder;
using testing::MakeAttrs;

// How the test spells the repeat of K and V over the query heads.
enum class Spelling {
  kUnsqueezeExpandReshape,  // repeat_kv as both exporters write it
  kReshapeExpandReshape,    // the size-1 axis made by a Reshape
  kHeadsAfterRepeats,       // (n_rep, kv) merged: torch.repeat / Tile order, head h reads h % kv
  kExpandOfBatch,           // the expand also broadcasts the batch
};

struct Built {
  ValueId k = ir::kNoValue, v = ir::kNoValue, k_rep = ir::kNoValue;
  ir::NodeId attention = ir::kNoNode;
};

// Q (B, kv * n_rep, S, D) attending to K, V (B, kv, S, D) repeated as `spelling` says; B symbolic.
Built Build(GraphBuilder& b, Spelling spelling, int64_t kv = 2, int64_t n_rep = 3) {
  const Dim batch = Dim::Symbol("B");
  const int64_t heads = kv * n_rep, s = 5, d = 4;
  Built out;
  const ValueId q = b.Input("q", {batch, heads, s, d});
  const Dim kv_batch = spelling == Spelling::kExpandOfBatch ? Dim(1) : batch;
  out.k = b.Input("k", {kv_batch, kv, s, d});
  out.v = b.Input("v", {kv_batch, kv, s, d});
  auto repeat = [&](ValueId x) {
    switch (spelling) {
      case Spelling::kUnsqueezeExpandReshape:
      case Spelling::kExpandOfBatch: {
        const ValueId u = b.Op(OpKind::kUnsqueeze, {x}, {kv_batch, kv, 1, s, d}, MakeAttrs({{"axes", std::vector<int64_t>{2}}}));
        const ValueId e = b.Op(OpKind::kExpand, {u, b.IntVec({-1, kv, n_rep, s, d})}, {batch, kv, n_rep, s, d});
        return b.Op(OpKind::kReshape, {e, b.IntVec({0, heads, s, d})}, {batch, heads, s, d});
      }
      case Spelling::kReshapeExpandReshape: {
        const ValueId u = b.Op(OpKind::kReshape, {x, b.IntVec({0, kv, 1, s, d})}, {batch, kv, 1, s, d});
        const ValueId e = b.Op(OpKind::kExpand, {u, b.IntVec({1, 1, n_rep, 1, 1})}, {batch, kv, n_rep, s, d});
        return b.Op(OpKind::kReshape, {e, b.IntVec({0, heads, s, d})}, {batch, heads, s, d});
      }
      case Spelling::kHeadsAfterRepeats: {
        const ValueId u = b.Op(OpKind::kUnsqueeze, {x}, {batch, 1, kv, s, d}, MakeAttrs({{"axes", std::vector<int64_t>{1}}}));
        const ValueId e = b.Op(OpKind::kExpand, {u, b.IntVec({-1, n_rep, kv, s, d})}, {batch, n_rep, kv, s, d});
        return b.Op(OpKind::kReshape, {e, b.IntVec({0, heads, s, d})}, {batch, heads, s, d});
      }
    }
    return ir::kNoValue;
  };
  out.k_rep = repeat(out.k);
  const ValueId v_rep = repeat(out.v);
  const ValueId o = b.Op(OpKind::kAttention, {q, out.k_rep, v_rep}, {batch, heads, s, d},
                         MakeAttrs({{"causal", int64_t{1}}}));
  out.attention = b.last_node();
  b.Output(o);
  return out;
}

bool Fold(ir::Graph& g) {
  RepeatKvFold pass;
  absl::StatusOr<bool> r = pass.Run(&g);
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(ir::Verify(g).ok()) << ir::Verify(g);
  return r.ok() && *r;
}

TEST(RepeatKvFoldTest, AttentionReadsTheUnrepeatedKAndV) {
  for (Spelling sp : {Spelling::kUnsqueezeExpandReshape, Spelling::kReshapeExpandReshape}) {
    GraphBuilder b;
    const Built m = Build(b, sp);
    ir::Graph& g = b.graph();
    ASSERT_TRUE(Fold(g));
    const ir::Node& att = g.node(m.attention);
    EXPECT_EQ(att.inputs[1], m.k);
    EXPECT_EQ(att.inputs[2], m.v);
    EXPECT_FALSE(Fold(g));  // nothing left to fold
  }
}

TEST(RepeatKvFoldTest, MultiQueryAttentionFoldsToOneKvHead) {
  GraphBuilder b;
  const Built m = Build(b, Spelling::kUnsqueezeExpandReshape, /*kv=*/1, /*n_rep=*/4);
  ASSERT_TRUE(Fold(b.graph()));
  EXPECT_EQ(b.graph().node(m.attention).inputs[1], m.k);
}

TEST(RepeatKvFoldTest, OtherReadersOfTheRepeatKeepIt) {
  GraphBuilder b;
  const Built m = Build(b, Spelling::kUnsqueezeExpandReshape);
  b.Output(m.k_rep);  // e.g. a returned KV cache
  ir::Graph& g = b.graph();
  ASSERT_TRUE(Fold(g));
  EXPECT_EQ(g.node(m.attention).inputs[1], m.k);
  EXPECT_EQ(g.node(g.value(m.k_rep).producer).op, OpKind::kReshape);
}

TEST(RepeatKvFoldTest, RepeatsInTheOtherOrderOrOfOtherAxesAreLeftAlone) {
  for (Spelling sp : {Spelling::kHeadsAfterRepeats, Spelling::kExpandOfBatch}) {
    GraphBuilder b;
    const Built m = Build(b, sp);
    EXPECT_FALSE(Fold(b.graph())) << static_cast<int>(sp);
    EXPECT_EQ(b.graph().node(m.attention).inputs[1], m.k_rep);
  }
}

}  // namespace
}  // namespace onnxpipe::passes
