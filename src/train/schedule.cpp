// Learning-rate schedules (see Note [Schedule by step]).
#include "ddpv/train/schedule.hpp"

#include <algorithm>
#include <cmath>

#include "ddpv/core/error.hpp"

namespace ddpv {

std::span<const ChoiceWord<LrShape>> choices(LrShape) {
  static constexpr ChoiceWord<LrShape> kWords[] = {
      {"constant", LrShape::kConstant}, {"step", LrShape::kStep}, {"cosine", LrShape::kCosine}};
  return kWords;
}

LrSchedule::LrSchedule(LrShape shape, double base_lr, int64_t total_steps, int64_t warmup_steps)
    : shape_(shape),
      base_(base_lr),
      total_(std::max<int64_t>(total_steps, 1)),
      warmup_(std::clamp<int64_t>(warmup_steps, 0, total_)) {}

double LrSchedule::at(int64_t step) const {
  if (step < warmup_) return base_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
  switch (shape_) {
    case LrShape::kConstant: return base_;
    case LrShape::kStep: {
      double lr = base_;
      if (step >= total_ / 2) lr /= 10;
      if (step >= total_ * 3 / 4) lr /= 10;
      return lr;
    }
    case LrShape::kCosine: {
      const double span = static_cast<double>(std::max<int64_t>(total_ - warmup_, 1));
      const double progress = std::min(1.0, static_cast<double>(step - warmup_) / span);
      return base_ * 0.5 * (1.0 + std::cos(M_PI * progress));
    }
  }
  return base_;
}

}  // namespace ddpv
