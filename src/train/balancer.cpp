// BatchBalancer: speeds from pooled busy times, and a new split when it pays.
#include "train/balancer.hpp"

#include "ddpv/core/error.hpp"

namespace ddpv {

BatchBalancer::BatchBalancer(int world, int64_t batch, const std::vector<int64_t>& first)
    : bounds_(split_bounds(batch, world)),
      global_(batch * world),
      sizes_(first_split(first, world, batch)) {}

bool BatchBalancer::decide(const std::vector<double>& busy_s, const std::vector<double>& samples) {
  DDPV_CHECK(busy_s.size() == sizes_.size() && samples.size() == sizes_.size(),
             "balancer: figures for ", busy_s.size(), " ranks, not ", sizes_.size(), " (internal)");
  std::vector<double> now(sizes_.size());
  for (size_t r = 0; r < now.size(); ++r) {
    // A window without work to measure (a rank that only waited) tells nothing: keep the rates.
    if (!(busy_s[r] > 0) || !(samples[r] > 0)) return false;
    now[r] = samples[r] / busy_s[r];
  }
  if (rates_.empty()) {
    rates_ = now;
  } else {
    for (size_t r = 0; r < now.size(); ++r) rates_[r] = 0.5 * rates_[r] + 0.5 * now[r];
  }
  std::vector<int64_t> next =
      balanced_split(rates_, global_, bounds_.quantum, bounds_.lo, bounds_.hi);
  const auto shorter = [&](const std::vector<double>& rates) {
    return split_step_time(next, rates) <= (1 - kGain) * split_step_time(sizes_, rates);
  };
  // Shorter by the averaged speeds and by each of the last two windows' own: a blip in one
  // window, or noise that singles out a different rank in each, moves nothing.
  const bool moves =
      next != sizes_ && shorter(rates_) && shorter(now) && !last_.empty() && shorter(last_);
  last_ = std::move(now);
  if (!moves) return false;
  sizes_ = std::move(next);
  last_.clear();  // the next change needs two windows of the new split's
  ++changes_;
  return true;
}

}  // namespace ddpv
