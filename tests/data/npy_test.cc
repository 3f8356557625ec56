#include "executor/data/npy.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"

namespace onnxpipe::data {
namespace {

namespace fs = std::filesystem;
using ir::DType;
using ir::Tensor;

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "onnxpipe_npy_test_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  // Runs Python (numpy as np, the test folder as `d`); returns its exit code.
  int Python(const std::string& code) const {
    std::ofstream(dir_ / "script.py") << "import os, sys\nimport numpy as np\nd = sys.argv[1]\n" << code;
    const std::string cmd = std::string(ONNXPIPE_PYTHON) + " " + (dir_ / "script.py").string() + " " + dir_.string();
    return std::system(cmd.c_str());
  }
  void WriteBytes(const std::string& name, const std::string& bytes) const {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
  }
  fs::path dir_;
};

// arange(n) as dtype, the values numpy's np.arange(n).astype(dtype) gives.
Tensor Arange(DType dt, std::vector<int64_t> dims) {
  Tensor t(DType::kF64, dims);
  for (int64_t i = 0; i < t.num_elements(); ++i) t.mutable_data<double>()[i] = static_cast<double>(i % 7) - 2.5 * (i % 2);
  return t.CastTo(dt);
}

TEST_F(NpyTest, ReadsWhatNumpyWrites) {
  ASSERT_EQ(0, Python(R"(
def vals(n): return np.array([(i % 7) - 2.5 * (i % 2) for i in range(n)])
def save(name, arr, version=None):
    with open(os.path.join(d, name), 'wb') as f:
        if version is None: np.save(f, arr)
        else: np.lib.format.write_array(f, arr, version=version)
save('f32.npy', vals(6).astype(np.float32).reshape(2, 3))
save('f64.npy', vals(24).astype(np.float64).reshape(2, 3, 4))
save('i64.npy', vals(5).astype(np.int64))
save('i32.npy', vals(4).astype(np.int32).reshape(4, 1))
save('b1.npy', vals(6).astype(np.bool_).reshape(3, 2))
save('u1.npy', np.abs(vals(3)).astype(np.uint8))
save('i1.npy', vals(3).astype(np.int8))
save('f2.npy', vals(3).astype(np.float16))
save('scalar.npy', np.float64(-2.5))
save('empty.npy', np.zeros((0, 3), dtype=np.float32))
save('v2.npy', vals(6).astype(np.float32).reshape(2, 3), version=(2, 0))
save('v3.npy', vals(6).astype(np.float32).reshape(2, 3), version=(3, 0))
save('big_header.npy', np.zeros((1,) * 32, dtype=np.float32))
)"));
  struct Case {
    const char* file;
    DType dt;
    std::vector<int64_t> dims;
  };
  for (const Case& c : std::vector<Case>{{"f32.npy", DType::kF32, {2, 3}},   {"f64.npy", DType::kF64, {2, 3, 4}},
                                         {"i64.npy", DType::kI64, {5}},      {"i32.npy", DType::kI32, {4, 1}},
                                         {"b1.npy", DType::kBool, {3, 2}},   {"i1.npy", DType::kI8, {3}},
                                         {"f2.npy", DType::kF16, {3}},       {"empty.npy", DType::kF32, {0, 3}},
                                         {"v2.npy", DType::kF32, {2, 3}},    {"v3.npy", DType::kF32, {2, 3}},
                                         {"big_header.npy", DType::kF32, std::vector<int64_t>(32, 1)}}) {
    auto t = ReadNpy(Path(c.file));
    ASSERT_TRUE(t.ok()) << c.file << ": " << t.status();
    EXPECT_EQ(t->dtype(), c.dt) << c.file;
    EXPECT_EQ(t->dims(), c.dims) << c.file;
    if (std::string(c.file) != "big_header.npy") {
      EXPECT_TRUE(t->BitwiseEquals(Arange(c.dt, c.dims))) << c.file << ": " << t->DebugString();
    }
  }
  auto u = ReadNpy(Path("u1.npy"));
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->ToInt64Vector(), (std::vector<int64_t>{0, 1, 2}));  // |[0, -1.5, 2]| as uint8
  auto s = ReadNpy(Path("scalar.npy"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->dims(), std::vector<int64_t>{});
  EXPECT_EQ(s->data<double>()[0], -2.5);
}

TEST_F(NpyTest, NumpyReadsWhatWeWrite) {
  struct Case {
    const char* name;
    DType dt;
    std::vector<int64_t> dims;
    const char* np_dtype;
  };
  const std::vector<Case> cases = {{"f32", DType::kF32, {2, 3}, "float32"}, {"f64", DType::kF64, {4}, "float64"},
                                   {"i64", DType::kI64, {1, 2, 3}, "int64"}, {"i32", DType::kI32, {}, "int32"},
                                   {"b1", DType::kBool, {5}, "bool_"},        {"u1", DType::kU8, {0}, "uint8"},
                                   {"i1", DType::kI8, {2, 2}, "int8"},       {"f2", DType::kF16, {3}, "float16"}};
  std::string check = "def vals(n): return np.array([(i % 7) - 2.5 * (i % 2) for i in range(n)])\n";
  for (const Case& c : cases) {
    Tensor t = c.dt == DType::kU8 ? Tensor(DType::kU8, c.dims) : Arange(c.dt, c.dims);
    ASSERT_TRUE(WriteNpy(Path(std::string(c.name) + ".npy"), t).ok());
    std::string shape = "(";
    for (int64_t d : c.dims) shape += std::to_string(d) + ",";
    shape += ")";
    check += std::string("a = np.load(os.path.join(d, '") + c.name + ".npy'))\n" + "assert a.dtype == np." + c.np_dtype +
             ", a.dtype\nassert a.shape == " + shape + ", a.shape\n" + "n = int(np.prod(" + shape + "))\n" +
             "assert np.array_equal(a.reshape(-1), vals(n).astype(np." + c.np_dtype + ")), a\n" +
             "raw = open(os.path.join(d, '" + c.name + ".npy'), 'rb').read()\n" +
             "assert (raw[8] | raw[9] << 8) + 10 == len(raw) - a.nbytes and (len(raw) - a.nbytes) % 64 == 0\n";
  }
  EXPECT_EQ(0, Python(check));
}

TEST_F(NpyTest, RoundTripsEveryDType) {
  for (DType dt : {DType::kF32, DType::kF64, DType::kI64, DType::kI32, DType::kBool, DType::kU8, DType::kI8, DType::kF16}) {
    for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{}, {0}, {3}, {2, 0, 4}, {3, 5, 7}}) {
      Tensor t = Arange(dt, dims);
      auto bytes = SerializeNpy(t);
      ASSERT_TRUE(bytes.ok());
      auto back = ParseNpy(*bytes, "mem");
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_TRUE(back->BitwiseEquals(t)) << ir::DTypeName(dt);
    }
  }
  EXPECT_FALSE(SerializeNpy(Tensor(DType::kBF16, {2})).ok());
}

