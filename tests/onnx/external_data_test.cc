// External data (weights in side files) and TensorProto files.
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "frontend/onnx/loader.h"
#include "frontend/onnx/tensor_proto.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/onnx/test_util.h"

namespace onnxpipe::onnx_frontend {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using testing::LoadOk;
using testing::TestModel;
using testing::Values;

TEST(ExternalDataTest, LoadsFromTheModelFolder) {
  LoadedModel m = LoadOk("ext/ok/model.onnx");
  ASSERT_TRUE(m.graph);
  const ir::Graph& g = *m.graph;
  const ir::Value& w = g.value(g.FindValue("w"));
  ASSERT_TRUE(w.constant);
  EXPECT_EQ(w.constant->dims(), (std::vector<int64_t>{3, 4}));
  std::vector<double> expect(12);
  for (int i = 0; i < 12; ++i) expect[i] = i;  // np.arange(12) at offset 0
  EXPECT_EQ(Values(*w.constant), expect);
  EXPECT_THAT(w.external_file, EndsWith("ext/ok/weights.bin"));
  // b: int64 [10, 20, 30] at offset 64, located through "sub/../weights.bin" (stays inside).
  const ir::Value& b = g.value(g.FindValue("b"));
  ASSERT_TRUE(b.constant);
  EXPECT_EQ(b.constant->dtype(), ir::DType::kI64);
  EXPECT_EQ(Values(*b.constant), (std::vector<double>{10, 20, 30}));
  EXPECT_THAT(b.external_file, EndsWith("ext/ok/weights.bin"));
}

struct ExtCase {
  std::string dir;
  absl::StatusCode code;
  std::vector<std::string> mentions;
};

class ExternalDataErrorTest : public ::testing::TestWithParam<ExtCase> {};

TEST_P(ExternalDataErrorTest, NamesTheInitializerAndFile) {
  const ExtCase& c = GetParam();
  const std::string path = TestModel("ext/" + c.dir + "/model.onnx");
  absl::StatusOr<LoadedModel> m = LoadOnnxModel(path);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), c.code) << m.status();
  const std::string msg(m.status().message());
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("initializer 'w'"));
  for (const std::string& s : c.mentions) EXPECT_THAT(msg, HasSubstr(s));
}

INSTANTIATE_TEST_SUITE_P(
    All, ExternalDataErrorTest,
    ::testing::Values(
        ExtCase{"missing", absl::StatusCode::kNotFound, {"no_such_file.bin", "not found"}},
        ExtCase{"escape", absl::StatusCode::kInvalidArgument,
                {"'../outside.bin'", "escapes the model's folder"}},
        ExtCase{"absolute", absl::StatusCode::kInvalidArgument, {"absolute path"}},
        ExtCase{"symlink", absl::StatusCode::kInvalidArgument,
                {"'link.bin'", "outside the model's folder"}},
        ExtCase{"past_end", absl::StatusCode::kInvalidArgument,
                {"weights.bin", "has 88 bytes", "48 bytes at offset 80", "past the end"}},
        ExtCase{"length_mismatch", absl::StatusCode::kInvalidArgument,
                {"length 40 bytes", "need 48 bytes"}}),
    [](const ::testing::TestParamInfo<ExtCase>& info) { return info.param.dir; });

TEST(ExternalDataTest, BytesWithoutAFolderRefuseExternalData) {
  const std::string path = TestModel("ext/ok/model.onnx");
  std::ifstream f(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  absl::StatusOr<LoadedModel> m = LoadOnnxModelFromBytes(bytes, "in-memory", "");
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("in-memory"));
  EXPECT_THAT(m.status().message(), HasSubstr("loaded from memory"));
  // With the folder given, the same bytes load.
  EXPECT_TRUE(LoadOnnxModelFromBytes(bytes, "in-memory", TestModel("ext/ok")).ok());
}

TEST(TensorProtoFileTest, LoadsNumpyHelperTensors) {
  absl::StatusOr<ir::Tensor> f32 = LoadTensorProtoFile(TestModel("tensors/f32.pb"));
  ASSERT_TRUE(f32.ok()) << f32.status();
  EXPECT_EQ(f32->dims(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Values(*f32), (std::vector<double>{0, 0.25, 0.5, 0.75, 1.0, 1.25}));
  absl::StatusOr<ir::Tensor> i64 = LoadTensorProtoFile(TestModel("tensors/i64.pb"));
  ASSERT_TRUE(i64.ok()) << i64.status();
  EXPECT_EQ(Values(*i64), (std::vector<double>{3, -1, 4}));
  absl::StatusOr<ir::Tensor> b = LoadTensorProtoFile(TestModel("tensors/bool.pb"));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->dtype(), ir::DType::kBool);
  EXPECT_EQ(b->dims(), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(Values(*b), (std::vector<double>{1, 0}));
}

TEST(TensorProtoFileTest, Errors) {
  absl::StatusOr<ir::Tensor> missing = LoadTensorProtoFile(TestModel("tensors/nope.pb"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  // A model file parses as a TensorProto with no data type: refused, naming the file.
  const std::string model = TestModel("ops/Add.onnx");
  absl::StatusOr<ir::Tensor> not_tensor = LoadTensorProtoFile(model);
  ASSERT_FALSE(not_tensor.ok());
  EXPECT_THAT(not_tensor.status().message(), HasSubstr(model));
}

// Runs a command and returns its stdout.
std::string RunCommand(const std::string& cmd) {
  std::string out;
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) return out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe.get())) > 0) out.append(buf.data(), n);
  return out;
}

