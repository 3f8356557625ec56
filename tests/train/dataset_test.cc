// Dataset: checks against the model's inputs, label checks, and the row order of each step.
#include "executor/train/dataset.h"

#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onnxpipe::train {
namespace {

using ::testing::HasSubstr;

std::vector<FieldSpec> TokenFields() {
  FieldSpec tokens{"tokens", ir::DType::kI64, {ir::Dim::Symbol("S")}, {}};
  FieldSpec labels{"labels", ir::DType::kI64, {}, {ir::DType::kI32}};
  return {tokens, labels};
}

std::map<std::string, ir::Tensor> TokenData(int64_t rows, int64_t seq) {
  std::vector<int64_t> tok(rows * seq), lab(rows);
  for (int64_t i = 0; i < rows * seq; ++i) tok[i] = i;
  for (int64_t i = 0; i < rows; ++i) lab[i] = i % 2;
  return {{"tokens", ir::Tensor::FromVector<int64_t>({rows, seq}, tok)},
          {"labels", ir::Tensor::FromVector<int64_t>({rows}, lab)}};
}

TEST(Dataset, BindsSymbolsAndGathersRows) {
  std::map<std::string, int64_t> bindings;
  absl::StatusOr<Dataset> d = Dataset::FromTensors(TokenData(5, 3), TokenFields(), 2, &bindings);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->rows(), 5);
  EXPECT_EQ(bindings.at("S"), 3);
  const ir::Tensor t = d->Gather("tokens", {4, 1});
  ASSERT_EQ(t.dims(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.data<int64_t>()[0], 12);
  EXPECT_EQ(t.data<int64_t>()[3], 3);
}

TEST(Dataset, RowsWrapPerEpochInOrder) {
  std::map<std::string, int64_t> bindings;
  Dataset d = *Dataset::FromTensors(TokenData(5, 1), TokenFields(), 2, &bindings);
  // Step k uses rows (2k + j) mod 5.
  EXPECT_EQ(d.BatchRows(0, 2, false, 0), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(d.BatchRows(2, 2, false, 0), (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(d.BatchRows(3, 2, false, 0), (std::vector<int64_t>{1, 2}));
}

TEST(Dataset, ShuffleIsASeededPermutationPerEpoch) {
  std::map<std::string, int64_t> bindings;
  Dataset d = *Dataset::FromTensors(TokenData(10, 1), TokenFields(), 5, &bindings);
  std::vector<int64_t> epoch0, epoch1;
  for (int k = 0; k < 2; ++k) {
    for (int64_t r : d.BatchRows(k, 5, true, 42)) epoch0.push_back(r);
    for (int64_t r : d.BatchRows(k + 2, 5, true, 42)) epoch1.push_back(r);
  }
  EXPECT_EQ(std::set<int64_t>(epoch0.begin(), epoch0.end()).size(), 10u);  // every row once
  EXPECT_EQ(std::set<int64_t>(epoch1.begin(), epoch1.end()).size(), 10u);
  EXPECT_NE(epoch0, epoch1);  // a new order per epoch
  std::vector<int64_t> identity(10);
  for (int i = 0; i < 10; ++i) identity[i] = i;
  EXPECT_NE(epoch0, identity);
  EXPECT_EQ(d.BatchRows(1, 5, true, 42), d.BatchRows(1, 5, true, 42));  // reproducible
  EXPECT_NE(d.BatchRows(0, 5, true, 42), d.BatchRows(0, 5, true, 43));
}

TEST(Dataset, RejectsMismatchedData) {
  std::map<std::string, int64_t> bindings;
  auto data = TokenData(5, 3);
  data["tokens"] = data["tokens"].CastTo(ir::DType::kF32);
  EXPECT_THAT(Dataset::FromTensors(data, TokenFields(), 2, &bindings).status().message(),
              HasSubstr("'tokens' expects dtype i64 but the file holds f32"));

  bindings = {{"S", 4}};  // e.g. from --seq
  EXPECT_THAT(Dataset::FromTensors(TokenData(5, 3), TokenFields(), 2, &bindings).status().message(),
              HasSubstr("'tokens' dim 1 ('S') is 3 but it is bound to 4"));

  bindings.clear();
  data = TokenData(5, 3);
  data["labels"] = ir::Tensor(ir::DType::kI64, {4});
  EXPECT_THAT(Dataset::FromTensors(data, TokenFields(), 2, &bindings).status().message(),
              HasSubstr("labels.npy has 4 rows but tokens.npy has 5"));

  bindings.clear();
  EXPECT_THAT(Dataset::FromTensors(TokenData(5, 3), TokenFields(), 6, &bindings).status().message(),
              HasSubstr("fewer than --batch 6"));

  bindings.clear();
  data = TokenData(5, 3);
  data["tokens"] = ir::Tensor(ir::DType::kI64, {5});
  EXPECT_THAT(Dataset::FromTensors(data, TokenFields(), 2, &bindings).status().message(),
              HasSubstr("expects dims (N, S)"));
}

TEST(Dataset, LabelChecksNameTheRow) {
  std::map<std::string, int64_t> bindings;
  auto data = TokenData(5, 3);
  data["labels"] = ir::Tensor::FromVector<int32_t>({5}, {0, 1, 1, 2, -100});  // i32 accepted
  Dataset d = *Dataset::FromTensors(data, TokenFields(), 2, &bindings);
  EXPECT_EQ(d.field("labels").dtype(), ir::DType::kI64);
  EXPECT_TRUE(d.CheckLabels("labels", 3, -100).ok());
  EXPECT_THAT(d.CheckLabels("labels", 2, -100).message(),
              HasSubstr("labels.npy row 3: label 2 is out of range [0, 2)"));
  EXPECT_THAT(d.CheckLabels("labels", 3, -1).message(), HasSubstr("row 4: label -100"));
}

TEST(Dataset, MissingFileIsNamed) {
  std::map<std::string, int64_t> bindings;
  EXPECT_THAT(Dataset::Load("/nonexistent_dir_xyz", TokenFields(), 1, &bindings).status().message(),
              HasSubstr("not a directory"));
  EXPECT_THAT(Dataset::Load(ONNXPIPE_SOURCE_DIR "/models", TokenFields(), 1, &bindings)
                  .status()
                  .message(),
              HasSubstr("tokens.npy is missing"));
}

}  // namespace
}  // namespace onnxpipe::train