// A valid file's bytes with the header dict replaced (the length field is fixed up).
std::string WithHeader(const std::string& dict, const std::string& data, int major = 1) {
  std::string out("\x93NUMPY", 6);
  out += static_cast<char>(major);
  out += '\0';
  const size_t n = dict.size();
  out += static_cast<char>(n & 0xff);
  out += static_cast<char>((n >> 8) & 0xff);
  if (major > 1) {
    out += static_cast<char>((n >> 16) & 0xff);
    out += static_cast<char>((n >> 24) & 0xff);
  }
  return out + dict + data;
}

TEST_F(NpyTest, EveryMalformedInputIsInvalidArgumentNamingTheFile) {
  const std::string good = *SerializeNpy(Arange(DType::kF32, {2, 3}));
  const std::string data24(24, '\0');
  struct Case {
    const char* what;
    std::string bytes;
    const char* message;  // expected substring
  };
  std::string huge_v2 = good.substr(0, 6) + std::string("\x02\x00\xff\xff\xff\xff", 6);
  std::string bad_bool = WithHeader("{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }\n", std::string("\x01\x02", 2));
  const std::vector<Case> cases = {
      {"empty", "", "magic"},
      {"bad magic", "\x93NUMPZ" + good.substr(6), "magic"},
      {"version 4", good.substr(0, 6) + std::string("\x04\x00", 2) + good.substr(8), "version"},
      {"version 1.1", good.substr(0, 6) + std::string("\x01\x01", 2) + good.substr(8), "version"},
      {"no header length", good.substr(0, 9), "truncated"},
      {"truncated header", good.substr(0, 40), "truncated .npy header"},
      {"huge v2 header length", huge_v2, "exceeds"},
      {"not a dict", WithHeader("[1, 2]\n", data24), "'{'"},
      {"missing key", WithHeader("{'descr': '<f4', 'shape': (2, 3), }\n", data24), "lacks"},
      {"extra key", WithHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}\n", data24), "unexpected key"},
      {"duplicate key", WithHeader("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,)}", data24), "twice"},
      {"unterminated string", WithHeader("{'descr: '<f4'}", data24), "malformed"},
      {"descr not a string", WithHeader("{'descr': 4, 'fortran_order': False, 'shape': (6,)}", data24), "dtype string"},
      {"structured descr", WithHeader("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (6,)}", data24), "malformed"},
      {"fortran order", WithHeader("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }\n", data24), "fortran_order is True"},
      {"fortran not bool", WithHeader("{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3), }\n", data24), "True or False"},
      {"shape not tuple", WithHeader("{'descr': '<f4', 'fortran_order': False, 'shape': 6, }\n", data24), "tuple"},
      {"negative dim", WithHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (-6,), }\n", data24), "non-negative"},
      {"float dim", WithHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (2.5,), }\n", data24), "malformed"},
      {"big endian", WithHeader("{'descr': '>f4', 'fortran_order': False, 'shape': (6,), }\n", data24), "big-endian"},
      {"complex", WithHeader("{'descr': '<c8', 'fortran_order': False, 'shape': (3,), }\n", data24), "unsupported dtype '<c8'"},
      {"object", WithHeader("{'descr': '|O', 'fortran_order': False, 'shape': (3,), }\n", data24), "unsupported dtype"},
      {"overflowing shape", WithHeader("{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 4611686018427387904), }\n", data24), "overflows"},
      {"huge shape, no data", WithHeader("{'descr': '<f8', 'fortran_order': False, 'shape': (1099511627776,), }\n", data24), "expected 8796093022208"},
      {"integer too large", WithHeader("{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999999999999,), }\n", data24), "too large"},
      {"truncated data", good.substr(0, good.size() - 1), "truncated"},
      {"trailing data", good + "x", "trailing"},
      {"bool byte 2", bad_bool, "byte value 2"},
      {"non-ascii header", WithHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }\xff", data24), "non-ASCII"},
      {"text after dict", WithHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (6,)} x", data24), "unexpected text"},
  };
  for (const Case& c : cases) {
    auto t = ParseNpy(c.bytes, "case.npy");
    ASSERT_FALSE(t.ok()) << c.what;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << t.status();
    EXPECT_NE(t.status().message().find("case.npy"), std::string::npos) << c.what << ": " << t.status();
    EXPECT_NE(t.status().message().find(c.message), std::string::npos) << c.what << ": " << t.status();
    // The file reader reports the same error, naming the path.
    WriteBytes("case.npy", c.bytes);
    auto f = ReadNpy(Path("case.npy"));
    ASSERT_FALSE(f.ok()) << c.what;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << f.status();
    EXPECT_NE(f.status().message().find(Path("case.npy")), std::string::npos) << c.what << ": " << f.status();
    EXPECT_NE(f.status().message().find(c.message), std::string::npos) << c.what << ": " << f.status();
  }
}

