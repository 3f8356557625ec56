// The trainable-parameter rule (frontend/autodiff/trainable.h) on hand-built graphs: one graph per
// reason an initializer is frozen, the parameters it must keep training although they meet positions
// or masks, the user's --freeze/--train-only, idempotence, and what the forward pipeline and the
// autodiff do with the decisions.
#include <cfloat>
#include <cmath>
#include <limits>
#include <map>

#include "frontend/autodiff/autodiff.h"
#include "frontend/autodiff/trainable.h"
#include "frontend/ir/infer.h"
#include "executor/cpu/cpu_evaluator.h"
#include "frontend/passes/pipeline.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/autodiff/test_graph.h"

namespace onnxpipe::autodiff {
namespace {

using ir::OpKind;
using ir::ValueId;
using ::testing::HasSubstr;
using testing::MakeAttrs;
using testing::TestGraph;

// A graph with a float input x (2, 3, 4) and helpers for the patterns below.
class RuleGraph : public TestGraph {
 public:
  RuleGraph() {
    x = g().AddValue("x", ir::DType::kF64, {2, 3, 4});
    g().inputs().push_back(x);
  }
  ValueId Scalar(const std::string& name, double v) {
    return g().AddConstant(name, ir::Tensor::Scalar<double>(v), /*is_initializer=*/true);
  }
  ValueId IntInit(const std::string& name, std::vector<int64_t> dims, std::vector<int64_t> v) {
    return g().AddConstant(name, ir::Tensor::FromVector<int64_t>(std::move(dims), v), /*is_initializer=*/true);
  }
  // Positions 0..2 as a float (3, 1): Cast(Unsqueeze(Range(0, 3, 1))) of int64 scalars.
  ValueId Positions() {
    ValueId r = Op1(OpKind::kRange, {ConstI("start", {}, {0}), ConstI("limit", {}, {3}), ConstI("delta", {}, {1})});
    ValueId u = Op1(OpKind::kUnsqueeze, {r}, MakeAttrs({{"axes", std::vector<int64_t>{1}}}));
    return Op1(OpKind::kCast, {u}, MakeAttrs({{"to", std::string("f64")}}));
  }
  // Finishes the graph: `out` is the only output; shapes are inferred.
  void Output(ValueId out) {
    g().outputs() = {out};
    absl::Status st = ir::InferShapes(g());
    ASSERT_TRUE(st.ok()) << st;
  }
  ValueId x;
};

// name -> reason for every float initializer the rule decided.
std::map<std::string, FreezeReason> Decide(const ir::Graph& g, const TrainableOptions& options = {}) {
  absl::StatusOr<TrainableReport> r = DecideTrainable(g, options);
  EXPECT_TRUE(r.ok()) << r.status();
  std::map<std::string, FreezeReason> out;
  if (!r.ok()) return out;
  for (const InitializerDecision& d : r->decisions) {
    EXPECT_EQ(d.trainable, d.reason == FreezeReason::kNone) << g.value(d.value).name;
    out[g.value(d.value).name] = d.reason;
  }
  return out;
}

TEST(TrainableTest, LinearLayerNormAndEmbeddingTablesAreParameters) {
  RuleGraph t;
  ValueId ids = t.ConstI("ids", {2, 3}, {1, 4, 1, 0, 2, 3});
  ValueId emb = t.Op1(OpKind::kGather, {t.Param("wte", {5, 4}), ids});
  ValueId pos = t.Op1(OpKind::kGather, {t.Param("wpe", {3, 4}), t.ConstI("pos_ids", {3}, {0, 1, 2})});
  ValueId h = t.Op1(OpKind::kAdd, {t.Op1(OpKind::kAdd, {emb, pos}), t.x});
  ValueId ln = t.Op1(OpKind::kLayerNorm, {h, t.Param("ln.weight", {4}), t.Param("ln.bias", {4})});
  ValueId y = t.Op1(OpKind::kLinear, {ln, t.Param("fc.weight", {4, 6}), t.Param("fc.bias", {6})});
  // ReZero-style gate: a learned scalar of shape (1,) (rank 1) stays a parameter.
  t.Output(t.Op1(OpKind::kMul, {y, t.Param("gate", {1})}));
  const auto d = Decide(t.g());
  for (const char* p : {"wte", "wpe", "ln.weight", "ln.bias", "fc.weight", "fc.bias", "gate"})
    EXPECT_EQ(d.at(p), FreezeReason::kNone) << p;
}

TEST(TrainableTest, RankZeroLiteralsAreFrozen) {
  // Llama's RMSNorm as the dynamo exporter writes it: Pow exponent and eps are rank-0 initializers,
  // and so is the attention scale.
  RuleGraph t;
  ValueId sq = t.Op1(OpKind::kPow, {t.x, t.Scalar("two", 2.0)});
  ValueId ms = t.Op1(OpKind::kReduceMean, {sq}, MakeAttrs({{"axes", std::vector<int64_t>{-1}}}));
  ValueId r = t.Op1(OpKind::kReciprocal, {t.Op1(OpKind::kSqrt, {t.Op1(OpKind::kAdd, {ms, t.Scalar("eps", 1e-6)})})});
  ValueId n = t.Op1(OpKind::kMul, {t.Param("norm.weight", {4}), t.Op1(OpKind::kMul, {t.x, r})});
  t.Output(t.Op1(OpKind::kMul, {n, t.Scalar("scale", 0.5)}));
  const auto d = Decide(t.g());
  EXPECT_EQ(d.at("two"), FreezeReason::kScalar);
  EXPECT_EQ(d.at("eps"), FreezeReason::kScalar);
  EXPECT_EQ(d.at("scale"), FreezeReason::kScalar);
  EXPECT_EQ(d.at("norm.weight"), FreezeReason::kNone);
}

TEST(TrainableTest, MaskFillValuesAreSentinels) {
  // Where(mask, 0, finfo.min) added to the scores, and a mask table holding -inf.
  RuleGraph t;
  ValueId keep = t.ConstB("keep", {3, 4}, {true, false, true, true, false, true, true, true, true, true, false, true});
  ValueId fill = t.Op1(OpKind::kWhere, {keep, t.Scalar("zero", 0.0), t.Scalar("min", -static_cast<double>(FLT_MAX))});
  ir::Tensor table(ir::DType::kF64, {3, 4});
  for (int i = 0; i < 12; ++i) table.mutable_data<double>()[i] = i % 3 == 0 ? -std::numeric_limits<double>::infinity() : 0;
  ValueId inf_mask = t.g().AddConstant("inf_mask", table, /*is_initializer=*/true);
  ValueId s = t.Op1(OpKind::kAdd, {t.Op1(OpKind::kAdd, {t.x, fill}), inf_mask});
  t.Output(t.Op1(OpKind::kSoftmax, {s}));
  const auto d = Decide(t.g());
  EXPECT_EQ(d.at("min"), FreezeReason::kSentinel);
  EXPECT_EQ(d.at("inf_mask"), FreezeReason::kSentinel);
  EXPECT_EQ(d.at("zero"), FreezeReason::kScalar);
}

TEST(TrainableTest, IndexShapeConditionAndComparisonOperandsHaveNoGradient) {
  RuleGraph t;
  // A float causal-mask buffer (GPT-2's "bias") compared and used as a Where condition.
  ir::Tensor tri(ir::DType::kF64, {3, 4});
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) tri.mutable_data<double>()[i * 4 + j] = j <= i ? 1.0 : 0.0;
  ValueId causal = t.g().AddConstant("attn.bias", tri, /*is_initializer=*/true);
  ValueId cond = t.Op1(OpKind::kEqual, {causal, t.ConstF("zero_c", {}, 0, 0)});
  ValueId masked = t.Op1(OpKind::kWhere, {cond, t.ConstF("fill", {}, -1e4, -1e4), t.x});
  // A float position table turned into indices (Cast to int64) for a Gather.
  ValueId pos_f = t.Param("pos_table", {3});
  ValueId idx = t.Op1(OpKind::kCast, {pos_f}, MakeAttrs({{"to", std::string("i64")}}));
  ValueId rows = t.Op1(OpKind::kGather, {masked, idx}, MakeAttrs({{"axis", int64_t{1}}}));
  // A threshold compared with the activations.
  ValueId thr = t.Op1(OpKind::kLess, {rows, t.Param("threshold", {4})});
  ValueId out = t.Op1(OpKind::kWhere, {thr, rows, t.ConstF("zero_w", {}, 0, 0)});
  t.Output(out);
  const auto d = Decide(t.g());
  EXPECT_EQ(d.at("attn.bias"), FreezeReason::kNoGradient);
  EXPECT_EQ(d.at("pos_table"), FreezeReason::kNoGradient);
  EXPECT_EQ(d.at("threshold"), FreezeReason::kNoGradient);
}

TEST(TrainableTest, InitializersNoOutputDependsOnAreUnused) {
  RuleGraph t;
  ValueId dead = t.Op1(OpKind::kMul, {t.x, t.Param("dead.weight", {4})});
  (void)dead;
  t.Output(t.Op1(OpKind::kMul, {t.x, t.Param("live.weight", {4})}));
  const auto d = Decide(t.g());
  EXPECT_EQ(d.at("dead.weight"), FreezeReason::kUnused);
  EXPECT_EQ(d.at("live.weight"), FreezeReason::kNone);
}

TEST(TrainableTest, RotaryFrequenciesAndAlibiSlopesArePositional) {
  RuleGraph t;
  // Rotary: freqs = positions (3, 1) x inv_freq (2,) -> (3, 2); emb = cat(freqs, freqs) -> (3, 4);
  // q * cos(emb) + q * sin(emb).
  ValueId freqs = t.Op1(OpKind::kMul, {t.Positions(), t.Param("inv_freq", {2}, 0.01, 1)});
  ValueId emb = t.Op1(OpKind::kConcat, {freqs, freqs}, MakeAttrs({{"axis", int64_t{-1}}}));
  ValueId q = t.Op1(OpKind::kAdd, {t.Op1(OpKind::kMul, {t.x, t.Op1(OpKind::kCos, {emb})}),
                                    t.Op1(OpKind::kMul, {t.x, t.Op1(OpKind::kSin, {emb})})});
  // ALiBi: slopes (2, 1, 1) x distances (3, 3) -> (2, 3, 3), added to the scores.
  ValueId dist = t.Op1(OpKind::kCast, {t.ConstI("dist", {3, 3}, {0, -1, -2, 1, 0, -1, 2, 1, 0})},
                       MakeAttrs({{"to", std::string("f64")}}));
  ValueId bias = t.Op1(OpKind::kMul, {t.Param("slopes", {2, 1, 1}), dist});
  ValueId qt = t.Op1(OpKind::kTranspose, {q}, MakeAttrs({{"perm", std::vector<int64_t>{0, 2, 1}}}));
  ValueId scores = t.Op1(OpKind::kMatMul, {q, qt});  // (2, 3, 3)
  ValueId biased = t.Op1(OpKind::kAdd, {scores, bias});
  // A fixed-size export spells the positions as a constant float tensor.
  ValueId fixed = t.Op1(OpKind::kMul, {t.ConstF("arange", {3, 1}, 0, 2), t.Param("inv_freq_fixed", {3}, 0.01, 1)});
  ValueId f = t.Op1(OpKind::kMatMul, {t.Op1(OpKind::kCos, {fixed}), t.Op1(OpKind::kSoftmax, {biased})});
  t.Output(f);
  const auto d = Decide(t.g());
  EXPECT_EQ(d.at("inv_freq"), FreezeReason::kPositional);
  EXPECT_EQ(d.at("slopes"), FreezeReason::kPositional);
  EXPECT_EQ(d.at("inv_freq_fixed"), FreezeReason::kPositional);
}

// The sinusoidal encoding of `positions` rows and d columns, in f32 as torch builds it: interleaved
// (sin, cos, sin, ...) or in halves (sin..., cos...).
ir::Tensor SinusoidalTable(std::vector<int64_t> dims, bool interleaved) {
  ir::Tensor t(ir::DType::kF32, dims);
  const int64_t d = dims.back(), rows = t.num_elements() / d;
  for (int64_t p = 0; p < rows; ++p) {
    for (int64_t i = 0; i < d / 2; ++i) {
      const float w = std::exp(static_cast<float>(2 * i) * (-std::log(10000.0f) / static_cast<float>(d)));
      const int64_t sin_col = interleaved ? 2 * i : i, cos_col = interleaved ? 2 * i + 1 : d / 2 + i;
      t.mutable_data<float>()[p * d + sin_col] = std::sin(static_cast<float>(p) * w);
      t.mutable_data<float>()[p * d + cos_col] = std::cos(static_cast<float>(p) * w);
    }
  }
  return t;
}

TEST(TrainableTest, SinusoidalPositionTablesAreFrozen) {
  // PositionalEncoding as PyTorch's tutorial registers it: x + pe[:, :S], pe of (1, max_len, d).
  ir::Graph g;
  const ValueId x = g.AddValue("x", ir::DType::kF32, {2, 3, 4});
  g.inputs().push_back(x);
  auto add = [&](const std::string& name, ir::Tensor table, ValueId in) {
    const ValueId t = g.AddConstant(name, std::move(table), /*is_initializer=*/true);
    const ValueId out = g.AddValue(name + "/out", ir::DType::kF32, {2, 3, 4});
    g.AddNode(OpKind::kAdd, name + "/Add", {in, t}, {out});
    return out;
  };
  ValueId h = add("pe", SinusoidalTable({1, 3, 4}, /*interleaved=*/true), x);
  h = add("pe_halves", SinusoidalTable({3, 4}, /*interleaved=*/false), h);
  ir::Tensor learned = SinusoidalTable({3, 4}, true);
  learned.mutable_data<float>()[5] += 0.01f;  // one trained entry: no longer a sinusoid
  h = add("learned", learned, h);
  h = add("zeros", ir::Tensor(ir::DType::kF32, {3, 4}), h);  // a zero-initialised table is learned
  g.outputs() = {h};
  ASSERT_TRUE(ir::InferShapes(g).ok());
  const auto d = Decide(g);
  EXPECT_EQ(d.at("pe"), FreezeReason::kSinusoidal);
  EXPECT_EQ(d.at("pe_halves"), FreezeReason::kSinusoidal);
  EXPECT_EQ(d.at("learned"), FreezeReason::kNone);
  EXPECT_EQ(d.at("zeros"), FreezeReason::kNone);
}

TEST(TrainableTest, TablesThatMeetMasksOrPositionsWithoutBroadcastStayParameters) {
  RuleGraph t;
  // T5's relative attention bias: gathered by integer buckets, plus a mask made from integers, then
  // added to the scores: trained.
  ValueId buckets = t.ConstI("buckets", {3, 3}, {0, 1, 2, 1, 0, 1, 2, 1, 0});
  ValueId rel = t.Op1(OpKind::kGather, {t.Param("rel_bias", {3, 2}), buckets});  // (3, 3, 2)
  ValueId relh = t.Op1(OpKind::kTranspose, {rel}, MakeAttrs({{"perm", std::vector<int64_t>{2, 0, 1}}}));
  ValueId mask = t.Op1(OpKind::kCast, {t.ConstI("mask", {3, 3}, {1, 0, 0, 1, 1, 0, 1, 1, 1})},
                       MakeAttrs({{"to", std::string("f64")}}));
  ValueId bias = t.Op1(OpKind::kAdd, {relh, mask});
  ValueId qt = t.Op1(OpKind::kTranspose, {t.x}, MakeAttrs({{"perm", std::vector<int64_t>{0, 2, 1}}}));
  ValueId scores = t.Op1(OpKind::kAdd, {t.Op1(OpKind::kMatMul, {t.x, qt}), bias});
  // An embedding multiplied by a padding mask of its own shape (ESM, DeBERTa): trained.
  ValueId emb = t.Op1(OpKind::kGather, {t.Param("wte", {5, 4}), t.ConstI("ids", {2, 3}, {1, 2, 3, 4, 0, 1})});
  ValueId keep = t.Op1(OpKind::kCast, {t.ConstI("keep", {2, 3, 1}, {1, 1, 0, 1, 0, 0})},
                       MakeAttrs({{"to", std::string("f64")}}));
  ValueId h = t.Op1(OpKind::kMul, {emb, keep});
  t.Output(t.Op1(OpKind::kMatMul, {t.Op1(OpKind::kSoftmax, {scores}), t.Op1(OpKind::kAdd, {h, t.x})}));
  const auto d = Decide(t.g());
  EXPECT_EQ(d.at("rel_bias"), FreezeReason::kNone);
  EXPECT_EQ(d.at("wte"), FreezeReason::kNone);
}

TEST(TrainableTest, IntegerInitializersAreNeverParameters) {
  RuleGraph t;
  ValueId ids = t.IntInit("position_ids", {3}, {0, 1, 2});
  t.Output(t.Op1(OpKind::kAdd, {t.x, t.Op1(OpKind::kGather, {t.Param("wpe", {3, 4}), ids})}));
  absl::StatusOr<TrainableReport> r = DecideTrainable(t.g());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->decisions.size(), 2u);  // value-id order: position_ids, then wpe
  EXPECT_EQ(t.g().value(r->decisions[0].value).name, "position_ids");
  EXPECT_EQ(r->decisions[0].reason, FreezeReason::kNonFloat);
  EXPECT_FALSE(r->decisions[0].trainable);
  EXPECT_EQ(t.g().value(r->decisions[1].value).name, "wpe");
  EXPECT_TRUE(r->decisions[1].trainable);
  EXPECT_EQ(r->num_trainable(), 1);
}

