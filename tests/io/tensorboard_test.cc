#include "executor/io/tensorboard.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <regex>
#include <sstream>

#include "executor/io/atomic_file.h"
#include "executor/io/crc32c.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cli/cli_util.h"
#include "tests/io/test_dir.h"

namespace onnxpipe::io {
namespace {

using testing::CommandResult;
using testing::RunCommand;
using testing::ShellQuote;

using Bytes = std::vector<uint8_t>;
Bytes ToBytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

uint32_t FloatBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
uint64_t DoubleBits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, 8);
  return b;
}

// Event{wall_time: 1.5, step: 3, summary {value {tag: "loss", simple_value: 0.25}}}, encoded by hand:
// 1.5 = 0x3FF8000000000000, 0.25f = 0x3E800000, keys (field << 3 | wire type).
TEST(TfEventsTest, ScalarEventWireFormat) {
  // clang-format off
  Bytes expected = {0x09, 0, 0, 0, 0, 0, 0, 0xF8, 0x3F,  // wall_time, fixed64
                    0x10, 0x03,                           // step, varint
                    0x2A, 0x0D,                           // summary, 13 bytes
                    0x0A, 0x0B,                           //   value, 11 bytes
                    0x0A, 0x04, 'l', 'o', 's', 's',       //     tag
                    0x15, 0x00, 0x00, 0x80, 0x3E};        //     simple_value, fixed32
  // clang-format on
  EXPECT_EQ(ToBytes(tfevents::EncodeScalarEvent(1.5, 3, {{"loss", 0.25f}})), expected);

  // Negative int64 steps are 10-byte two's-complement varints; 300 = 0xAC 0x02.
  std::string neg = tfevents::EncodeScalarEvent(0.0, -1, {});
  Bytes neg_step(neg.begin() + 9, neg.begin() + 20);
  EXPECT_EQ(neg_step, (Bytes{0x10, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01}));
  std::string s300 = tfevents::EncodeScalarEvent(0.0, 300, {});
  EXPECT_EQ(Bytes(s300.begin() + 9, s300.begin() + 12), (Bytes{0x10, 0xAC, 0x02}));

  Bytes version = {0x09, 0, 0, 0, 0, 0, 0, 0xF0, 0x3F, 0x1A, 13};  // wall_time 1.0, file_version (13 bytes)
  for (char c : std::string("brain.Event:2")) version.push_back(static_cast<uint8_t>(c));
  EXPECT_EQ(ToBytes(tfevents::EncodeFileVersionEvent(1.0)), version);
}

TEST(TfEventsTest, RecordFraming) {
  std::string rec = tfevents::FrameRecord("abc");
  ASSERT_EQ(rec.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(ToBytes(rec.substr(0, 8)), (Bytes{3, 0, 0, 0, 0, 0, 0, 0}));
  auto u32 = [&](size_t off) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(rec[off + i])) << (8 * i);
    return v;
  };
  EXPECT_EQ(u32(8), MaskCrc32c(Crc32c(std::string("\3\0\0\0\0\0\0\0", 8))));
  EXPECT_EQ(rec.substr(12, 3), "abc");
  EXPECT_EQ(u32(15), MaskCrc32c(Crc32c("abc")));
}

struct ScalarRow {
  std::string tag;
  int64_t step;
  float value;
  double wall_time;
};

