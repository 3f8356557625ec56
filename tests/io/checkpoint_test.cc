#include "executor/io/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "executor/io/atomic_file.h"
#include "executor/io/checkpoint_manager.h"
#include "executor/io/crc32c.h"
#include "gtest/gtest.h"
#include "tests/io/test_dir.h"

namespace onnxpipe::io {
namespace {

namespace fs = std::filesystem;
using ir::DType;
using ir::Tensor;

// Contents depend on `version` in every tensor, so a checkpoint mixing two versions cannot pass for either.
Checkpoint MakeCheckpoint(int64_t version, int64_t big_elements = 64 * 32) {
  Checkpoint c;
  c.metadata.step = version;
  c.metadata.epoch = version / 10;
  c.metadata.data_position = version * 32 + 5;
  c.metadata.rng_seed = (uint64_t{1} << 63) + 5;  // above int64 max: must survive JSON
  c.metadata.rng_offset = static_cast<uint64_t>(version) * 4096;
  c.metadata.optimizer = "adamw";
  c.metadata.hyperparameters = {
      {"lr", 0.1}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}, {"weight_decay", 1.0 / 3.0}};
  c.metadata.model = {123456789, 0xDEADBEEF};
  c.metadata.extra = {{"vocab", "vocab.txt"}, {"seq", 128}};

  Tensor w(DType::kF32, {big_elements});
  float* wp = w.mutable_data<float>();
  for (int64_t i = 0; i < big_elements; ++i) wp[i] = static_cast<float>((i * 2654435761u + version) % 1000003) * 1e-3f;
  c.tensors.push_back({"layer0.weight", w});
  std::vector<double> d(7);
  for (int i = 0; i < 7; ++i) d[i] = std::ldexp(1.0 + i, -3) + version;
  c.tensors.push_back({"adam.m.layer0.bias", Tensor::FromVector<double>({7}, d)});
  c.tensors.push_back({"ids", Tensor::FromVector<int64_t>({3, 2}, {version, -1, 2, 3, INT64_MIN, INT64_MAX})});
  Tensor bf(DType::kBF16, {5});
  for (int i = 0; i < 5; ++i) bf.mutable_data<uint16_t>()[i] = ir::FloatToBF16(0.5f * i - static_cast<float>(version));
  c.tensors.push_back({"bf16 weight/ünïcode", bf});
  c.tensors.push_back({"mask", Tensor::FromVector<bool>({4}, {true, false, version % 2 == 0, true})});
  c.tensors.push_back({"step_scalar", Tensor::Scalar<float>(static_cast<float>(version))});
  c.tensors.push_back({"empty", Tensor(DType::kF32, {0, 3})});
  c.tensors.push_back({"bytes", Tensor::FromVector<uint8_t>({3}, {1, 2, static_cast<uint8_t>(version)})});
  return c;
}

void ExpectSameCheckpoint(const Checkpoint& a, const Checkpoint& b) {
  const CheckpointMetadata &x = a.metadata, &y = b.metadata;
  EXPECT_EQ(x.schema_version, y.schema_version);
  EXPECT_EQ(x.step, y.step);
  EXPECT_EQ(x.epoch, y.epoch);
  EXPECT_EQ(x.data_position, y.data_position);
  EXPECT_EQ(x.rng_seed, y.rng_seed);
  EXPECT_EQ(x.rng_offset, y.rng_offset);
  EXPECT_EQ(x.optimizer, y.optimizer);
  ASSERT_EQ(x.hyperparameters.size(), y.hyperparameters.size());
  for (const auto& [k, v] : x.hyperparameters) {
    ASSERT_TRUE(y.hyperparameters.count(k)) << k;
    EXPECT_EQ(std::bit_cast<uint64_t>(v), std::bit_cast<uint64_t>(y.hyperparameters.at(k))) << k;
  }
  EXPECT_EQ(x.model, y.model);
  EXPECT_EQ(x.extra, y.extra);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
    EXPECT_TRUE(a.tensors[i].tensor.BitwiseEquals(b.tensors[i].tensor)) << a.tensors[i].name;
  }
}

uint32_t LoadU32(const std::string& s, size_t off) {
  uint32_t v;
  std::memcpy(&v, s.data() + off, 4);
  return v;
}