// Marks `names` with what an export signature would record for them.
void Record(RuleGraph& t, std::initializer_list<const char*> names, ir::ExportedAs as) {
  for (const char* n : names) t.g().value(t.g().FindValue(n)).exported_as = as;
}

TEST(TrainableTest, BuffersOfTheExportSignatureAreFrozen) {
  // BART's head: logits = x @ lm_head + final_logits_bias, the bias a registered buffer (non-zero
  // here, so that only the signature tells it from a parameter).
  RuleGraph t;
  ValueId logits = t.Op1(OpKind::kMatMul, {t.x, t.Param("lm_head", {4, 6})});
  t.Output(t.Op1(OpKind::kAdd, {logits, t.Param("final_logits_bias", {1, 6})}));
  EXPECT_EQ(Decide(t.g()).at("final_logits_bias"), FreezeReason::kNone);  // no signature: a bias
  Record(t, {"lm_head"}, ir::ExportedAs::kParameter);
  Record(t, {"final_logits_bias"}, ir::ExportedAs::kBuffer);
  const auto d = Decide(t.g());
  EXPECT_EQ(d.at("final_logits_bias"), FreezeReason::kExportedBuffer);
  EXPECT_EQ(d.at("lm_head"), FreezeReason::kNone);
  // The user's flags come first: --train-only trains the buffer, --freeze freezes the weight.
  TrainableOptions flags;
  flags.train_only_regex = ".";
  flags.freeze_regex = "^lm_head$";
  const auto f = Decide(t.g(), flags);
  EXPECT_EQ(f.at("final_logits_bias"), FreezeReason::kNone);
  EXPECT_EQ(f.at("lm_head"), FreezeReason::kUserFreeze);
}

