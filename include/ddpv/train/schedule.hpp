// Learning-rate schedules: linear warmup, then constant, step or cosine, by optimizer step.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "ddpv/core/choice.hpp"

namespace ddpv {

enum class LrShape : uint8_t { kConstant, kStep, kCosine };
std::span<const ChoiceWord<LrShape>> choices(LrShape);  // constant | step | cosine

// Note [Schedule by step]: the schedule is a pure function of the optimizer step, so a resumed
// run recomputes the same rate without saving any schedule state. Warmup rises linearly from
// base/warmup_steps to base over warmup_steps; then
//   constant: base
//   step:     base, divided by 10 at 50% and again at 75% of total_steps
//   cosine:   base * (1 + cos(pi * progress)) / 2, progress from 0 after warmup to 1 at the end
class LrSchedule {
 public:
  LrSchedule(LrShape shape, double base_lr, int64_t total_steps, int64_t warmup_steps);
  double at(int64_t step) const;  // the rate for optimizer step `step` (0-based)
  int64_t total_steps() const { return total_; }

 private:
  LrShape shape_;
  double base_;
  int64_t total_, warmup_;
};

}  // namespace ddpv
