// Every kind of bad input gets an error status whose message names the file and the culprit
// (node, op type, value, tensor) and says what was expected.
#include <string>
#include <vector>

#include "frontend/onnx/loader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/onnx/test_util.h"

namespace onnxpipe::onnx_frontend {
namespace {

using ::testing::HasSubstr;
using testing::TestModel;

struct BadCase {
  std::string file;  // bad/<file>.onnx
  absl::StatusCode code;
  std::vector<std::string> mentions;  // substrings the message must contain
};

std::vector<BadCase> BadCases() {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  return {
      {"truncated", kInvalid, {"not a valid ONNX model protobuf", "truncated"}},
      {"tensor_not_model", kInvalid, {"not an ONNX model", "no graph"}},
      {"opset11", kInvalid, {"opset 11", "opsets 13 to 23"}},
      {"opset24", kInvalid, {"opset 24", "opsets 13 to 23"}},
      {"no_opset", kInvalid, {"no ai.onnx opset", "13 to 23"}},
      {"unknown_op", kInvalid, {"2 node(s) with unsupported ops", "'my_fancy' (FancyOp)",
                                "'my_round' (Round)"}},
      {"custom_domain", kInvalid, {"'custom_relu' (com.example::Relu)", "domain 'com.example'"}},
      {"layernorm_op14", kInvalid, {"'early_ln' (LayerNormalization)", "exists from opset 17",
                                    "uses 14"}},
      {"dangling", kInvalid, {"'dangling_add' (Add)", "input 1 'nowhere'", "dangling input"}},
      {"cycle_op17", kInvalid, {"cycle", "'cyc_a'", "(Add)"}},
      {"cycle_op18", kInvalid, {"cycle", "'cyc_a'", "(Add)"}},
      {"init_raw_size", kInvalid, {"initializer 'short_w'", "8 bytes of raw_data", "need 12 bytes"}},
      {"init_typed_count", kInvalid, {"initializer 'few_w'", "2 elements in float_data", "need 3"}},
      {"init_negative_dim", kInvalid, {"initializer 'neg_w'", "negative dimension -3"}},
      {"init_absurd_dims", kInvalid, {"initializer 'huge_w'", "exceeds 2^40"}},
      {"input_negative_dim", kInvalid, {"value 'x'", "negative dimension -5"}},
      {"input_overflow_dims", kInvalid, {"value 'x'", "exceeds 2^40"}},
      {"dup_node_outputs", kInvalid, {"'y' is defined twice", "'first_def' (Relu)",
                                      "'second_def' (Neg)", "SSA"}},
      {"dup_input_node", kInvalid, {"'x' is defined twice", "graph input #0", "'redefines_x'"}},
      {"dup_initializers", kInvalid, {"'w' is defined twice", "initializer #0", "initializer #1"}},
      {"undefined_output", kInvalid, {"graph output 'ghost'", "not produced"}},
      {"axes_not_constant_op17", kInvalid, {"'dyn_reduce' (ReduceSum)",
                                            "input 1 ('axes', axes)", "must be a constant"}},
      {"axes_not_constant_op18", kInvalid, {"'dyn_reduce' (ReduceSum)",
                                            "input 1 ('axes', axes)", "must be a constant"}},
      {"named_tensor", kInvalid, {"not a valid ONNX model protobuf"}},
      {"string_input", kInvalid, {"value 'x'", "STRING", "not supported"}},
      {"bad_attr_type", kInvalid, {"'bad_axis' (Softmax)", "attribute 'axis'", "FLOAT",
                                   "expected INT"}},
      {"checker_rejects", kInvalid, {"libonnx checker", "axis"}},
      {"layernorm_axis_below_rank", kInvalid, {"libonnx shape inference",
                                               "axis -7 is out of range for an input of rank 3"}},
      {"layernorm_scalar", kInvalid, {"libonnx shape inference",
                                      "axis -1 is out of range for an input of rank 0"}},
      {"subgraph_attr", kInvalid, {"'with_body' (Relu)", "attribute 'body'", "subgraphs"}},
      {"attr_tensor_escape", kInvalid, {"'sneaky_const' (Constant)", "attribute 'value'",
                                        "'../secret.bin' escapes the model's folder"}},
      {"concat_no_axis", kInvalid, {"'cat' (Concat)", "missing required attribute 'axis'"}},
      {"cast_to_string", kInvalid, {"'to_str' (Cast)", "attribute to", "STRING",
                                    "not supported"}},
      {"dropout_dynamic_ratio", kInvalid, {"'dyn_drop' (Dropout)", "input 1 ('r', ratio)",
                                           "must be a constant"}},
      {"gelu_bad_approximate", kInvalid, {"'gelu_erf'", "approximate must be 'none' or 'tanh'", "got 'erf'"}},
      {"cumsum_dynamic_axis", kInvalid, {"'dyn_cumsum' (CumSum)", "input 1 ('ax', axis)",
                                         "must be a constant"}},
      {"gathernd_negative_batch_dims", kInvalid, {"'neg_batch' (GatherND)", "batch_dims must be >= 0",
                                                  "got -1"}},
  };
}

class BadInputTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadInputTest, FailsNamingTheCulprit) {
  const BadCase& c = GetParam();
  const std::string path = TestModel("bad/" + c.file + ".onnx");
  absl::StatusOr<LoadedModel> m = LoadOnnxModel(path);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), c.code) << m.status();
  const std::string msg(m.status().message());
  EXPECT_THAT(msg, HasSubstr(path));  // every message names the file
  for (const std::string& s : c.mentions) EXPECT_THAT(msg, HasSubstr(s));
}