// The ONNX backend tests' input/output .pb files, decoded by onnx's numpy_helper as reference.
TEST(TensorProtoFileTest, MatchesNumpyHelperOnBackendTestData) {
  const std::string root = "/usr/share/libonnx-testdata/data/node";
  if (!std::filesystem::exists(root)) GTEST_SKIP() << "libonnx-testdata not installed";
  const std::vector<std::string> files = {
      "test_add/test_data_set_0/input_0.pb",
      "test_cast_FLOAT_to_FLOAT16/test_data_set_0/output_0.pb",
      "test_gather_0/test_data_set_0/input_1.pb",
      "test_equal/test_data_set_0/output_0.pb",
      "test_layer_normalization_2d_axis0/test_data_set_0/output_0.pb"};
  for (const std::string& rel : files) {
    const std::string path = root + "/" + rel;
    if (!std::filesystem::exists(path)) continue;
    SCOPED_TRACE(rel);
    const std::string py = absl::StrCat(
        ONNXPIPE_PYTHON,
        " -c \"import sys, onnx; from onnx import numpy_helper; t = onnx.TensorProto(); "
        "t.ParseFromString(open(sys.argv[1], 'rb').read()); a = numpy_helper.to_array(t); "
        "print(' '.join(map(str, a.shape))); print(' '.join(repr(float(v)) for v in a.flatten()))\" ",
        path);
    std::vector<std::string> lines = absl::StrSplit(RunCommand(py), '\n');
    ASSERT_GE(lines.size(), 2u);
    absl::StatusOr<ir::Tensor> t = LoadTensorProtoFile(path);
    ASSERT_TRUE(t.ok()) << t.status();
    std::vector<int64_t> dims;
    for (absl::string_view d : absl::StrSplit(lines[0], ' ', absl::SkipEmpty())) {
      dims.push_back(std::stoll(std::string(d)));
    }
    EXPECT_EQ(t->dims(), dims);
    std::vector<double> expect;
    for (absl::string_view v : absl::StrSplit(lines[1], ' ', absl::SkipEmpty())) {
      expect.push_back(std::stod(std::string(v)));
    }
    EXPECT_EQ(Values(*t), expect);
  }
}

// Resident bytes of this process (/proc/self/statm).
int64_t ResidentBytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

// A large external tensor at an aligned offset is mapped, not read: it costs no resident memory until its values are
// read, reads as the file's bytes, and writes to it stay in the process. One at an unaligned offset is read.
TEST(ExternalDataTest, LargeTensorsAreMappedCopyOnWrite) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("onnxpipe_map_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  constexpr int64_t kN = int64_t{16} << 20;  // 64 MiB of f32
  std::vector<float> values(kN);
  for (int64_t i = 0; i < kN; ++i) values[i] = static_cast<float>(i % 1000) * 0.5f;
  {
    std::ofstream out(dir / "w.bin", std::ios::binary);
    const std::vector<char> pad(4096 + 4, 0);
    out.write(pad.data(), 4096);  // aligned tensor at 4096, the unaligned one right after it at + 4
    out.write(reinterpret_cast<const char*>(values.data()), kN * 4);
    out.write(pad.data(), 4);
    out.write(reinterpret_cast<const char*>(values.data()), (int64_t{1} << 20) * 4);
  }
  auto proto = [&](int64_t offset, int64_t n) {
    onnx::TensorProto t;
    t.set_name("w" + std::to_string(offset));
    t.set_data_type(onnx::TensorProto::FLOAT);
    t.add_dims(n);
    t.set_data_location(onnx::TensorProto::EXTERNAL);
    for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
             {"location", "w.bin"}, {"offset", std::to_string(offset)}, {"length", std::to_string(n * 4)}}) {
      auto* e = t.add_external_data();
      e->set_key(k);
      e->set_value(v);
    }
    return t;
  };
  const int64_t before = ResidentBytes();
  absl::StatusOr<ir::Tensor> mapped = TensorFromProto(proto(4096, kN), dir.string());
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_LT(ResidentBytes() - before, 8 << 20);  // not read yet
  double sum = 0, want = 0;
  for (int64_t i = 0; i < kN; ++i) {
    sum += mapped->data<float>()[i];
    want += values[i];
  }
  EXPECT_EQ(sum, want);
  EXPECT_GT(ResidentBytes() - before, 48 << 20);  // read: resident
  mapped->mutable_data<float>()[7] = -1;  // copy-on-write: the file keeps its bytes
  absl::StatusOr<ir::Tensor> again = TensorFromProto(proto(4096, kN), dir.string());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data<float>()[7], values[7]);
  // At 4096 + 4 + kN * 4 + 4: not 64-byte aligned, read into a buffer of its own.
  absl::StatusOr<ir::Tensor> read = TensorFromProto(proto(4096 + kN * 4 + 4, int64_t{1} << 20), dir.string());
  ASSERT_TRUE(read.ok()) << read.status();
  for (int64_t i = 0; i < (int64_t{1} << 20); i += 4099) EXPECT_EQ(read->data<float>()[i], values[i]) << i;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace onnxpipe::onnx_frontend
