// Thread pool behaviour, and kernels' results being bit-identical whatever the pool size.
#include <atomic>
#include <new>
#include <thread>

#include "executor/cpu/kernel.h"
#include "executor/cpu/thread_pool.h"
#include "tests/cpu/test_util.h"

namespace onnxpipe::cpu::testing {
namespace {

using ir::DType;
using ir::OpKind;
using ir::Tensor;

TEST(ThreadPool, CoversEveryIndexOnceInContiguousRanges) {
  ThreadPool pool(4);
  for (int64_t n : {0, 1, 3, 4, 5, 1000, 100003}) {
    std::vector<std::atomic<int>> hits(n);
    std::atomic<int> calls{0};
    pool.ParallelFor(n, 7, [&](int64_t b, int64_t e) {
      EXPECT_LE(b, e);
      calls++;
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << n << " " << i;
    EXPECT_LE(calls.load(), 4);
  }
}

// A chunk that fails (a kernel's allocation on a worker thread) reaches the caller as its exception, after every
// chunk has finished, instead of ending the process; the pool keeps working.
TEST(ThreadPool, AChunksExceptionReachesTheCallerAndThePoolGoesOn) {
  ThreadPool pool(4);
  for (int64_t failing : {0, 2, 3}) {  // the caller's own chunk and workers' chunks
    std::atomic<int> finished{0};
    EXPECT_THROW(pool.ParallelFor(4, 1,
                                  [&](int64_t b, int64_t e) {
                                    if (b == failing) throw std::bad_alloc();
                                    finished++;
                                  }),
                 std::bad_alloc);
    EXPECT_EQ(finished.load(), 3) << "chunk " << failing;
  }
  std::atomic<int64_t> total{0};
  pool.ParallelFor(100, 1, [&](int64_t b, int64_t e) { total += e - b; });
  EXPECT_EQ(total.load(), 100);
}

TEST(ThreadPool, NestedAndConcurrentCallers) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  auto work = [&] {
    pool.ParallelFor(50, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        pool.ParallelFor(20, 1, [&](int64_t b2, int64_t e2) { total += e2 - b2; });
      }
    });
  };
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) callers.emplace_back(work);
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 50 * 20);
}

TEST(ThreadPool, DefaultSizeReadsEnvironment) {
  setenv("ONNXPIPE_NUM_THREADS", "3", 1);
  EXPECT_EQ(ThreadPool::DefaultNumThreads(), 3);
  setenv("ONNXPIPE_NUM_THREADS", "zero", 1);
  EXPECT_GE(ThreadPool::DefaultNumThreads(), 1);
  unsetenv("ONNXPIPE_NUM_THREADS");
}

// Runs a fixed set of nodes and returns all their outputs.
std::vector<Tensor> RunSuite() {
  std::vector<Tensor> out;
  auto add = [&](const ir::Node& n, const std::vector<Tensor>& in, EvalContext ctx = {}) {
    auto r = Eval(n, in, ctx);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok())
      for (const Tensor& t : *r)
        if (t.defined()) out.push_back(t);
  };
  Tensor x = Rand(DType::kF32, {257, 129}, 1);
  Tensor x3 = Rand(DType::kF64, {8, 65, 33}, 2);
  for (std::vector<int64_t> axes : {std::vector<int64_t>{0}, {1}, {0, 1}}) {
    ir::Attrs a;
    a.Set("axes", axes);
    add(MakeNode(OpKind::kReduceSum, 1, 1, a), {x});
    add(MakeNode(OpKind::kReduceMean, 1, 1, a), {x3});
  }
  ir::Attrs ax0;
  ax0.Set("axis", int64_t{0});
  add(MakeNode(OpKind::kSoftmax, 1, 1, ax0), {x});
  add(MakeNode(OpKind::kLogSoftmax, 1), {x3});
  add(MakeNode(OpKind::kLayerNorm, 3, 3), {x3, Rand(DType::kF64, {33}, 3), Rand(DType::kF64, {33}, 4)});
  add(MakeNode(OpKind::kAdd, 2), {x, Rand(DType::kF32, {129}, 5)});
  add(MakeNode(OpKind::kGelu, 1), {x});
  ir::Attrs att;
  att.Set("dropout", 0.1);
  att.Set("causal", int64_t{1});
  add(MakeNode(OpKind::kAttention, 3, 1, att),
      {Rand(DType::kF32, {2, 4, 31, 8}, 6), Rand(DType::kF32, {2, 4, 31, 8}, 7), Rand(DType::kF32, {2, 4, 31, 8}, 8)},
      EvalContext{true, 5, 6});
  add(MakeNode(OpKind::kSoftmaxCrossEntropyLoss, 2, 2),
      {Rand(DType::kF32, {64, 10, 9}, 9), RandInt(DType::kI64, {64, 9}, 10, 0, 9)});
  ir::Attrs perm;
  perm.Set("perm", std::vector<int64_t>{2, 0, 1});
  add(MakeNode(OpKind::kTranspose, 1, 1, perm), {x3});
  return out;
}

TEST(Determinism, KernelResultsDoNotDependOnThreadCount) {
  std::vector<std::vector<Tensor>> runs;
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool::SetGlobalNumThreads(threads);
    runs.push_back(RunSuite());
  }
  ThreadPool::SetGlobalNumThreads(0);
  for (size_t r = 1; r < runs.size(); ++r) {
    ASSERT_EQ(runs[r].size(), runs[0].size());
    for (size_t i = 0; i < runs[0].size(); ++i)
      EXPECT_TRUE(runs[r][i].BitwiseEquals(runs[0][i])) << "run " << r << " output " << i;
  }
}

// Every op having a kernel: kernel_coverage_test.cc, generated from the op list.
TEST(Registry, ArityIsCheckedAndOutputsArePadded) {
  auto few = Eval(MakeNode(OpKind::kAdd, 1, 1, {}, "/x/Add"), {Rand(DType::kF32, {1}, 1)});
  ASSERT_FALSE(few.ok());
  EXPECT_NE(few.status().message().find("Add node '/x/Add'"), std::string::npos) << few.status();
  auto missing = Eval(MakeNode(OpKind::kMul, 2), {Rand(DType::kF32, {1}, 1), Tensor()});
  EXPECT_FALSE(missing.ok());
  // Outputs are padded to the node's output count (unused optional outputs stay undefined).
  auto one = Eval(MakeNode(OpKind::kLayerNorm, 2, 1), {Rand(DType::kF32, {2, 3}, 1), Rand(DType::kF32, {3}, 2)});
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->size(), 1u);
}

}  // namespace
}  // namespace onnxpipe::cpu::testing