INSTANTIATE_TEST_SUITE_P(All, BadInputTest, ::testing::ValuesIn(BadCases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.file; });

TEST(BadInputTest, MissingFileIsNotFound) {
  absl::StatusOr<LoadedModel> m = LoadOnnxModel(TestModel("bad/does_not_exist.onnx"));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(m.status().message(), HasSubstr("does_not_exist.onnx"));
}

TEST(BadInputTest, DirectoryIsNotAModel) {
  absl::StatusOr<LoadedModel> m = LoadOnnxModel(TestModel("bad"));
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("not a regular file"));
}

TEST(BadInputTest, RandomBytesFail) {
  const std::string path = TestModel("bad/random.onnx");
  absl::StatusOr<LoadedModel> m = LoadOnnxModel(path);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr(path));
}

TEST(BadInputTest, EmptyBytesAreNotAModel) {
  absl::StatusOr<LoadedModel> m = LoadOnnxModelFromBytes("", "empty.onnx", "");
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("empty.onnx: not an ONNX model"));
}

TEST(UnsupportedOpsTest, AllowUnsupportedReturnsTheSummaryWithoutAGraph) {
  LoadOptions options;
  options.allow_unsupported = true;
  absl::StatusOr<LoadedModel> m = LoadOnnxModel(TestModel("bad/unknown_op.onnx"), options);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(m->graph.has_value());
  ASSERT_EQ(m->summary.unsupported.size(), 2u);
  EXPECT_EQ(m->summary.unsupported[0].node_name, "my_fancy");
  EXPECT_EQ(m->summary.unsupported[0].op_type, "FancyOp");
  EXPECT_EQ(m->summary.unsupported[0].domain, "");
  EXPECT_EQ(m->summary.unsupported[1].node_name, "my_round");
  EXPECT_EQ(m->summary.unsupported[1].op_type, "Round");
  EXPECT_EQ(m->summary.num_nodes, 3);
  EXPECT_EQ(m->summary.op_histogram,
            (std::map<std::string, int64_t>{{"FancyOp", 1}, {"Relu", 1}, {"Round", 1}}));
  ASSERT_EQ(m->warnings.size(), 1u);
  EXPECT_THAT(m->warnings[0], HasSubstr("my_fancy"));

  absl::StatusOr<LoadedModel> custom = LoadOnnxModel(TestModel("bad/custom_domain.onnx"), options);
  ASSERT_TRUE(custom.ok()) << custom.status();
  ASSERT_EQ(custom->summary.unsupported.size(), 1u);
  EXPECT_EQ(custom->summary.unsupported[0].domain, "com.example");
  EXPECT_EQ(custom->summary.unsupported[0].op_type, "Relu");
}

TEST(UnsupportedOpsTest, AllowUnsupportedStillRefusesBadFiles) {
  LoadOptions options;
  options.allow_unsupported = true;
  EXPECT_FALSE(LoadOnnxModel(TestModel("bad/opset11.onnx"), options).ok());
  EXPECT_FALSE(LoadOnnxModel(TestModel("bad/dangling.onnx"), options).ok());
}

}  // namespace
}  // namespace onnxpipe::onnx_frontend