void WriteRaw(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(CheckpointTest, RoundTripIsBitwiseAndFollowsTheDocumentedLayout) {
  TestDir dir("ckpt_roundtrip");
  std::string path = dir.Path("a.ckpt");
  Checkpoint c = MakeCheckpoint(42);
  ASSERT_TRUE(SaveCheckpoint(path, c).ok());
  auto loaded = LoadCheckpoint(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->path, path);
  ExpectSameCheckpoint(c, *loaded);
  EXPECT_EQ(loaded->metadata.hyperparameters.at("lr"), 0.1);
  ASSERT_NE(loaded->Find("ids"), nullptr);
  EXPECT_EQ(loaded->Find("ids")->data<int64_t>()[4], INT64_MIN);
  EXPECT_EQ(loaded->Find("nope"), nullptr);

  // The documented framing, checked without the loader: magic, size field, trailing CRC over all prior bytes.
  std::string bytes = *ReadFileToString(path);
  EXPECT_EQ(bytes.substr(0, 8), "ONNXPCKP");
  EXPECT_EQ(bytes.substr(bytes.size() - 4), "OPCE");
  uint64_t size_field;
  std::memcpy(&size_field, bytes.data() + 16, 8);
  EXPECT_EQ(size_field, bytes.size());
  EXPECT_EQ(LoadU32(bytes, bytes.size() - 8), Crc32c(bytes.data(), bytes.size() - 8));
  // The metadata is plain JSON right after the 64-byte header.
  uint64_t meta_size;
  std::memcpy(&meta_size, bytes.data() + 32, 8);
  auto meta = nlohmann::json::parse(bytes.substr(64, meta_size));
  EXPECT_EQ(meta["step"], 42);
  EXPECT_EQ(meta["optimizer"]["name"], "adamw");
  EXPECT_EQ(meta["schema_version"], kCheckpointSchemaVersion);
  EXPECT_EQ(meta["model"]["size"], 123456789);
  // The 8192-byte weight is stored verbatim, 64-byte aligned.
  const Tensor& w = c.tensors[0].tensor;
  size_t at = bytes.find(std::string(static_cast<const char*>(w.raw()), 64));
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(at % 64, 0u);
  EXPECT_EQ(bytes.compare(at, w.num_bytes(), static_cast<const char*>(w.raw()), w.num_bytes()), 0);
}

TEST(CheckpointTest, EmptyCheckpointRoundTrips) {
  TestDir dir("ckpt_empty");
  Checkpoint c;
  c.metadata.step = 0;
  ASSERT_TRUE(SaveCheckpoint(dir.Path("e.ckpt"), c).ok());
  auto loaded = LoadCheckpoint(dir.Path("e.ckpt"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->tensors.empty());
}

// Every single-byte corruption anywhere in the file is refused, with the file named in the message.
TEST(CheckpointTest, CorruptionAtEveryOffsetIsDetected) {
  TestDir dir("ckpt_corrupt");
  std::string good = dir.Path("good.ckpt");
  ASSERT_TRUE(SaveCheckpoint(good, MakeCheckpoint(7, /*big_elements=*/40)).ok());
  const std::string bytes = *ReadFileToString(good);
  const std::string bad = dir.Path("bad.ckpt");
  int crc_messages = 0;
  for (size_t off = 0; off < bytes.size(); ++off) {
    for (uint8_t flip : {off % 2 ? 0x01 : 0x80}) {  // low and high bits, alternating, at every offset
      std::string b = bytes;
      b[off] = static_cast<char>(b[off] ^ flip);
      WriteRaw(bad, b);
      auto r = LoadCheckpoint(bad);
      ASSERT_FALSE(r.ok()) << "flip 0x" << std::hex << int(flip) << " at offset " << std::dec << off << " was accepted";
      ASSERT_NE(r.status().message().find(bad), std::string::npos) << r.status();
      if (r.status().message().find("CRC32C mismatch") != std::string::npos) ++crc_messages;
    }
  }
  // Most flips land in metadata, index or data, where the CRCs are what catches them.
  EXPECT_GT(crc_messages, static_cast<int>(bytes.size() / 2));
  // A flip in tensor data names the whole-file CRC.
  std::string b = bytes;
  b[bytes.size() - 8 - 1] ^= 0x10;  // last data byte
  WriteRaw(bad, b);
  auto r = LoadCheckpoint(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("CRC32C mismatch (stored"), std::string::npos) << r.status();
}

TEST(CheckpointTest, TruncatedOrExtendedFileIsRefused) {
  TestDir dir("ckpt_trunc");
  std::string good = dir.Path("good.ckpt");
  ASSERT_TRUE(SaveCheckpoint(good, MakeCheckpoint(3, /*big_elements=*/40)).ok());
  const std::string bytes = *ReadFileToString(good);
  const std::string bad = dir.Path("short.ckpt");
  for (size_t len = 0; len < bytes.size(); ++len) {
    WriteRaw(bad, bytes.substr(0, len));
    auto r = LoadCheckpoint(bad);
    ASSERT_FALSE(r.ok()) << "truncated to " << len << " bytes was accepted";
    ASSERT_NE(r.status().message().find(bad), std::string::npos) << r.status();
    if (len >= 64) {
      ASSERT_NE(r.status().message().find("truncated"), std::string::npos) << r.status();
    }
  }
  WriteRaw(bad, bytes + "x");
  auto r = LoadCheckpoint(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("trailing bytes"), std::string::npos) << r.status();

  WriteRaw(bad, "step,loss\n1,0.5\n");
  r = LoadCheckpoint(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not an onnxpipe checkpoint"), std::string::npos) << r.status();
  r = LoadCheckpoint(dir.Path("missing.ckpt"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
}

TEST(CheckpointTest, SaveRejectsBadTensorSets) {
  TestDir dir("ckpt_savebad");
  Checkpoint c = MakeCheckpoint(1, 8);
  c.tensors.push_back({"ids", Tensor::Scalar<float>(1)});
  absl::Status s = SaveCheckpoint(dir.Path("x.ckpt"), c);
  EXPECT_NE(s.message().find("duplicate tensor name 'ids'"), std::string::npos) << s;
  c = MakeCheckpoint(1, 8);
  c.tensors.push_back({"", Tensor::Scalar<float>(1)});
  EXPECT_FALSE(SaveCheckpoint(dir.Path("x.ckpt"), c).ok());
  c = MakeCheckpoint(1, 8);
  c.tensors.push_back({"undefined", Tensor()});
  EXPECT_FALSE(SaveCheckpoint(dir.Path("x.ckpt"), c).ok());
  EXPECT_TRUE(dir.ListNames().empty());  // nothing half-written left behind
}

TEST(CheckpointTest, CheckCompatibleNamesTheFirstDifference) {
  TestDir dir("ckpt_compat");
  std::string path = dir.Path("c.ckpt");
  ASSERT_TRUE(SaveCheckpoint(path, MakeCheckpoint(5, 16)).ok());
  Checkpoint c = *LoadCheckpoint(path);
  std::vector<TensorSpec> specs;
  for (const NamedTensor& t : c.tensors) specs.push_back({t.name, t.tensor.dtype(), t.tensor.dims()});
  std::reverse(specs.begin(), specs.end());  // order does not matter
  ModelFingerprint fp = c.metadata.model;
  EXPECT_TRUE(CheckCompatible(c, specs, fp).ok());
  EXPECT_TRUE(CheckCompatible(c, specs, std::nullopt).ok());

  auto expect_error = [&](std::vector<TensorSpec> s, std::optional<ModelFingerprint> m, const std::string& needle) {
    absl::Status st = CheckCompatible(c, s, m);
    ASSERT_FALSE(st.ok()) << needle;
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(st.message().find(needle), std::string::npos) << st;
    EXPECT_NE(st.message().find(path), std::string::npos) << st;
  };
  std::vector<TensorSpec> s = specs;
  s[1].dims = {17};
  s[3].dtype = DType::kF64;
  expect_error(s, fp, "tensor '" + specs[1].name + "' is ");
  s = specs;
  for (TensorSpec& t : s) {
    if (t.name == "ids") t.dtype = DType::kI32;
  }
  expect_error(s, fp, "tensor 'ids' is i64[3,2], the model expects i32[3,2]");
  s = specs;
  s.push_back({"layer1.weight", DType::kF32, {4, 4}});
  expect_error(s, fp, "has no tensor 'layer1.weight' (expected f32[4,4])");
  s = specs;
  s.erase(s.begin());  // drops "bytes", the last tensor in the file
  expect_error(s, fp, "it has tensor 'bytes' that the model does not");
  expect_error(specs, ModelFingerprint{123456789, 0xDEADBEEE}, "different model file");
}

TEST(CheckpointTest, FingerprintIsSizeAndCrc32c) {
  TestDir dir("ckpt_fp");
  ASSERT_TRUE(WriteFileAtomically(dir.Path("m.onnx"), "123456789").ok());
  auto fp = FingerprintFile(dir.Path("m.onnx"));
  ASSERT_TRUE(fp.ok());
  EXPECT_EQ(fp->size, 9u);
  EXPECT_EQ(fp->crc32c, 0xE3069283u);
  EXPECT_EQ(fp->ToString(), "9 bytes, crc32c 0xe3069283");
  EXPECT_FALSE(FingerprintFile(dir.Path("absent.onnx")).ok());
}

TEST(CheckpointManagerTest, KeepsLastKAndPointsLatestAtNewest) {
  TestDir dir("ckpt_manager");
  std::string cdir = dir.Path("ckpts");
  CheckpointManager m(cdir, /*keep_last=*/2);
  auto none = m.LoadLatest();
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find(cdir), std::string::npos);
  for (int64_t step : {10, 20, 30, 40}) {
    auto p = m.Save(MakeCheckpoint(step, 16));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(*p, cdir + "/step_" + std::to_string(step) + ".ckpt");
  }
  EXPECT_EQ(*m.ListSteps(), (std::vector<int64_t>{30, 40}));
  EXPECT_EQ(*ReadFileToString(cdir + "/latest"), "step_40.ckpt\n");
  auto latest = m.LoadLatest();
  ASSERT_TRUE(latest.ok()) << latest.status();
  ExpectSameCheckpoint(*latest, MakeCheckpoint(40, 16));

  // Re-saving an older step (e.g. a resumed run) keeps the one just written even though its step is lowest.
  ASSERT_TRUE(m.Save(MakeCheckpoint(35, 16)).ok());
  EXPECT_EQ(*m.ListSteps(), (std::vector<int64_t>{35, 40}));
  EXPECT_EQ(m.LoadLatest()->metadata.step, 35);

  CheckpointManager keep_all(cdir, 0);
  ASSERT_TRUE(keep_all.Save(MakeCheckpoint(50, 16)).ok());
  ASSERT_TRUE(keep_all.Save(MakeCheckpoint(60, 16)).ok());
  EXPECT_EQ(*keep_all.ListSteps(), (std::vector<int64_t>{35, 40, 50, 60}));
  std::vector<std::string> names = dir.ListNames();
  EXPECT_EQ(names, std::vector<std::string>{"ckpts"});

  // Broken pointers are clear errors, never a silent fresh start.
  ASSERT_TRUE(WriteFileAtomically(cdir + "/latest", "garbage\n").ok());
  auto bad = m.LoadLatest();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("latest' is corrupt"), std::string::npos) << bad.status();
  ASSERT_TRUE(WriteFileAtomically(cdir + "/latest", "step_99.ckpt\n").ok());
  bad = m.LoadLatest();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("step_99.ckpt', which does not exist"), std::string::npos) << bad.status();
}

// A checkpoint written in shards (each process its tensors, a shared one in several) loads as the whole one; the
// manifest commits the step only once written, and a pruned step takes its shards along.
TEST(CheckpointManagerTest, ShardsLoadAsTheWholeCheckpoint) {
  TestDir dir("ckpt_shards");
  const std::string cdir = dir.Path("ckpts");
  CheckpointManager m(cdir, /*keep_last=*/1);
  auto split = [](const Checkpoint& whole) {
    std::vector<Checkpoint> parts(3);
    for (size_t i = 0; i < whole.tensors.size(); ++i) {
      parts[i % 3].tensors.push_back(whole.tensors[i]);
      if (i == 0) parts[2].tensors.push_back(whole.tensors[i]);  // a shared parameter, held twice
    }
    for (Checkpoint& p : parts) p.metadata = whole.metadata;
    return parts;
  };
  for (int64_t step : {7, 8}) {
    const Checkpoint whole = MakeCheckpoint(step, 16);
    const std::vector<Checkpoint> parts = split(whole);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(m.SaveShard(parts[i], i, 3).ok());
    if (step == 8) {  // written, not committed: the previous step stays the one to resume from
      EXPECT_EQ(m.LoadLatest()->metadata.step, 7);
    }
    ASSERT_TRUE(m.SaveManifest(whole, 3).ok());
    absl::StatusOr<Checkpoint> back = m.LoadLatest();
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_EQ(back->tensors.size(), whole.tensors.size());
    for (const NamedTensor& t : whole.tensors) {
      ASSERT_NE(back->Find(t.name), nullptr) << t.name;
      EXPECT_TRUE(back->Find(t.name)->BitwiseEquals(t.tensor)) << t.name;
    }
    EXPECT_EQ(back->metadata.step, step);
  }
  // keep_last 1: step 7's manifest and shards are gone.
  EXPECT_EQ(*m.ListSteps(), (std::vector<int64_t>{8}));
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(fs::exists(cdir + "/" + CheckpointManager::ShardFileName(7, i, 3))) << i;
    EXPECT_TRUE(fs::exists(cdir + "/" + CheckpointManager::ShardFileName(8, i, 3))) << i;
  }
  // A missing shard and a shard of another step are errors naming the shard.
  const std::string shard1 = cdir + "/" + CheckpointManager::ShardFileName(8, 1, 3);
  fs::rename(shard1, cdir + "/moved");
  absl::StatusOr<Checkpoint> bad = m.LoadLatest();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("step_8.shard-1-of-3.ckpt"), std::string::npos) << bad.status();
  Checkpoint other = MakeCheckpoint(9, 16);
  ASSERT_TRUE(SaveCheckpoint(shard1, other).ok());
  bad = m.LoadLatest();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("a shard of step 9 in the checkpoint of step 8"), std::string::npos)
      << bad.status();
  EXPECT_FALSE(m.SaveShard(other, 3, 3).ok());
}

