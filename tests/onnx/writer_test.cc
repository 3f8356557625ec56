// Checkpoint writer: the written model reloads (with onnxpipe and with onnx's own Python loader)
// with the new initializer values, large tensors go to the side file, and mismatches are refused.
#include "frontend/onnx/writer.h"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "frontend/onnx/loader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/onnx/test_util.h"

namespace onnxpipe::onnx_frontend {
namespace {

namespace fs = std::filesystem;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using testing::TestModel;
using testing::Values;

class WriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(ONNXPIPE_BINARY_DIR) / "tests" / "onnx" /
           absl::StrCat("writer_", ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                        "_", ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // src.onnx: big f32 [16,4] = arange, small f32 [2] = {1,2}, steps i64 [1] = {5} (typed field),
  // ext f64 [8] = arange stored externally in src.onnx.bin.
  static std::string Src() { return TestModel("writer/src.onnx"); }
  static std::map<std::string, ir::Tensor> NewValues() {
    std::vector<float> big(64);
    for (int i = 0; i < 64; ++i) big[i] = 2.0f * i + 0.5f;
    return {{"big", ir::Tensor::FromVector<float>({16, 4}, big)},
            {"steps", ir::Tensor::FromVector<int64_t>({1}, {6})}};
  }
  fs::path dir_;
};

std::string RunCommand(const std::string& cmd) {
  std::string out;
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) return out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe.get())) > 0) out.append(buf.data(), n);
  return out;
}

TEST_F(WriterTest, ReplacesValuesAndSplitsLargeTensorsOut) {
  const std::string out = (dir_ / "ckpt.onnx").string();
  ASSERT_TRUE(WriteOnnxWithInitializers(Src(), NewValues(), out, /*external_threshold_bytes=*/100).ok());
  EXPECT_TRUE(fs::exists(out + ".data"));
  // Only big (256 bytes) exceeds 100 bytes: the side file holds exactly it.
  EXPECT_EQ(fs::file_size(out + ".data"), 256u);
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_THAT(entry.path().filename().string(), ::testing::Not(HasSubstr(".tmp")));
  }

  absl::StatusOr<LoadedModel> m = LoadOnnxModel(out);
  ASSERT_TRUE(m.ok()) << m.status();
  const ir::Graph& g = *m->graph;
  const ir::Value& big = g.value(g.FindValue("big"));
  EXPECT_THAT(big.external_file, EndsWith("ckpt.onnx.data"));
  EXPECT_TRUE(big.constant->BitwiseEquals(NewValues().at("big")));
  EXPECT_TRUE(g.value(g.FindValue("steps")).constant->BitwiseEquals(NewValues().at("steps")));
  EXPECT_EQ(Values(*g.value(g.FindValue("small")).constant), (std::vector<double>{1, 2}));
  const ir::Value& ext = g.value(g.FindValue("ext"));
  EXPECT_TRUE(ext.external_file.empty());  // 64 bytes: inline now
  EXPECT_EQ(Values(*ext.constant), (std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7}));

  // onnx's own loader and checker agree.
  const std::string py = absl::StrCat(
      ONNXPIPE_PYTHON,
      " -c \"import sys, onnx; from onnx import numpy_helper; onnx.checker.check_model(sys.argv[1]); "
      "m = onnx.load(sys.argv[1]); "
      "print(';'.join(t.name + '=' + ','.join(repr(float(v)) for v in numpy_helper.to_array(t).flatten()) "
      "for t in m.graph.initializer))\" ",
      out);
  std::string expect = "big=";
  for (int i = 0; i < 64; ++i) absl::StrAppend(&expect, i ? "," : "", 2.0 * i + 0.5);  // x.5
  absl::StrAppend(&expect, ";small=1.0,2.0;steps=6.0;ext=0.0,1.0,2.0,3.0,4.0,5.0,6.0,7.0\n");
  EXPECT_EQ(RunCommand(py), expect);
}

