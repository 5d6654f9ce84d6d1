// The wall clock of the per-phase timers (data wait, communication wait, training time).
#pragma once

#include <chrono>

namespace ddpv {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace ddpv