TEST_F(NpyTest, RankOverLimitIsRejected) {
  std::string shape;
  for (int i = 0; i < 65; ++i) shape += "1,";
  auto t = ParseNpy(WithHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (" + shape + "), }", std::string(4, '\0')), "r.npy");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("more than 64 dims"), std::string::npos) << t.status();
}

TEST_F(NpyTest, MissingFileIsNotFound) {
  auto t = ReadNpy(Path("nope.npy"));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find("nope.npy"), std::string::npos);
  EXPECT_FALSE(ReadNpy(dir_.string()).ok());  // a folder
}

TEST_F(NpyTest, WritesAreAtomicReplacements) {
  const std::string p = Path("x.npy");
  ASSERT_TRUE(WriteNpy(p, Arange(DType::kF32, {100})).ok());
  ASSERT_TRUE(WriteNpy(p, Arange(DType::kI64, {3})).ok());
  auto t = ReadNpy(p);
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->BitwiseEquals(Arange(DType::kI64, {3})));
  int files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++files;
  EXPECT_EQ(files, 1);  // no temp file left behind
  auto bad = WriteNpy(Path("no/such/dir/y.npy"), Arange(DType::kF32, {1}));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("y.npy"), std::string::npos) << bad;
  auto bf16 = WriteNpy(Path("z.npy"), Tensor(DType::kBF16, {1}));
  ASSERT_FALSE(bf16.ok());
  EXPECT_NE(bf16.message().find("z.npy"), std::string::npos) << bf16;
  EXPECT_FALSE(fs::exists(Path("z.npy")));
}

// Replays the fuzzer's seed corpus with the fuzzer's properties (CI does not run libFuzzer).
TEST(NpyCorpus, SeedsParseOrFailCleanlyAndRoundTrip) {
  const fs::path dir = fs::path(ONNXPIPE_SOURCE_DIR) / "fuzz" / "corpus" / "npy";
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  int parsed = 0, rejected = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::ifstream f(e.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    auto t = ParseNpy(bytes, e.path().filename().string());
    if (!t.ok()) {
      EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << e.path() << ": " << t.status();
      ++rejected;
      continue;
    }
    ++parsed;
    auto again = SerializeNpy(*t);
    ASSERT_TRUE(again.ok()) << e.path();
    auto t2 = ParseNpy(*again, "round-trip");
    ASSERT_TRUE(t2.ok()) << e.path();
    EXPECT_TRUE(t2->BitwiseEquals(*t)) << e.path();
  }
  EXPECT_GE(parsed, 5);
  EXPECT_GE(rejected, 3);
}

}  // namespace
}  // namespace onnxpipe::data