TEST_F(WriterTest, NegativeThresholdKeepsEverythingInline) {
  const std::string out = (dir_ / "inline.onnx").string();
  ASSERT_TRUE(WriteOnnxWithInitializers(Src(), {}, out, /*external_threshold_bytes=*/-1).ok());
  EXPECT_FALSE(fs::exists(out + ".data"));
  absl::StatusOr<LoadedModel> m = LoadOnnxModel(out);
  ASSERT_TRUE(m.ok()) << m.status();
  const ir::Graph& g = *m->graph;
  for (ir::ValueId v = 0; v < g.num_values(); ++v) EXPECT_TRUE(g.value(v).external_file.empty());
  std::vector<double> arange(64);
  for (int i = 0; i < 64; ++i) arange[i] = i;
  EXPECT_EQ(Values(*g.value(g.FindValue("big")).constant), arange);
  // Moving the written model elsewhere keeps it loadable: nothing refers to the source folder.
  fs::rename(out, dir_ / "moved.onnx");
  EXPECT_TRUE(LoadOnnxModel((dir_ / "moved.onnx").string()).ok());
}

TEST_F(WriterTest, ZeroThresholdPutsEveryTensorInTheSideFileAligned) {
  const std::string out = (dir_ / "all_ext.onnx").string();
  ASSERT_TRUE(WriteOnnxWithInitializers(Src(), NewValues(), out, 0).ok());
  // big 256 | small 8 (+56 pad) | steps 8 (+56 pad) | ext 64: offsets 0, 256, 320, 384.
  EXPECT_EQ(fs::file_size(out + ".data"), 448u);
  absl::StatusOr<LoadedModel> m = LoadOnnxModel(out);
  ASSERT_TRUE(m.ok()) << m.status();
  const ir::Graph& g = *m->graph;
  EXPECT_EQ(Values(*g.value(g.FindValue("steps")).constant), std::vector<double>{6});
  EXPECT_THAT(g.value(g.FindValue("small")).external_file, EndsWith("all_ext.onnx.data"));
}

TEST_F(WriterTest, RefusesMismatchesWithoutWriting) {
  const std::string out = (dir_ / "bad.onnx").string();
  absl::Status unknown =
      WriteOnnxWithInitializers(Src(), {{"nope", ir::Tensor::Scalar<float>(1)}}, out, 100);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.message(), HasSubstr("'nope' is not an initializer"));
  absl::Status dtype = WriteOnnxWithInitializers(
      Src(), {{"small", ir::Tensor::FromVector<double>({2}, {1, 2})}}, out, 100);
  EXPECT_EQ(dtype.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dtype.message(), HasSubstr("initializer 'small' is f64[2]"));
  EXPECT_THAT(dtype.message(), HasSubstr("declares f32[2]"));
  absl::Status dims = WriteOnnxWithInitializers(
      Src(), {{"small", ir::Tensor::FromVector<float>({1, 2}, {1, 2})}}, out, 100);
  EXPECT_THAT(dims.message(), HasSubstr("f32[1,2]"));
  absl::Status missing = WriteOnnxWithInitializers(TestModel("writer/none.onnx"), {}, out, 100);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".data"));
}

TEST_F(WriterTest, OverwritesAnEarlierCheckpointInPlace) {
  const std::string out = (dir_ / "ckpt.onnx").string();
  ASSERT_TRUE(WriteOnnxWithInitializers(Src(), NewValues(), out, 100).ok());
  // Rewrite the checkpoint from itself (its big tensor is in ckpt.onnx.data) with new steps.
  ASSERT_TRUE(WriteOnnxWithInitializers(out, {{"steps", ir::Tensor::FromVector<int64_t>({1}, {7})}},
                                        out, 100)
                  .ok());
  absl::StatusOr<LoadedModel> m = LoadOnnxModel(out);
  ASSERT_TRUE(m.ok()) << m.status();
  const ir::Graph& g = *m->graph;
  EXPECT_EQ(Values(*g.value(g.FindValue("steps")).constant), std::vector<double>{7});
  EXPECT_TRUE(g.value(g.FindValue("big")).constant->BitwiseEquals(NewValues().at("big")));
}

}  // namespace
}  // namespace onnxpipe::onnx_frontend
