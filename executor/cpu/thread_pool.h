// A small shared pool of std::threads for the CPU kernels' data-parallel loops.
//
// Contract:
// - ParallelFor(n, grain, fn) calls fn(begin, end) on disjoint contiguous ranges that cover [0, n)
//   exactly once, and returns when all calls have finished. A range is at least `grain` long
//   (except the last one), so tiny loops run inline on the caller.
// - Work is split by index only: which thread runs a range never changes what the range computes.
//   Kernels keep every output element's reduction inside one fn call, so their results do not
//   depend on the number of threads.
// - Safe to call from several threads at once (pipeline stages run concurrently) and from inside
//   a worker (the nested loop then runs inline, so workers never wait on each other).
// - Size: ONNXPIPE_NUM_THREADS when set to a positive integer, else the CPUs this process may run on
//   (its affinity mask: what taskset, cgroups' cpusets and Slurm's CPU binding leave it).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace onnxpipe::cpu {

class ThreadPool {
 public:
  // num_threads counts the calling thread: a pool of 1 runs everything inline.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // The process-wide pool the kernels use.
  static ThreadPool& Global();
  // Replaces the global pool with one of `num_threads` threads (<= 0: the default size). Must not
  // race with kernels running on the old pool; meant for tests and command-line flags.
  static void SetGlobalNumThreads(int num_threads);
  // ONNXPIPE_NUM_THREADS if set and valid, else UsableCpus().
  static int DefaultNumThreads();
  // The CPUs in this process's affinity mask (hardware_concurrency() where it cannot be read; at least 1).
  static int UsableCpus();

 private:
  void WorkerLoop();

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
};

// ThreadPool::Global().ParallelFor(...).
inline void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  ThreadPool::Global().ParallelFor(n, grain, fn);
}

}  // namespace onnxpipe::cpu
