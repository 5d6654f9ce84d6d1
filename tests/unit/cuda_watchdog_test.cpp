// CollectiveWatchdog (the NCCL communicator's guard against stuck collectives) with stand-in
// probes, so that it is tested in every build, GPU or not: finished collectives are dropped, a
// late or failed one and an asynchronous communicator error fire the handler exactly once.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>

#include "dist/nccl/collective_watchdog.hpp"

namespace ddpv {
namespace {

using namespace std::chrono_literals;
using State = CollectiveWatchdog::State;

// Records the handler's calls.
struct Fired {
  std::atomic<int> count{0};
  std::mutex mu;
  std::string what;
  CollectiveWatchdog::HangHandler handler() {
    return [this](const std::string& w) {
      std::lock_guard<std::mutex> lock(mu);
      what = w;
      ++count;
    };
  }
  bool wait_for_call(std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (count == 0 && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(5ms);
    return count > 0;
  }
  std::string message() {
    std::lock_guard<std::mutex> lock(mu);
    return what;
  }
};

CollectiveWatchdog::Probe always(State s, std::string error = "") {
  return [s, error](std::string* e) {
    *e = error;
    return s;
  };
}

TEST(CollectiveWatchdog, FinishedCollectivesAreDroppedAndNothingFires) {
  Fired fired;
  CollectiveWatchdog dog(0.05, fired.handler(), {}, {}, 5ms);
  std::atomic<bool> done{false};
  dog.watch(always(State::kDone), "allreduce #1");
  dog.watch([&](std::string*) { return done ? State::kDone : State::kPending; }, "allreduce #2");
  done = true;
  const auto end = std::chrono::steady_clock::now() + 2s;
  while (dog.pending() > 0 && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(5ms);
  EXPECT_EQ(dog.pending(), 0u);
  std::this_thread::sleep_for(100ms);  // well past the timeout: nothing is left to be late
  EXPECT_EQ(fired.count, 0);
}

TEST(CollectiveWatchdog, LateCollectiveFiresOnceNamingIt) {
  Fired fired;
  CollectiveWatchdog dog(0.1, fired.handler(), {}, {}, 5ms);
  dog.watch(always(State::kDone), "broadcast #1");
  dog.watch(always(State::kPending), "NCCL allreduce (avg) of 10 elements (collective #2)");
  ASSERT_TRUE(fired.wait_for_call(5s));
  const std::string m = fired.message();
  EXPECT_NE(m.find("allreduce (avg) of 10 elements (collective #2)"), std::string::npos) << m;
  EXPECT_NE(m.find("did not finish within 0.1 s"), std::string::npos) << m;
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(fired.count, 1);
}

TEST(CollectiveWatchdog, PendingWithinTheTimeoutDoesNotFireAndStopsPromptly) {
  Fired fired;
  const auto start = std::chrono::steady_clock::now();
  {
    CollectiveWatchdog dog(60, fired.handler(), {}, {}, 5ms);
    dog.watch(always(State::kPending), "allreduce #1");
    std::this_thread::sleep_for(100ms);
    EXPECT_EQ(fired.count, 0);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

TEST(CollectiveWatchdog, FailedCollectiveFiresWithTheError) {
  Fired fired;
  CollectiveWatchdog dog(60, fired.handler(), {}, {}, 5ms);
  dog.watch(always(State::kFailed, "an illegal memory access was encountered"), "barrier (#3)");
  ASSERT_TRUE(fired.wait_for_call(5s));
  EXPECT_NE(fired.message().find("barrier (#3) failed: an illegal memory access"),
            std::string::npos)
      << fired.message();
}

TEST(CollectiveWatchdog, AsynchronousErrorFires) {
  Fired fired;
  std::atomic<bool> broken{false};
  CollectiveWatchdog dog(
      60, fired.handler(),
      [&] { return broken ? std::string("NCCL reported an asynchronous error: remote") : ""; }, {},
      5ms);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(fired.count, 0);
  broken = true;
  ASSERT_TRUE(fired.wait_for_call(5s));
  EXPECT_NE(fired.message().find("remote"), std::string::npos);
}

TEST(CollectiveWatchdog, TimeoutCanBeLoweredAndMustBePositive) {
  Fired fired;
  std::atomic<bool> initialised{false};
  CollectiveWatchdog dog(
      600, fired.handler(), {}, [&] { initialised = true; }, 5ms);
  EXPECT_THROW(dog.set_timeout(0), Error);
  dog.watch(always(State::kPending), "allreduce #1");
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(fired.count, 0);
  dog.set_timeout(0.01);
  ASSERT_TRUE(fired.wait_for_call(5s));
  EXPECT_TRUE(initialised);  // thread_init ran on the watchdog thread
}

}  // namespace
}  // namespace ddpv