// kill -9 at random moments of a process that saves large checkpoints in a loop: `latest` must always load, and be
// the last save the child reported complete, or the one it was writing when it died if that reached its rename.
TEST(CheckpointManagerTest, KillDuringSaveLeavesACompleteCheckpoint) {
  TestDir dir("ckpt_kill");
  const std::string cdir = dir.Path("ckpts");
  constexpr int64_t kBig = 6 << 20;  // 24 MiB of f32 per checkpoint
  ASSERT_TRUE(CheckpointManager(cdir, 2).Save(MakeCheckpoint(0, kBig)).ok());
  std::mt19937 rng(20240611);
  int64_t version = 1;
  int64_t prev_step = 0;
  int temps_seen = 0;
  for (int round = 0; round < 8; ++round) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const int64_t first = version;
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      CheckpointManager m(cdir, 2);
      if (write(fds[1], "S", 1) != 1) _exit(2);
      for (int64_t v = first;; ++v) {
        if (!m.Save(MakeCheckpoint(v, kBig)).ok()) _exit(3);
        if (write(fds[1], &v, sizeof(v)) != sizeof(v)) _exit(4);
      }
    }
    close(fds[1]);
    char c;
    ASSERT_EQ(read(fds[0], &c, 1), 1);
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 400000)(rng)));
    kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with " << WEXITSTATUS(status) << " before the kill";
    int64_t completed = -1, v;
    while (read(fds[0], &v, sizeof(v)) == sizeof(v)) completed = v;
    close(fds[0]);
    for (const auto& e : fs::directory_iterator(cdir)) {
      if (e.path().filename().string().find(".tmp.") != std::string::npos) ++temps_seen;
    }

    auto latest = CheckpointManager(cdir, 2).LoadLatest();
    ASSERT_TRUE(latest.ok()) << "round " << round << ": " << latest.status();
    const int64_t step = latest->metadata.step;
    // Before any reported completion: the previous round's checkpoint or the first one this child wrote.
    const int64_t lo = completed < 0 ? prev_step : completed, hi = completed < 0 ? first : completed + 1;
    EXPECT_TRUE(step == lo || step == hi)
        << "round " << round << ": loaded step " << step << ", expected " << lo << " or " << hi;
    ExpectSameCheckpoint(*latest, MakeCheckpoint(step, kBig));
    prev_step = step;
    version = hi + 1;  // never reuse a step the dead child may have half-written
  }
  std::cout << "[ INFO     ] kills that left a temp file behind: " << temps_seen << " of 8\n";
  // The next save clears temp files of the dead writers.
  ASSERT_TRUE(CheckpointManager(cdir, 2).Save(MakeCheckpoint(version, 16)).ok());
  for (const auto& e : fs::directory_iterator(cdir)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }
}

}  // namespace
}  // namespace onnxpipe::io