TEST(TrainableTest, ExporterMadeConstantsAreFrozenButTransposedWeightsTrained) {
  // A fixed-shape dynamo export: the position embedding gathered at 0..S-1 folded into a (1, S, D)
  // constant added to the token embeddings, and Linear weights folded into their transposes.
  RuleGraph t;
  ValueId emb = t.Op1(OpKind::kGather, {t.Param("wte", {5, 4}), t.ConstI("ids", {2, 3}, {1, 4, 1, 0, 2, 3})});
  ValueId h = t.Op1(OpKind::kAdd, {t.Op1(OpKind::kAdd, {emb, t.Param("embedding_1", {1, 3, 4})}), t.x});
  ValueId y = t.Op1(OpKind::kMatMul, {h, t.Param("val_50", {4, 4})});
  // A transposed weight read through a Cast (a mixed-precision export) is still a weight.
  ValueId w16 = t.Op1(OpKind::kCast, {t.Param("val_60", {4, 4})}, MakeAttrs({{"to", std::string("f64")}}));
  y = t.Op1(OpKind::kMatMul, {y, w16});
  // An exporter-made matrix that is also added somewhere is no Linear weight.
  ValueId m = t.Param("val_70", {3, 4});
  y = t.Op1(OpKind::kAdd, {y, m});
  t.Output(
      t.Op1(OpKind::kMatMul, {y, t.Op1(OpKind::kTranspose, {m}, MakeAttrs({{"perm", std::vector<int64_t>{1, 0}}}))}));
  // Without a signature all of them look like parameters: a learned (1, S, D) table is one.
  for (const auto& [name, reason] : Decide(t.g())) EXPECT_EQ(reason, FreezeReason::kNone) << name;
  Record(t, {"wte"}, ir::ExportedAs::kParameter);
  Record(t, {"embedding_1", "val_50", "val_60", "val_70"}, ir::ExportedAs::kExporterMade);
  const auto d = Decide(t.g());
  EXPECT_EQ(d.at("embedding_1"), FreezeReason::kExporterMade);
  EXPECT_EQ(d.at("val_70"), FreezeReason::kExporterMade);
  EXPECT_EQ(d.at("val_50"), FreezeReason::kNone);
  EXPECT_EQ(d.at("val_60"), FreezeReason::kNone);
  EXPECT_EQ(d.at("wte"), FreezeReason::kNone);
}

