// FindTextInputs / EncodeTextSplit on hand-built graphs: the token input found through the data flow (not its
// name), the mask input and its values, and the inputs text cannot feed.
#include "executor/train/text_data.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onnxpipe::train {
namespace {

using ::testing::HasSubstr;

const ir::Shape kTokenShape = {ir::Dim::Symbol("batch"), ir::Dim::Symbol("len")};

// ids (B, S) -[Cast to i32]-> Gather(table (rows, 4)) -> (B, S, 4) output; plus `extra` graph inputs.
ir::Graph EmbeddingGraph(int64_t rows, bool cast, const std::vector<std::pair<std::string, ir::Value>>& extra) {
  ir::Graph g;
  const ir::ValueId ids = g.AddValue("input_ids", ir::DType::kI64, kTokenShape);
  g.inputs().push_back(ids);
  for (const auto& [name, v] : extra) g.inputs().push_back(g.AddValue(name, v.dtype, v.shape));
  ir::ValueId idx = ids;
  if (cast) {
    idx = g.AddValue("ids32", ir::DType::kI32, kTokenShape);
    ir::Attrs a;
    a.Set("to", static_cast<int64_t>(6));
    g.AddNode(ir::OpKind::kCast, "cast", {ids}, {idx}, a);
  }
  const ir::ValueId table = g.AddConstant("word_embeddings", ir::Tensor(ir::DType::kF32, {rows, 4}), true);
  const ir::ValueId out = g.AddValue("h", ir::DType::kF32, {kTokenShape[0], kTokenShape[1], 4});
  g.AddNode(ir::OpKind::kGather, "gather", {table, idx}, {out});
  g.outputs().push_back(out);
  return g;
}

ir::Value Input(ir::DType dtype, ir::Shape shape) {
  ir::Value v;
  v.dtype = dtype;
  v.shape = std::move(shape);
  return v;
}

TEST(TextInputs, FoundThroughACastWithTheTableRowsAndTheSequenceSymbol) {
  absl::StatusOr<TextInputs> t = FindTextInputs(EmbeddingGraph(37, /*cast=*/true, {}), "labels");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->tokens, "input_ids");
  EXPECT_EQ(t->embedding, "word_embeddings");
  EXPECT_EQ(t->embedding_rows, 37);
  EXPECT_FALSE(t->seq.has_value());
  EXPECT_EQ(t->seq_symbol, "len");
  EXPECT_TRUE(t->mask.empty());
}

TEST(TextInputs, AFixedSequenceLengthIsTheDefault) {
  ir::Graph g;
  const ir::Shape fixed = {ir::Dim::Symbol("B"), 16};
  const ir::ValueId ids = g.AddValue("x", ir::DType::kI32, fixed);
  g.inputs().push_back(ids);
  const ir::ValueId table = g.AddConstant("t", ir::Tensor(ir::DType::kF32, {50, 8}), true);
  const ir::ValueId out = g.AddValue("h", ir::DType::kF32, {fixed[0], 16, 8});
  g.AddNode(ir::OpKind::kGather, "gather", {table, ids}, {out});
  g.outputs().push_back(out);
  absl::StatusOr<TextInputs> t = FindTextInputs(g, "labels");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(t->seq.has_value());
  EXPECT_EQ(*t->seq, 16);
  EXPECT_EQ(t->tokens_dtype, ir::DType::kI32);
  EXPECT_EQ(t->embedding_rows, 50);
}

TEST(TextInputs, ASecondInputOfTheTokenShapeIsTheMask) {
  absl::StatusOr<TextInputs> t =
      FindTextInputs(EmbeddingGraph(10, false, {{"m", Input(ir::DType::kBool, kTokenShape)}}), "labels");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->mask, "m");
  EXPECT_EQ(t->mask_dtype, ir::DType::kBool);
}

TEST(TextInputs, OtherInputsAreNamedInTheError) {
  absl::StatusOr<TextInputs> t = FindTextInputs(
      EmbeddingGraph(10, false, {{"pixel_values", Input(ir::DType::kF32, {ir::Dim::Symbol("batch"), 3})}}),
      "labels");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("graph input 'pixel_values' (f32 (batch, 3)) cannot be fed from text"));
  // A model that computes its own loss takes the labels as an input: that one is fed.
  t = FindTextInputs(EmbeddingGraph(10, false, {{"labels", Input(ir::DType::kI64, {ir::Dim::Symbol("batch")})}}),
                     "labels");
  EXPECT_TRUE(t.ok()) << t.status();
}

TEST(TextInputs, NoEmbeddingGatherIsAnError) {
  ir::Graph g;
  const ir::ValueId x = g.AddValue("x", ir::DType::kI64, kTokenShape);
  g.inputs().push_back(x);
  g.outputs().push_back(x);
  absl::StatusOr<TextInputs> t = FindTextInputs(g, "labels");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("needs a token-id input"));
  EXPECT_THAT(t.status().message(), HasSubstr("'x' (i64 (batch, len))"));
}

TEST(TextInputs, EncodingPadsTruncatesAndWritesTheMaskInEitherConvention) {
  absl::StatusOr<text::Vocabulary> vocab = text::Vocabulary::Build({"b a a", "c"}, 10);
  ASSERT_TRUE(vocab.ok());
  text::TextSplit split;
  split.texts = {"a b c a", "zzz"};
  split.labels = {1, 0};
  TextInputs in;
  in.tokens = "ids";
  in.tokens_dtype = ir::DType::kI32;
  in.mask = "mask";
  in.mask_dtype = ir::DType::kF32;
  // Vocabulary: <pad> 0, <unk> 1, a 2 (twice), b 3, c 4 (byte order breaks the tie).
  std::map<std::string, ir::Tensor> t = EncodeTextSplit(split, *vocab, 3, in, MaskConvention::kAuto, "y");
  ASSERT_EQ(t.at("ids").dtype(), ir::DType::kI32);
  EXPECT_EQ(std::vector<int32_t>(t.at("ids").data<int32_t>(), t.at("ids").data<int32_t>() + 6),
            (std::vector<int32_t>{2, 3, 4, 1, 0, 0}));
  EXPECT_EQ(std::vector<float>(t.at("mask").data<float>(), t.at("mask").data<float>() + 6),
            (std::vector<float>{1, 1, 1, 1, 0, 0}));  // float mask: keep
  EXPECT_EQ(t.at("y").data<int64_t>()[0], 1);
  t = EncodeTextSplit(split, *vocab, 3, in, MaskConvention::kPad, "y");
  EXPECT_EQ(std::vector<float>(t.at("mask").data<float>(), t.at("mask").data<float>() + 6),
            (std::vector<float>{0, 0, 0, 0, 1, 1}));
  in.mask_dtype = ir::DType::kBool;  // bool mask: pad (PyTorch's key_padding_mask)
  t = EncodeTextSplit(split, *vocab, 3, in, MaskConvention::kAuto, "y");
  EXPECT_EQ(std::vector<bool>(t.at("mask").data<bool>(), t.at("mask").data<bool>() + 6),
            (std::vector<bool>{false, false, false, false, true, true}));
}

}  // namespace
}  // namespace onnxpipe::train
