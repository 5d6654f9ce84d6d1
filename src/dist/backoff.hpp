// Backoff: the waiting policy of every rank that waits for other ranks on CPU (MPI requests,
// the shared update's counters): spin briefly, then sleep (Note [Waiting without spinning]).
#pragma once

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "ddpv/core/clock.hpp"

namespace ddpv {

// Note [Waiting without spinning]: a rank waits for the others at every step, most often for a
// few milliseconds of their jitter, and then the first microseconds after the wait ends count:
// a spinning waiter sees the end at once, a sleeping one a scheduler tick later. But a wait
// can also last minutes (a stopped rank, a checkpoint written by rank 0, evaluation), and a
// waiter that spins through it burns its core for nothing: with Open MPI's blocking
// collectives, the three live ranks of a job with one stopped rank spun at 100% until the
// allocation ended. So a wait spins for its first kSpin (a pause per try, a yield of the core
// every 64 tries, for nodes with more ranks than cores), then sleeps between tries, from
// kFirstSleep doubling to kMaxSleep. A wait long enough to sleep is far longer than the
// wake-up latency it adds (at most kMaxSleep, against a wait of more than kSpin). Blocking MPI
// calls cannot sleep, so the ranks first arrive through a non-blocking call waited on this way
// (mpi_wait.hpp), and only then run the blocking one, which by then waits for data, not ranks.
class Backoff {
 public:
  static constexpr std::chrono::milliseconds kSpin{50};
  static constexpr std::chrono::microseconds kFirstSleep{50};
  static constexpr std::chrono::microseconds kMaxSleep{5000};

  // One try of a wait.
  void pause() {
    if (tries_++ == 0) start_ = Clock::now();
    if (sleep_.count() == 0) {
      spin_once();
      if (tries_ % 64 == 0 && Clock::now() - start_ >= kSpin) sleep_ = kFirstSleep;
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::duration_cast<std::chrono::microseconds>(kMaxSleep));
  }
  // The awaited thing moved (a chunk claimed): the next pause spins again.
  void reset() {
    tries_ = 0;
    sleep_ = std::chrono::microseconds{0};
  }

 private:
  void spin_once() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    if (tries_ % 64 == 0) sched_yield();
  }

  unsigned tries_ = 0;
  Clock::time_point start_{};
  std::chrono::microseconds sleep_{0};
};

}  // namespace ddpv