TEST(TrainableTest, ZeroRowsAddedToActivationsAreFrozen) {
  // BART's final_logits_bias in a TorchScript export: zeros (1, V), Cast, added to the logits.
  RuleGraph t;
  auto zeros = [&](const std::string& name, std::vector<int64_t> dims) {
    return t.g().AddConstant(name, ir::Tensor(ir::DType::kF64, std::move(dims)), /*is_initializer=*/true);
  };
  ValueId logits = t.Op1(OpKind::kMatMul, {t.x, t.Param("lm_head", {4, 6})});
  ValueId cast = t.Op1(OpKind::kCast, {zeros("final_logits_bias", {1, 6})}, MakeAttrs({{"to", std::string("f64")}}));
  ValueId y = t.Op1(OpKind::kAdd, {logits, cast});
  y = t.Op1(OpKind::kSub, {y, zeros("zero_3d", {1, 1, 6})});
  // Not zero rows: a zero-initialised bias parameter (rank 1), a zero row that scales, a zero
  // (1, 1) entry, and a non-zero row.
  y = t.Op1(OpKind::kAdd, {y, zeros("fc.bias", {6})});
  y = t.Op1(OpKind::kMul, {y, t.Op1(OpKind::kAdd, {zeros("gate", {1, 6}), t.ConstF("one", {}, 1, 1)})});
  y = t.Op1(OpKind::kAdd, {y, zeros("single", {1, 1})});
  t.Output(t.Op1(OpKind::kAdd, {y, t.Param("row", {1, 6})}));
  const auto d = Decide(t.g());
  EXPECT_EQ(d.at("final_logits_bias"), FreezeReason::kZeroRow);
  EXPECT_EQ(d.at("zero_3d"), FreezeReason::kZeroRow);
  for (const char* p : {"lm_head", "fc.bias", "gate", "single", "row"}) EXPECT_EQ(d.at(p), FreezeReason::kNone) << p;
}

