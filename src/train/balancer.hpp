// BatchBalancer: the trainer's side of --balance, which split of the global batch comes next.
#pragma once

#include <cstdint>
#include <vector>

#include "ddpv/data/batch_split.hpp"

namespace ddpv {

// Note [Balanced batches], continued: every kEvery steps the ranks pool their busy seconds
// (Note [Rank times]: the loop less its waits for peers and data) and the samples they trained
// on since the last decision. A rank's speed is an average of the last windows' samples per
// busy second (the newest weighs half), the proposed split is balanced_split() of those
// speeds, and it replaces the current one only when it would make the step at least kGain
// shorter by those averaged speeds and by each of the last two windows' own, both windows
// measured under the current split (after a change the two start again). A split that
// shifts with every jitter would cost the backend a new set of primitives for each batch size
// it visits and would gain nothing. (With one window enough, a `make bench` round with
// --balance moved its split on the first window after the warm-up, where one rank was briefly
// much slower, and back ten steps later.) The two windows need not propose the same split:
// where the other ranks' speeds wander (four ranks sharing two cores, or many ranks, where
// some rank's share rounds differently in nearly every window), a rule that asked for the
// same split twice kept a rank stopped three quarters of the time, at well under half the
// others' speed, at its even share for a whole run.
class BatchBalancer {
 public:
  static constexpr int kEvery = 10;      // steps per decision
  static constexpr double kGain = 0.05;  // the least gain in step time worth a change

  // `first`: the split to start from (--batch-split); empty for batch each.
  BatchBalancer(int world, int64_t batch, const std::vector<int64_t>& first);
  const std::vector<int64_t>& sizes() const { return sizes_; }
  const std::vector<double>& rates() const { return rates_; }  // samples per busy second
  int changes() const { return changes_; }
  // One window's figures by rank (the same on every rank, so all decide alike); true when the
  // split changed.
  bool decide(const std::vector<double>& busy_s, const std::vector<double>& samples);

 private:
  SplitBounds bounds_;
  int64_t global_;
  std::vector<int64_t> sizes_;
  std::vector<double> last_;  // the window before's own samples per busy second
  std::vector<double> rates_;
  int changes_ = 0;
};

}  // namespace ddpv
