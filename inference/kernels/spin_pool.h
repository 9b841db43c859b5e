// The engine's own CPU thread pool for the kernels of cpu_ops.cpp and gguf_matmul.cpp.
//
// Why not OpenMP (at::parallel_for): libgomp counts the threads of every team in the process, and
// once they outnumber the cores (a web app whose request threads also ran torch ops, or a model
// loaded on another thread than the engine loop) it stops spinning between parallel regions and
// sleeps after ~100 spins, so each of the step's ~150 small matmuls waits for a futex wake-up:
// twice the time of a decode step on 2 cores. This pool's workers spin for a set time after their
// last task (INFERENCE_CPU_SPIN_US, default 2000 us: through the Python between a step's ops and
// between steps) and then sleep, so an idle engine leaves the cores to the web tier.
//
// Work is split into contiguous ranges, one per thread, by the range alone; results never depend
// on the split (each output row is computed by one thread).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#define SPIN_PAUSE() _mm_pause()
#else
#define SPIN_PAUSE() ((void)0)
#endif

namespace spin_pool {

constexpr int MAX_THREADS = 64;

class Pool {
 public:
  explicit Pool(int threads, int64_t spin_us)
      : threads_(std::max(1, std::min(threads, MAX_THREADS))), spin_us_(spin_us) {
    for (auto& c : claimed_) c.store(0);
    for (int i = 1; i < threads_; ++i) workers_.emplace_back([this, i] { work(i); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mutex_);
      stop_ = true;
      generation_.fetch_add(1);
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }

  int size() const { return threads_; }

  // fn(begin, end) over [begin, end) in at most size() contiguous parts of >= grain items. Part i
  // is meant for thread i, but whoever comes first claims it: the caller takes the parts of
  // workers that are asleep or descheduled instead of waiting for them.
  void run(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    const int64_t n = end - begin;
    const int64_t parts = std::min<int64_t>(threads_, (n + grain - 1) / std::max<int64_t>(grain, 1));
    std::unique_lock<std::mutex> busy(call_, std::try_to_lock);
    if (parts <= 1 || !busy.owns_lock()) {         // small, or another thread is using the pool
      if (n > 0) fn(begin, end);
      return;
    }
    const uint64_t gen = generation_.load(std::memory_order_relaxed) + 1;
    fn_ = &fn;
    begin_ = begin;
    end_ = end;
    step_ = (n + parts - 1) / parts;
    parts_ = parts;
    finished_.store(0, std::memory_order_relaxed);
    for (int64_t i = parts; i < threads_; ++i) claimed_[i].store(gen, std::memory_order_relaxed);   // no part for them
    {
      std::lock_guard<std::mutex> lk(mutex_);
      generation_.store(gen, std::memory_order_release);
    }
    cv_.notify_all();
    int64_t mine = 0;
    for (int64_t i = 0; i < parts; ++i)
      if (claim(i, gen)) {
        execute(i);
        ++mine;
      }
    while (finished_.load(std::memory_order_acquire) != parts - mine) SPIN_PAUSE();
  }

 private:
  bool claim(int64_t part, uint64_t gen) {
    uint64_t seen = claimed_[part].load(std::memory_order_relaxed);
    return seen < gen && claimed_[part].compare_exchange_strong(seen, gen, std::memory_order_acq_rel);
  }

  void execute(int64_t part) {
    const int64_t lo = begin_ + part * step_, hi = std::min(end_, lo + step_);
    if (lo < hi) (*fn_)(lo, hi);
  }

  void work(int id) {
    uint64_t seen = 0;                 // the generation at construction: a late-starting worker still sees the first task
    while (true) {
      auto start = std::chrono::steady_clock::now();
      int spins = 0;
      while (generation_.load(std::memory_order_acquire) == seen) {
        SPIN_PAUSE();
        if (++spins % 256 == 0 &&
            std::chrono::steady_clock::now() - start > std::chrono::microseconds(spin_us_)) {
          std::unique_lock<std::mutex> lk(mutex_);
          cv_.wait(lk, [&] { return generation_.load() != seen; });
          break;
        }
      }
      if (stop_) return;
      seen = generation_.load(std::memory_order_acquire);
      // a part still unclaimed in this generation means its task is still running (the caller
      // waits for every claimed part), so the task's fields are this generation's
      if (id < MAX_THREADS && claim(id, seen)) {
        execute(id);
        finished_.fetch_add(1, std::memory_order_release);
      }
    }
  }

  const int threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_, call_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> claimed_[MAX_THREADS];
  std::atomic<int64_t> finished_{0};
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t begin_ = 0, end_ = 0, step_ = 0, parts_ = 0, spin_us_;
  bool stop_ = false;
};

// The process's pool: at::get_num_threads() threads (INFERENCE_CPU_THREADS overrides), made on
// first use.
Pool& pool();

inline void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  pool().run(begin, end, grain, fn);
}

}  // namespace spin_pool
