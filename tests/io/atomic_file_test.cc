#include "executor/io/atomic_file.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "executor/io/crc32c.h"
#include "gtest/gtest.h"
#include "tests/io/test_dir.h"

namespace onnxpipe::io {
namespace {

namespace fs = std::filesystem;

// Known answers: RFC 3720 (iSCSI) appendix B.4 vectors and the "123456789" check value of CRC-32C.
TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string inc(32, 0), dec(32, 0);
  for (int i = 0; i < 32; ++i) {
    inc[i] = static_cast<char>(i);
    dec[i] = static_cast<char>(31 - i);
  }
  EXPECT_EQ(Crc32c(inc), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(dec), 0x113FDB5Cu);
}

// Slicing-by-8 against the plain bitwise definition, at every alignment and length (covers the head/tail loops).
TEST(Crc32cTest, MatchesBitwiseDefinitionAndExtends) {
  auto bitwise = [](const std::string& s) {
    uint32_t c = 0xFFFFFFFFu;
    for (unsigned char b : s) {
      c ^= b;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
  };
  std::string data;
  for (int i = 0; i < 300; ++i) data.push_back(static_cast<char>((i * 131 + 7) % 251));
  for (size_t off = 0; off < 9; ++off) {
    for (size_t len = 0; off + len <= data.size(); len += 13) {
      std::string s = data.substr(off, len);
      ASSERT_EQ(Crc32c(data.data() + off, len), bitwise(s)) << "off " << off << " len " << len;
    }
  }
  for (size_t cut = 0; cut <= data.size(); cut += 37) {
    uint32_t a = Crc32c(data.data(), cut);
    EXPECT_EQ(Crc32cExtend(a, data.data() + cut, data.size() - cut), Crc32c(data));
  }
}

TEST(Crc32cTest, MaskRoundTrip) {
  // Mask of 0 is the constant delta itself (rotation of 0 is 0).
  EXPECT_EQ(MaskCrc32c(0), 0xa282ead8u);
  EXPECT_EQ(MaskCrc32c(0x00000001u), 0x00020000u + 0xa282ead8u);  // 1 rotated right by 15 == 1 << 17
  EXPECT_EQ(MaskCrc32c(0x00008000u), 0x00000001u + 0xa282ead8u);  // bit 15 rotates to bit 0
  for (uint32_t v : {0u, 1u, 0xE3069283u, 0xFFFFFFFFu, 0x12345678u}) EXPECT_EQ(UnmaskCrc32c(MaskCrc32c(v)), v);
}

TEST(AtomicFileTest, WriteReplacesAndLeavesNoTemp) {
  TestDir dir("atomic_basic");
  std::string path = dir.Path("a.bin");
  ASSERT_TRUE(WriteFileAtomically(path, "first").ok());
  ASSERT_EQ(*ReadFileToString(path), "first");
  ASSERT_TRUE(WriteFileAtomically(path, std::string("sec\0nd", 6)).ok());
  EXPECT_EQ(*ReadFileToString(path), std::string("sec\0nd", 6));
  EXPECT_FALSE(fs::exists(AtomicTempPath(path)));
  EXPECT_EQ(dir.ListNames(), std::vector<std::string>{"a.bin"});
}

TEST(AtomicFileTest, StreamingLargeChunksAndAbort) {
  TestDir dir("atomic_stream");
  std::string path = dir.Path("big.bin");
  std::string expected;
  {
    auto w = AtomicFileWriter::Open(path);
    ASSERT_TRUE(w.ok()) << w.status();
    // Mix of small writes (buffered) and a write larger than the internal buffer (written through).
    for (int i = 0; i < 1000; ++i) {
      std::string piece = std::to_string(i) + ",";
      expected += piece;
      ASSERT_TRUE((*w)->Write(piece).ok());
    }
    std::string big(3 << 20, 'x');
    for (size_t i = 0; i < big.size(); i += 4099) big[i] = static_cast<char>('a' + i % 26);
    expected += big;
    ASSERT_TRUE((*w)->Write(big).ok());
    ASSERT_TRUE((*w)->Write("tail").ok());
    expected += "tail";
    EXPECT_EQ((*w)->bytes_written(), expected.size());
    EXPECT_FALSE(fs::exists(path)) << "nothing may be visible before Commit";
    ASSERT_TRUE((*w)->Commit().ok());
    EXPECT_FALSE((*w)->Write("more").ok());
  }
  EXPECT_EQ(*ReadFileToString(path), expected);

  {
    auto w = AtomicFileWriter::Open(path);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Write(std::string(2 << 20, 'z')).ok());
    EXPECT_TRUE(fs::exists((*w)->temp_path()));
    (*w)->Abort();
    EXPECT_FALSE(fs::exists((*w)->temp_path()));
  }
  {
    auto w = AtomicFileWriter::Open(path);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Write("dropped").ok());
  }  // destroyed without Commit
  EXPECT_EQ(*ReadFileToString(path), expected);
  EXPECT_EQ(dir.ListNames(), std::vector<std::string>{"big.bin"});
}

TEST(AtomicFileTest, ErrorsNameTheFile) {
  TestDir dir("atomic_errors");
  std::string missing_dir = dir.Path("no/such/folder/x.bin");
  absl::Status s = WriteFileAtomically(missing_dir, "x");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no/such/folder/x.bin"), std::string::npos) << s;
  auto r = ReadFileToString(dir.Path("absent.txt"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("absent.txt"), std::string::npos);
  auto d = ReadFileToString(dir.path());
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("folder"), std::string::npos) << d.status();
}

// A process killed while its temp file is half written leaves the previous file intact. The child reports through a
// pipe once the partial bytes are on disk, so the kill lands mid-write deterministically.
TEST(AtomicFileTest, KillDuringStreamingWriteKeepsPreviousFile) {
  TestDir dir("atomic_kill");
  std::string path = dir.Path("state.bin");
  ASSERT_TRUE(WriteFileAtomically(path, "version-1 complete").ok());
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    auto w = AtomicFileWriter::Open(path);
    if (!w.ok()) _exit(2);
    std::string half(4 << 20, 'h');  // larger than the buffer: really written to the temp file
    if (!(*w)->Write(half).ok()) _exit(3);
    char c = 'w';
    if (write(fds[1], &c, 1) != 1) _exit(4);
    while (true) pause();
  }
  close(fds[1]);
  char c = 0;
  ASSERT_EQ(read(fds[0], &c, 1), 1);
  close(fds[0]);
  std::string temp = path + ".tmp." + std::to_string(pid);
  EXPECT_TRUE(fs::exists(temp));
  EXPECT_EQ(fs::file_size(temp), 4u << 20);
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(*ReadFileToString(path), "version-1 complete");
}

}  // namespace
}  // namespace onnxpipe::io
