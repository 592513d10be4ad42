// A small fork-join thread pool for the kernels.
//
// MLX runs each CPU primitive on its stream thread; a kernel splits its rows across this pool,
// the calling thread taking the first share. Workers spin briefly between jobs because a decode
// step issues hundreds of small kernels back to back, and a condition-variable wake (~10-50 us)
// would cost more than many of them; after the spin they sleep so an idle process uses no CPU.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define TARG_PAUSE() _mm_pause()
#else
#define TARG_PAUSE() std::this_thread::yield()
#endif

namespace targ {

class Pool {
 public:
  explicit Pool(int n_threads) : n_(std::max(1, n_threads)) {
    for (int i = 1; i < n_; i++) workers_.emplace_back([this, i] { loop(i); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      gen_.fetch_add(1);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  int size() const { return n_; }

  // Run fn(task) for task in [0, n_tasks), spread over the pool; returns when all are done.
  void run(int n_tasks, const std::function<void(int)>& fn) {
    if (n_tasks <= 0) return;
    if (n_ == 1 || n_tasks == 1) {
      for (int t = 0; t < n_tasks; t++) fn(t);
      return;
    }
    std::lock_guard<std::mutex> job_lock(job_mu_);  // one job at a time
    fn_ = &fn;
    n_tasks_ = n_tasks;
    next_.store(0);
    pending_.store(n_ - 1);
    {
      std::lock_guard<std::mutex> lk(mu_);
      gen_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    work();
    while (pending_.load(std::memory_order_acquire) != 0) TARG_PAUSE();
    fn_ = nullptr;
  }

 private:
  void work() {
    for (;;) {
      int t = next_.fetch_add(1);
      if (t >= n_tasks_) break;
      (*fn_)(t);
    }
  }

  void loop(int) {
    // Jobs are counted from 0, the count when the workers were made: reading gen_ here instead
    // would miss a job posted before this thread first ran (seen on a loaded machine), and the
    // caller would wait for it forever.
    unsigned long seen = 0;
    for (;;) {
      // Spin a little (a new job usually follows within microseconds), then sleep.
      auto t0 = std::chrono::steady_clock::now();
      for (int spins = 0; gen_.load(std::memory_order_acquire) == seen; spins++) {
        TARG_PAUSE();
        if ((spins & 63) == 63 && std::chrono::steady_clock::now() - t0 > kSpin) break;
      }
      if (gen_.load(std::memory_order_acquire) == seen) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return gen_.load() != seen; });
      }
      seen = gen_.load(std::memory_order_acquire);
      if (stop_) return;
      work();
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  // Long enough to bridge the gap between kernels of one decode step, short enough not to
  // starve other threads (BLAS, the Python thread) on a machine with few cores.
  static constexpr std::chrono::microseconds kSpin{30};
  int n_;
  std::vector<std::thread> workers_;
  std::mutex mu_, job_mu_;
  std::condition_variable cv_;
  std::atomic<unsigned long> gen_{0};
  std::atomic<int> next_{0}, pending_{0};
  int n_tasks_ = 0;
  const std::function<void(int)>* fn_ = nullptr;
  bool stop_ = false;
};

// The process-wide pool: TARG_MLX_THREADS threads, else one per hardware thread.
inline Pool& pool() {
  static Pool p([] {
    const char* env = std::getenv("TARG_MLX_THREADS");
    int n = env ? std::atoi(env) : 0;
    if (n <= 0) n = (int)std::thread::hardware_concurrency();
    return std::max(1, n);
  }());
  return p;
}

// Tasks a range is split into per thread. Threads take tasks from a shared counter, so with more
// tasks than threads a thread the OS or the hypervisor stops mid-kernel (2 vCPUs carry the
// kernels, MLX's stream thread and Python) leaves the rest of its share to the others instead of
// holding up the step, as llama.cpp's matmul chunks do. Every kernel computes each output row or
// column by itself, so the split changes no result. 16: with a busy thread beside it on 2 Zen 4
// cores the 1.5B's prefill ran 1.33x one task a thread, and as fast on an idle machine
// (BENCHMARKS.md, row "tasks per thread";
// scripts/kernels/bench_tasks.py). TARG_MLX_TASKS_PER_THREAD=N to time others.
#ifndef TARG_TASKS_PER_THREAD
#define TARG_TASKS_PER_THREAD 16
#endif
inline int tasks_per_thread() {
  static const int k = [] {
    const char* env = std::getenv("TARG_MLX_TASKS_PER_THREAD");
    int n = env ? std::atoi(env) : 0;
    return n > 0 ? n : TARG_TASKS_PER_THREAD;
  }();
  return k;
}

// Split [0, n) into about `parts` contiguous ranges of multiples of `align`; fn(begin, end).
inline void parallel_range(int n, int align, int min_per_task, const std::function<void(int, int)>& fn) {
  Pool& p = pool();
  int parts = p.size() == 1 ? 1 : std::min(p.size() * tasks_per_thread(), std::max(1, n / std::max(1, min_per_task)));
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  int chunk = (n + parts - 1) / parts;
  chunk = (chunk + align - 1) / align * align;
  int tasks = (n + chunk - 1) / chunk;
  p.run(tasks, [&](int t) {
    int b = t * chunk, e = std::min(n, b + chunk);
    if (b < e) fn(b, e);
  });
}

}  // namespace targ
