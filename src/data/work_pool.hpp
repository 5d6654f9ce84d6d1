// Private: a fixed pool of threads that runs one indexed loop at a time (the loader's decoders).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ddpv {

// Note [Decode pool]: run(n, fn) calls fn(i, worker) for every i in [0, n) on `threads` threads,
// the caller being worker 0, and returns when all calls have returned. Indices are handed out
// one at a time from a shared counter, so a slow image (a large JPEG) does not hold a whole
// share back. What fn computes for i must not depend on the worker (per-worker scratch only),
// which is what makes a batch the same at any thread count. The first exception is rethrown
// once every call has returned; the loop's other indices still run.
class WorkPool {
 public:
  explicit WorkPool(int threads) {
    for (int t = 1; t < threads; ++t) workers_.emplace_back([this, t] { serve(t); });
  }
  ~WorkPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  void run(int64_t n, const std::function<void(int64_t, int)>& fn) {
    if (n <= 0) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      n_ = n;
      next_.store(0);
      busy_ = static_cast<int>(workers_.size());
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    work(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return busy_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work(int worker) {
    for (int64_t i = next_.fetch_add(1); i < n_; i = next_.fetch_add(1)) {
      try {
        (*fn_)(i, worker);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
  }

  void serve(int worker) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      lock.unlock();
      work(worker);
      lock.lock();
      if (--busy_ == 0) done_cv_.notify_all();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int)>* fn_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
  int busy_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace ddpv