std::vector<nlohmann::json> ParseJsonLines(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

// Checks decoded events (from either Python reader) against what was written.
void ExpectEvents(const std::vector<nlohmann::json>& events, const std::vector<ScalarRow>& rows, const char* who) {
  ASSERT_EQ(events.size(), rows.size() + 2) << who;
  EXPECT_EQ(events[0].value("file_version", ""), "brain.Event:2") << who;
  EXPECT_TRUE(events[0]["values"].empty()) << who;
  for (size_t i = 0; i < rows.size(); ++i) {
    const nlohmann::json& e = events[i + 1];
    SCOPED_TRACE(std::string(who) + " event " + std::to_string(i + 1));
    EXPECT_EQ(e.value("step", int64_t{0}), rows[i].step);
    EXPECT_EQ(e["wall_time_bits"].get<uint64_t>(), DoubleBits(rows[i].wall_time));
    ASSERT_EQ(e["values"].size(), 1u);
    EXPECT_EQ(e["values"][0]["tag"], rows[i].tag);
    EXPECT_EQ(e["values"][0]["simple_value_bits"].get<uint32_t>(), FloatBits(rows[i].value));
  }
  const nlohmann::json& last = events.back();
  EXPECT_EQ(last["step"], 7);
  ASSERT_EQ(last["values"].size(), 2u);
  EXPECT_EQ(last["values"][0]["tag"], "eval/accuracy");
  EXPECT_EQ(last["values"][0]["simple_value_bits"].get<uint32_t>(), FloatBits(0.875f));
  EXPECT_EQ(last["values"][1]["tag"], "eval/loss");
  EXPECT_EQ(last["values"][1]["simple_value_bits"].get<uint32_t>(), FloatBits(0.3125f));
  EXPECT_GT(std::bit_cast<double>(last["wall_time_bits"].get<uint64_t>()), 1.5e9);  // stamped with the clock
}

TEST(TensorBoardWriterTest, FileReadBackByIndependentReader) {
  TestDir dir("tensorboard");
  std::string logdir = dir.Path("runs/exp1");  // created by the writer, parents included
  auto w = TensorBoardWriter::Create(logdir);
  ASSERT_TRUE(w.ok()) << w.status();
  std::string name = std::filesystem::path((*w)->path()).filename().string();
  EXPECT_TRUE(std::regex_match(name, std::regex(R"(events\.out\.tfevents\.\d{10}\.[A-Za-z0-9._-]+)"))) << name;

  std::vector<ScalarRow> rows = {
      {"train/loss", 0, 2.5f, 1700000000.25},
      {"train/loss", 1, 1.75f, 1700000001.5},
      {"train/lr", 1, 1e-4f, 1700000001.5},
      {"train/loss", 1234567890123, -0.0078125f, 1700000002.125},
      {"weird tag/ü", -5, std::numeric_limits<float>::infinity(), 0.0},
      {"train/loss", 2, std::numeric_limits<float>::denorm_min(), 1700000003.0},
  };
  for (const ScalarRow& r : rows) ASSERT_TRUE((*w)->AddScalar(r.tag, r.step, r.value, r.wall_time).ok());
  ASSERT_TRUE((*w)->AddScalars(7, {{"eval/accuracy", 0.875f}, {"eval/loss", 0.3125f}}).ok());
  EXPECT_FALSE((*w)->AddScalar("", 0, 1.0f).ok());

  // Written per call: readable now, while the writer is still open.
  std::string script = std::string(ONNXPIPE_SOURCE_DIR) + "/tests/io/read_tfevents.py";
  CommandResult r =
      RunCommand(ShellQuote(ONNXPIPE_PYTHON) + " " + ShellQuote(script) + " " + ShellQuote((*w)->path()) + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  ExpectEvents(ParseJsonLines(r.out), rows, "independent reader");

  // A flipped byte must be caught by the reader's CRC check (so the check above is not vacuous).
  std::string bytes = *ReadFileToString((*w)->path());
  std::string corrupt_path = dir.Path("corrupt.tfevents");
  bytes[bytes.size() / 2] ^= 0x20;
  ASSERT_TRUE(WriteFileAtomically(corrupt_path, bytes).ok());
  CommandResult bad =
      RunCommand(ShellQuote(ONNXPIPE_PYTHON) + " " + ShellQuote(script) + " " + ShellQuote(corrupt_path) + " 2>&1");
  EXPECT_NE(bad.exit_code, 0) << bad.out;

  // TensorBoard's own loader, from any Python on the machine that has it.
  std::string tb_python;
  for (std::string py : {std::string(ONNXPIPE_PYTHON), std::string("python3")}) {
    if (RunCommand(ShellQuote(py) + " -c 'import tensorboard' >/dev/null 2>&1").exit_code == 0) {
      tb_python = py;
      break;
    }
  }
  if (tb_python.empty()) {
    std::cout << "[ INFO     ] tensorboard not importable by any Python here; TensorBoard loader check skipped\n";
    return;
  }
  CommandResult tb = RunCommand(ShellQuote(tb_python) + " " + ShellQuote(script) + " --tensorboard " +
                                ShellQuote((*w)->path()) + " 2>/dev/null");
  ASSERT_EQ(tb.exit_code, 0) << tb.out;
  ExpectEvents(ParseJsonLines(tb.out), rows, "TensorBoard EventFileLoader");
}

TEST(TensorBoardWriterTest, TwoWritersGetTwoFiles) {
  TestDir dir("tensorboard_two");
  auto a = TensorBoardWriter::Create(dir.path());
  auto b = TensorBoardWriter::Create(dir.path());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->path(), (*b)->path());
  EXPECT_EQ(dir.ListNames().size(), 2u);
}

TEST(TensorBoardWriterTest, UncreatableFolderIsAnError) {
  TestDir dir("tensorboard_err");
  ASSERT_TRUE(WriteFileAtomically(dir.Path("file"), "x").ok());
  auto w = TensorBoardWriter::Create(dir.Path("file/sub"));
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("file/sub"), std::string::npos) << w.status();
}

}  // namespace
}  // namespace onnxpipe::io
