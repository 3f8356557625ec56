// Thread pool: a FIFO of range tasks served by num_threads-1 workers plus the calling thread.
// The caller helps drain the queue while it waits, so concurrent callers (pipeline stages on
// threads) always make progress even when every worker is busy with another caller's loop.
#include "executor/cpu/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>

namespace onnxpipe::cpu {

namespace {
// True on pool workers and on a caller inside ParallelFor: nested loops run inline.
thread_local bool tls_in_parallel_region = false;

struct Latch {
  std::mutex mu;
  std::condition_variable cv;
  int64_t remaining;
  std::exception_ptr error;  // the first chunk's exception (a failed allocation), rethrown to the caller
};

// Runs one chunk, keeping its exception for the caller instead of letting it end the process on a worker.
void RunChunk(const std::function<void(int64_t, int64_t)>& fn, int64_t b, int64_t e, Latch& latch) {
  try {
    fn(b, e);
  } catch (...) {
    std::lock_guard<std::mutex> l(latch.mu);
    if (!latch.error) latch.error = std::current_exception();
  }
}

std::mutex& GlobalMutex() {
  static std::mutex mu;
  return mu;
}
std::unique_ptr<ThreadPool>& GlobalSlot() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}
}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::WorkerLoop() {
  tls_in_parallel_region = true;
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t chunks = std::min<int64_t>(num_threads_, (n + grain - 1) / grain);
  if (chunks <= 1 || tls_in_parallel_region) {
    fn(0, n);
    return;
  }
  auto range = [n, chunks](int64_t c) { return std::pair<int64_t, int64_t>{n * c / chunks, n * (c + 1) / chunks}; };
  Latch latch;
  latch.remaining = chunks - 1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t c = 1; c < chunks; ++c) {
      queue_.emplace_back([&fn, &latch, c, range] {
        auto [b, e] = range(c);
        RunChunk(fn, b, e, latch);
        std::lock_guard<std::mutex> l(latch.mu);
        if (--latch.remaining == 0) latch.cv.notify_all();
      });
    }
  }
  cv_.notify_all();

  tls_in_parallel_region = true;
  auto [b0, e0] = range(0);
  RunChunk(fn, b0, e0, latch);  // the queued chunks hold `fn` and `latch`: wait for them even if this one fails
  // Help with queued work (ours or another caller's) until our chunks are done.
  for (;;) {
    {
      std::lock_guard<std::mutex> l(latch.mu);
      if (latch.remaining == 0) break;
    }
    std::function<void()> task;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!queue_.empty()) {
        task = std::move(queue_.front());
        queue_.pop_front();
      }
    }
    if (!task) break;
    task();
  }
  {
    std::unique_lock<std::mutex> l(latch.mu);
    latch.cv.wait(l, [&latch] { return latch.remaining == 0; });
  }
  tls_in_parallel_region = false;
  if (latch.error) std::rethrow_exception(latch.error);
}

int ThreadPool::DefaultNumThreads() {
  if (const char* env = std::getenv("ONNXPIPE_NUM_THREADS")) {
    char* end = nullptr;
    long v = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && v > 0 && v <= 4096) return static_cast<int>(v);
  }
  return UsableCpus();
}

int ThreadPool::UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  const unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(hc);
}

ThreadPool& ThreadPool::Global() {
  std::lock_guard<std::mutex> lock(GlobalMutex());
  auto& slot = GlobalSlot();
  if (!slot) slot = std::make_unique<ThreadPool>(DefaultNumThreads());
  return *slot;
}

void ThreadPool::SetGlobalNumThreads(int num_threads) {
  std::lock_guard<std::mutex> lock(GlobalMutex());
  GlobalSlot() = std::make_unique<ThreadPool>(num_threads > 0 ? num_threads : DefaultNumThreads());
}

}  // namespace onnxpipe::cpu