TEST(TrainableTest, AWeightInAMatMulStaysTrainedWhateverElseUsesIt) {
  // A real weight also read by Shape (a reshape target) and compared with a threshold (a Where
  // condition):
  // the MatMul carries its gradient, so no rule freezes it, with or without a signature.
  RuleGraph t;
  ValueId w = t.Param("fc.weight", {4, 4});
  ValueId y = t.Op1(OpKind::kMatMul, {t.x, w});
  ValueId cols = t.Op1(OpKind::kShape, {w}, MakeAttrs({{"start", int64_t{1}}}));
  ValueId flat =
      t.Op1(OpKind::kReshape,
            {y, t.Op1(OpKind::kConcat, {t.ConstI("lead", {1}, {-1}), cols}, MakeAttrs({{"axis", int64_t{0}}}))});
  ValueId big = t.Op1(OpKind::kGreater, {w, t.ConstF("thr", {}, 0.5, 0.5)});
  ValueId masked = t.Op1(OpKind::kWhere, {big, w, t.ConstF("zero", {}, 0, 0)});
  t.Output(t.Op1(OpKind::kMatMul, {flat, masked}));
  EXPECT_EQ(Decide(t.g()).at("fc.weight"), FreezeReason::kNone);
  Record(t, {"fc.weight"}, ir::ExportedAs::kParameter);
  EXPECT_EQ(Decide(t.g()).at("fc.weight"), FreezeReason::kNone);
}

