// CollectiveWatchdog: a thread that watches launched collectives and calls a handler once when
// one is late or has failed. Header-only and free of vendor headers, so that its unit test runs
// in every build (the NCCL communicator gives it CUDA-event probes).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "ddpv/core/error.hpp"

namespace ddpv {

// Note [Collective watchdog]: a rank whose peer died or hung waits forever inside a
// collective, and the host cannot even notice, because it never blocks (launches are
// asynchronous, Note [Stream-ordered collectives]). The watchdog thread polls the oldest
// unfinished collective (they complete in launch order, on one stream) and calls `on_hang`
// once when it is older than the timeout or has failed, or when `async_error` reports a
// failure of the communicator. The NCCL communicator's handler aborts the communicator and
// ends the job (Note [Watchdog ends the job]); nothing else frees a rank stuck in a
// device-side wait.
class CollectiveWatchdog {
 public:
  enum class State { kDone, kPending, kFailed };
  // Polls one collective; on kFailed it may describe the failure in *error.
  using Probe = std::function<State(std::string* error)>;
  using HangHandler = std::function<void(const std::string& what)>;
  using ErrorProbe = std::function<std::string()>;  // "" while healthy

  // thread_init runs first on the watchdog thread (the NCCL communicator selects its GPU).
  CollectiveWatchdog(double timeout_s, HangHandler on_hang, ErrorProbe async_error = {},
                     std::function<void()> thread_init = {},
                     std::chrono::milliseconds poll = std::chrono::milliseconds(100))
      : on_hang_(std::move(on_hang)),
        async_error_(std::move(async_error)),
        timeout_s_(timeout_s),
        poll_(poll) {
    thread_ = std::thread([this, init = std::move(thread_init)] {
      if (init) init();
      run();
    });
  }
  ~CollectiveWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // Watches the collective `what`, launched now.
  void watch(Probe done, std::string what) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(Entry{std::move(done), std::chrono::steady_clock::now(), std::move(what)});
  }
  void set_timeout(double seconds) {
    DDPV_CHECK(seconds > 0, "--comm-timeout must be positive, got ", seconds);
    std::lock_guard<std::mutex> lock(mu_);
    timeout_s_ = seconds;
  }
  size_t pending() {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_.size();
  }

 private:
  struct Entry {
    Probe done;
    std::chrono::steady_clock::time_point start;
    std::string what;
  };

  // Polling, not a blocking wait: the thread must notice a collective that never completes,
  // and must stop promptly when the communicator goes.
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, poll_);
      if (stop_ || fired_) continue;
      std::string problem = oldest_problem();
      if (problem.empty() && async_error_) problem = async_error_();
      if (problem.empty()) continue;
      fired_ = true;
      lock.unlock();
      on_hang_(problem);  // the NCCL handler ends the job; otherwise the watchdog goes quiet
      lock.lock();
    }
  }

  // Drops finished collectives; describes the oldest one if it is late or failed.
  std::string oldest_problem() {
    while (!pending_.empty()) {
      const Entry& e = pending_.front();
      std::string error;
      const State s = e.done(&error);
      if (s == State::kDone) {
        pending_.pop_front();
        continue;
      }
      if (s == State::kFailed) return detail::concat(e.what, " failed: ", error);
      const std::chrono::duration<double> age = std::chrono::steady_clock::now() - e.start;
      if (age.count() > timeout_s_) {
        return detail::concat(e.what, " did not finish within ", timeout_s_,
                              " s (--comm-timeout); a peer rank may have died or hung");
      }
      return "";
    }
    return "";
  }

  HangHandler on_hang_;
  ErrorProbe async_error_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Entry> pending_;
  double timeout_s_;
  std::chrono::milliseconds poll_;
  bool stop_ = false;
  bool fired_ = false;
  std::thread thread_;  // last: starts after every member above is initialised
};

}  // namespace ddpv
