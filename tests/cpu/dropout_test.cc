// Dropout: Philox known-answer vectors, inference identity, reproducibility per context, mask
// independence from the thread count, keep ratio within statistical bounds, scaling.
#include <cmath>
#include <cstring>

#include "executor/cpu/dropout.h"
#include "executor/cpu/thread_pool.h"
#include "tests/cpu/test_util.h"

namespace onnxpipe::cpu::testing {
namespace {

using ir::DType;
using ir::OpKind;
using ir::Tensor;

TEST(Philox, KnownAnswerVectors) {
  // Random123 kat_vectors for philox4x32 with 10 rounds.
  Philox4x32 r0 = Philox4x32_10(Philox4x32{{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(r0.v[0], 0x6627e8d5u);
  EXPECT_EQ(r0.v[1], 0xe169c58du);
  EXPECT_EQ(r0.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r0.v[3], 0x9b00dbd8u);
  Philox4x32 r1 = Philox4x32_10(Philox4x32{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu);
  EXPECT_EQ(r1.v[0], 0x408f276du);
  EXPECT_EQ(r1.v[1], 0x41c83b0eu);
  EXPECT_EQ(r1.v[2], 0xa20bc7c6u);
  EXPECT_EQ(r1.v[3], 0x6d5451fdu);
  Philox4x32 r2 = Philox4x32_10(Philox4x32{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(r2.v[0], 0xd16cfe09u);
  EXPECT_EQ(r2.v[1], 0x94fdccebu);
  EXPECT_EQ(r2.v[2], 0x5001e420u);
  EXPECT_EQ(r2.v[3], 0x24126ea1u);
}

// The stream as philox.h documents it, from Philox4x32_10 and SplitMix64 directly: element i's
// 16-bit draw is half i % 2 of word (i / 2) % 4 of the block of counter i / 8; kept iff draw >=
// ceil(ratio * 2^16).
TEST(Philox, DropoutStreamDrawsSixteenBitsPerElementEightPerBlock) {
  const uint64_t seed = 5, node_key = 77, offset = (uint64_t{9} << 32) | 3;
  const DropoutStream s = DropoutStream::Make(seed, node_key, offset, 0.3);
  EXPECT_EQ(s.threshold, 19661u);  // 0.3 * 65536 = 19660.8
  const uint64_t key = SplitMix64(seed ^ SplitMix64(node_key));
  int64_t kept = 0, n = 0;
  for (uint64_t start : {uint64_t{0}, (uint64_t{1} << 35) + 5}) {
    for (uint64_t i = start; i < start + 200; ++i, ++n) {
      const uint64_t b = i / 8;
      const Philox4x32 r = Philox4x32_10(
          Philox4x32{{static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32), 3u, 9u}},
          static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32));
      const uint32_t word = r.v[(i / 2) % 4];
      const uint32_t draw = i % 2 == 0 ? word & 0xFFFFu : word >> 16;
      EXPECT_EQ(s.Keep(i), draw >= 19661u) << i;
      kept += draw >= 19661u;
    }
  }
  EXPECT_GT(kept, n / 2);  // about 70 % of 400
  EXPECT_LT(kept, n - n / 8);
  // Ratio 0 keeps everything, 1 drops everything (no 16-bit draw reaches 2^16).
  EXPECT_EQ(DropoutStream::Make(seed, node_key, offset, 0.0).Kept8(s.Block(1)), 0xFFu);
  EXPECT_EQ(DropoutStream::Make(seed, node_key, offset, 1.0).Kept8(s.Block(1)), 0u);
}

ir::Node DropoutNode(double ratio, const std::string& name = "/layers.0/dropout/Dropout") {
  ir::Attrs a;
  a.Set("ratio", ratio);
  return MakeNode(OpKind::kDropout, 1, 2, a, name);
}

TEST(Dropout, InferenceIsIdentityWithAllTrueMask) {
  Tensor x = Rand(DType::kF32, {3, 5}, 1);
  auto r = Eval(DropoutNode(0.5), {x});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE((*r)[0].BitwiseEquals(x));
  EXPECT_EQ((*r)[1].dtype(), DType::kBool);
  EXPECT_EQ((*r)[1].ToInt64Vector(), std::vector<int64_t>(15, 1));
  // Training with ratio 0 is the identity too.
  auto z = Eval(DropoutNode(0.0), {x}, EvalContext{true, 1, 2});
  EXPECT_TRUE((*z)[0].BitwiseEquals(x));
}

TEST(Dropout, TrainingMaskIsReproducibleAndKeyedByContextAndNode) {
  for (DType dt : FloatDTypes()) {
    Tensor x = Rand(dt, {64, 33}, 2, 0.5, 1.5);
    const EvalContext ctx{true, 42, 3};
    auto a = Eval(DropoutNode(0.3), {x}, ctx);
    auto b = Eval(DropoutNode(0.3), {x}, ctx);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE((*a)[0].BitwiseEquals((*b)[0]));
    EXPECT_TRUE((*a)[1].BitwiseEquals((*b)[1]));
    EXPECT_FALSE((*a)[1].BitwiseEquals((*Eval(DropoutNode(0.3), {x}, EvalContext{true, 42, 4}))[1]));
    EXPECT_FALSE((*a)[1].BitwiseEquals((*Eval(DropoutNode(0.3), {x}, EvalContext{true, 43, 3}))[1]));
    EXPECT_FALSE((*a)[1].BitwiseEquals((*Eval(DropoutNode(0.3, "/layers.1/dropout/Dropout"), {x}, ctx))[1]));
    // A clone carrying rng_key replays the original node's mask (recompute, backward).
    ir::Node clone = DropoutNode(0.3, "/layers.0/dropout/Dropout_recompute");
    clone.attrs.Set("rng_key", std::string("/layers.0/dropout/Dropout"));
    EXPECT_TRUE((*a)[1].BitwiseEquals((*Eval(clone, {x}, ctx))[1]));
    // Kept values are scaled by 1 / (1 - ratio), dropped ones are 0.
    const Tensor& y = (*a)[0];
    const Tensor& m = (*a)[1];
    for (int64_t i = 0; i < x.num_elements(); ++i) {
      const double want = m.data<bool>()[i] ? x.GetAsDouble(i) / 0.7 : 0.0;
      EXPECT_NEAR(y.GetAsDouble(i), want, 1e-6 * std::fabs(want)) << i;
    }
    // The mask agrees with the documented stream element by element.
    const DropoutStream s = MakeDropoutStream(DropoutNode(0.3), ctx, 0.3);
    for (int64_t i = 0; i < x.num_elements(); i += 97) EXPECT_EQ(m.data<bool>()[i], s.Keep(i)) << i;
  }
}

TEST(Dropout, KeepFractionMatchesRatio) {
  const int64_t n = 1 << 20;
  Tensor x(DType::kF32, {n});
  std::fill_n(x.mutable_data<float>(), n, 1.0f);
  for (double ratio : {0.1, 0.5, 0.9}) {
    auto r = Eval(DropoutNode(ratio), {x}, EvalContext{true, 7, 0});
    ASSERT_TRUE(r.ok());
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) kept += (*r)[1].data<bool>()[i];
    const double p = 1 - ratio, sigma = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(static_cast<double>(kept) / n, p, 5 * sigma) << ratio;
  }
  // ratio 1 drops everything; outside [0, 1] is an error.
  auto all = Eval(DropoutNode(1.0), {x}, EvalContext{true, 7, 0});
  EXPECT_EQ((*all)[0].GetAsDouble(123), 0.0);
  EXPECT_FALSE(Eval(DropoutNode(1.5), {x}, EvalContext{true, 7, 0}).ok());
}

TEST(Dropout, MaskDoesNotDependOnThreadCount) {
  Tensor x = Rand(DType::kF32, {100003}, 3);
  std::vector<Tensor> masks;
  for (int threads : {1, 2, 5}) {
    ThreadPool::SetGlobalNumThreads(threads);
    auto r = Eval(DropoutNode(0.4), {x}, EvalContext{true, 9, 11});
    ASSERT_TRUE(r.ok());
    masks.push_back((*r)[1]);
  }
  ThreadPool::SetGlobalNumThreads(0);
  EXPECT_TRUE(masks[0].BitwiseEquals(masks[1]));
  EXPECT_TRUE(masks[0].BitwiseEquals(masks[2]));
}

// Rows [begin, end) of t along dim 0, copied.
Tensor Rows(const Tensor& t, int64_t begin, int64_t end) {
  std::vector<int64_t> dims = t.dims();
  const int64_t row_bytes = t.num_bytes() / dims[0];
  dims[0] = end - begin;
  Tensor out(t.dtype(), dims);
  std::memcpy(out.raw(), static_cast<const uint8_t*>(t.raw()) + begin * row_bytes, out.num_bytes());
  return out;
}

// A micro-batch (EvalContext row_offset/rows) draws exactly its rows of the full batch's masks:
// Dropout on (B, S, D), and Attention's dropout on (B, H, S, S) and on heads merged into the batch
// dim (B*H, S, S); evaluated in halves and quarters, bitwise equal to the rows of the whole batch.
TEST(Dropout, MicrobatchRowsDrawTheFullBatchMask) {
  const EvalContext full{true, 11, 5};
  const Tensor x = Rand(DType::kF64, {8, 3, 5}, 21, 0.5, 1.5);
  const ir::Node drop = DropoutNode(0.4);
  auto want = Eval(drop, {x}, full);
  ASSERT_TRUE(want.ok()) << want.status();
  ir::Attrs aa;
  aa.Set("dropout", 0.3);
  const ir::Node attn = MakeNode(OpKind::kAttention, 3, 1, aa, "/attn");
  const Tensor q = Rand(DType::kF64, {8, 2, 4, 6}, 22), k = Rand(DType::kF64, {8, 2, 5, 6}, 23),
               v = Rand(DType::kF64, {8, 2, 5, 6}, 24);
  const Tensor want_attn = Eval1(attn, {q, k, v}, full);
  // The same with the heads merged: (B*H, S, Dh), batch-major.
  const Tensor qm = q.Reshaped({16, 4, 6}), km = k.Reshaped({16, 5, 6}), vm = v.Reshaped({16, 5, 6});
  const Tensor want_merged = Eval1(attn, {qm, km, vm}, full);
  EXPECT_TRUE(want_merged.BitwiseEquals(want_attn.Reshaped({16, 4, 6})));
  for (int64_t rows : {4, 2}) {
    for (int64_t begin = 0; begin < 8; begin += rows) {
      EvalContext ctx = full;
      ctx.row_offset = begin;
      ctx.rows = rows;
      const std::string where = "rows " + std::to_string(begin) + "+" + std::to_string(rows);
      auto got = Eval(drop, {Rows(x, begin, begin + rows)}, ctx);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE((*got)[0].BitwiseEquals(Rows((*want)[0], begin, begin + rows))) << where;
      EXPECT_TRUE((*got)[1].BitwiseEquals(Rows((*want)[1], begin, begin + rows))) << where;
      const Tensor a = Eval1(attn, {Rows(q, begin, begin + rows), Rows(k, begin, begin + rows),
                                    Rows(v, begin, begin + rows)}, ctx);
      EXPECT_TRUE(a.BitwiseEquals(Rows(want_attn, begin, begin + rows))) << where;
      const Tensor am = Eval1(attn, {Rows(qm, 2 * begin, 2 * (begin + rows)), Rows(km, 2 * begin, 2 * (begin + rows)),
                                     Rows(vm, 2 * begin, 2 * (begin + rows))}, ctx);
      EXPECT_TRUE(am.BitwiseEquals(Rows(want_merged, 2 * begin, 2 * (begin + rows)))) << where;
    }
  }
  // The masks really depend on the row: a micro-batch without its offset draws other masks.
  EvalContext no_offset = full;
  auto other = Eval(drop, {Rows(x, 4, 8)}, no_offset);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE((*other)[1].BitwiseEquals(Rows((*want)[1], 4, 8)));
  // A tensor that does not split into the micro-batch's rows is an error naming the node.
  EvalContext bad = full;
  bad.row_offset = 3;
  bad.rows = 3;
  auto err = Eval(drop, {Rand(DType::kF64, {4, 5}, 25)}, bad);
  ASSERT_FALSE(err.ok());
  EXPECT_NE(err.status().message().find("/layers.0/dropout/Dropout"), std::string::npos) << err.status();
}

// The decisions of a Dropout's bool mask packed as op.h's KeepBits (bit k of byte j: element 8 j + k).
std::vector<int64_t> PackedMask(const Tensor& mask) {
  const std::vector<int64_t> m = mask.ToInt64Vector();
  std::vector<int64_t> bytes(m.size() / 8, 0);
  for (size_t i = 0; i < m.size(); ++i) bytes[i / 8] |= (m[i] != 0 ? 1 : 0) << (i % 8);
  return bytes;
}

TEST(Dropout, GeluKeepBitsAreTheDropoutsMaskAndItsGradientReadsThem) {
  ir::Attrs a;
  a.Set("dropout", 0.3);
  a.Set("rng_key", std::string("/mlp/dropout/Dropout"));
  const ir::Node gelu = MakeNode(OpKind::kGelu, 1, 2, a, "/mlp/act/Gelu");
  const ir::Node grad = MakeNode(OpKind::kGeluGrad, 3, 1, a, "/mlp/act/Gelu_grad");
  const ir::Node regen = MakeNode(OpKind::kGeluGrad, 2, 1, a, "/mlp/act/Gelu_grad");
  const Tensor x = Rand(DType::kF32, {6, 5, 24}, 3, -3.0, 3.0);
  const Tensor dy = Rand(DType::kF32, {6, 5, 24}, 4);
  // A whole batch, and rows [3, 9) of one (a micro-batch's counters, not a multiple of 8).
  for (EvalContext ctx : {EvalContext{true, 42, 3}, EvalContext{true, 42, 3, 3, 6}}) {
    SCOPED_TRACE(ctx.row_offset);
    auto fwd = Eval(gelu, {x}, ctx);
    auto drop = Eval(DropoutNode(0.3, "/mlp/dropout/Dropout"), {x}, ctx);
    ASSERT_TRUE(fwd.ok() && drop.ok()) << fwd.status() << drop.status();
    const Tensor& bits = (*fwd)[1];
    EXPECT_EQ(bits.dtype(), DType::kU8);
    EXPECT_EQ(bits.dims(), (std::vector<int64_t>{6, 5, 3}));
    EXPECT_EQ(bits.ToInt64Vector(), PackedMask((*drop)[1]));
    auto with_bits = Eval(grad, {dy, x, bits}, ctx);
    auto regenerated = Eval(regen, {dy, x}, ctx);
    ASSERT_TRUE(with_bits.ok() && regenerated.ok()) << with_bits.status() << regenerated.status();
    EXPECT_TRUE((*with_bits)[0].BitwiseEquals((*regenerated)[0]));
    // The bits are read, not drawn again: flipping one changes that element only.
    Tensor flipped = bits.Clone();
    flipped.mutable_data<uint8_t>()[2] ^= 0x10;
    auto changed = Eval(grad, {dy, x, flipped}, ctx);
    ASSERT_TRUE(changed.ok());
    for (int64_t i = 0; i < x.num_elements(); ++i)
      EXPECT_EQ((*changed)[0].GetAsDouble(i) != (*regenerated)[0].GetAsDouble(i), i == 20) << i;
  }
  // Inference keeps everything.
  auto eval = Eval(gelu, {x});
  ASSERT_TRUE(eval.ok());
  EXPECT_EQ((*eval)[1].ToInt64Vector(), std::vector<int64_t>(90, 0xFF));
  // Bits of another shape, or of a last dim no multiple of 8, are errors naming the node.
  auto bad = Eval(grad, {dy, x, Tensor(DType::kU8, {6, 5, 4})}, EvalContext{true, 42, 3});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("/mlp/act/Gelu_grad"), std::string::npos) << bad.status();
  auto odd = Eval(gelu, {Rand(DType::kF32, {2, 12}, 5)}, EvalContext{true, 42, 3});
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("multiple of 8"), std::string::npos) << odd.status();
}

}  // namespace
}  // namespace onnxpipe::cpu::testing