// Layer with a weight, a bias, a rank-0 scale and a positional buffer.
void BuildMixed(RuleGraph& t) {
  ValueId freqs = t.Op1(OpKind::kMul, {t.Positions(), t.Param("inv_freq", {4}, 0.01, 1)});
  ValueId y = t.Op1(OpKind::kLinear, {t.Op1(OpKind::kMul, {t.x, t.Op1(OpKind::kCos, {freqs})}),
                                      t.Param("fc.weight", {4, 4}), t.Param("fc.bias", {4})});
  t.Output(t.Op1(OpKind::kMul, {y, t.Scalar("scale", 0.5)}));
}

TEST(TrainableTest, FreezeAndTrainOnlyOverrideTheRule) {
  RuleGraph t;
  BuildMixed(t);
  TrainableOptions freeze;
  freeze.freeze_regex = "bias$";
  auto d = Decide(t.g(), freeze);
  EXPECT_EQ(d.at("fc.bias"), FreezeReason::kUserFreeze);
  EXPECT_EQ(d.at("fc.weight"), FreezeReason::kNone);
  EXPECT_EQ(d.at("scale"), FreezeReason::kScalar);

  // --train-only trains what it names, even a literal or a positional buffer, and nothing else.
  TrainableOptions only;
  only.train_only_regex = "^(scale|inv_freq|fc\\.weight)$";
  only.freeze_regex = "weight";  // --freeze wins
  d = Decide(t.g(), only);
  EXPECT_EQ(d.at("scale"), FreezeReason::kNone);
  EXPECT_EQ(d.at("inv_freq"), FreezeReason::kNone);
  EXPECT_EQ(d.at("fc.weight"), FreezeReason::kUserFreeze);
  EXPECT_EQ(d.at("fc.bias"), FreezeReason::kNotTrainOnly);

  TrainableOptions bad;
  bad.train_only_regex = "(";
  absl::StatusOr<TrainableReport> r = DecideTrainable(t.g(), bad);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("--train-only regex '('"));
}

TEST(TrainableTest, DecisionsAreMarkedOnceAndSummarisedPerReason) {
  RuleGraph t;
  BuildMixed(t);
  // A decision made before (the user's, on the imported graph) is kept.
  t.g().value(t.g().FindValue("scale")).param_state = ir::ParamState::kTrainable;
  absl::StatusOr<TrainableReport> r = MarkTrainable(&t.g());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->decisions.size(), 3u);  // inv_freq, fc.weight, fc.bias
  EXPECT_EQ(t.g().value(t.g().FindValue("inv_freq")).param_state, ir::ParamState::kFrozen);
  EXPECT_EQ(t.g().value(t.g().FindValue("fc.weight")).param_state, ir::ParamState::kTrainable);
  EXPECT_EQ(t.g().value(t.g().FindValue("scale")).param_state, ir::ParamState::kTrainable);
  const std::vector<std::string> lines = r->SummaryLines(t.g());
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("positional buffers"));
  EXPECT_THAT(lines[0], HasSubstr(": 1 (inv_freq)"));
  // Nothing left to decide the second time.
  r = MarkTrainable(&t.g());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->decisions.empty());
}

TEST(TrainableTest, ForwardPipelineFreezesBeforeFusionAndAutodiffSkipsFrozen) {
  RuleGraph t;
  BuildMixed(t);
  cpu::CpuEvaluator evaluator;
  ir::Graph g = t.g();
  ASSERT_TRUE(passes::RunForwardPipeline(&g, evaluator).ok());
  EXPECT_EQ(g.value(g.FindValue("inv_freq")).param_state, ir::ParamState::kFrozen);
  EXPECT_EQ(g.value(g.FindValue("scale")).param_state, ir::ParamState::kFrozen);
  // Loss = sum(y * w); gradients only for the Linear's weight and bias.
  ValueId y = g.outputs()[0];
  ValueId w = g.AddConstant("w", ir::Tensor(ir::DType::kF64, {2, 3, 4}));
  ValueId prod = g.AddValue("prod", ir::DType::kF64, {2, 3, 4});
  g.AddNode(OpKind::kMul, "loss_mul", {y, w}, {prod});
  ValueId loss = g.AddValue("loss", ir::DType::kF64, {});
  g.AddNode(OpKind::kReduceSum, "loss_sum", {prod}, {loss}, MakeAttrs({{"keepdims", int64_t{0}}}));
  absl::StatusOr<TrainingGraphInfo> info = BuildGradients(&g, loss, {});
  ASSERT_TRUE(info.ok()) << info.status();
  std::vector<std::string> params;
  for (const ParamGrad& pg : info->param_grads) params.push_back(g.value(pg.param).name);
  EXPECT_THAT(params, ::testing::UnorderedElementsAre("fc.weight", "fc.bias"));
  EXPECT_TRUE(info->unreachable_params.empty());
}

}  // namespace
}  // namespace onnxpipe::autodiff
