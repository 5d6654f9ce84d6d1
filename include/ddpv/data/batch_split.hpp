// Balanced batches: how one step's global batch is split among the ranks (--balance).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace ddpv {

// Note [Balanced batches]: in synchronous data parallelism every step waits for the slowest
// rank, so a rank on a slower or busier core sets the pace of all (Note [Rank times] finds it).
// With --balance the global batch of W * B samples stays the same but its split among the
// ranks follows their measured speed: a rank twice as fast takes twice the samples. What the
// model learns does not change: step t covers positions [t*G, (t+1)*G) of the epoch's padded
// order (G = W * B), rank r takes a contiguous slice of them, and every rank scales its loss
// gradient by W / G instead of 1 / n, so the averaged gradient is the global batch's mean
// whatever the split (only BatchNorm's statistics, which are per rank, see different batches).
// Every step consumes exactly G positions, so a checkpoint's (epoch, step) resumes exactly with
// or without --balance. (Synthetic data has no order: each rank takes its share from its own
// random batches.) The trainer decides the split (BatchBalancer); the split of the batch
// the trainer consumes k-th is fixed `lookahead` batches earlier and queued (SplitQueue), so
// that the loader thread can prepare batches ahead without ever guessing a split.

// The splits --balance may choose for a per-rank batch B: multiples of `quantum` from lo
// (B / 4, at least one quantum) to hi (2 B, less what the other ranks need at lo). A Loader's
// slots hold hi samples. The quantum is B / 16 rounded down to a power of two that divides B:
// a change must make the step BatchBalancer::kGain (5%) shorter, and on 2 ranks the nearest
// split to the even one, B + q / B - q, does that only where one rank is (1 + q / B) / 0.95
// times as fast as the other: 11.8% faster with q = B / 16 (the best split of all needs 10.5%),
// 18.4% with B / 8, which left alone the 10-15% a shared VM often shows. Coarser would be
// cheaper: each size the backend has not seen costs it new primitives, a larger one buffers.
struct SplitBounds {
  int64_t quantum = 1, lo = 1, hi = 1;
};
SplitBounds split_bounds(int64_t batch, int world);

// Rank r's batch at step t is sizes[r] samples from position t*G + split_offset(sizes, r).
std::vector<int64_t> equal_split(int world, int64_t batch);
// The split to start from: `given` (--batch-split) checked, or batch each when it is empty.
std::vector<int64_t> first_split(const std::vector<int64_t>& given, int world, int64_t batch);
// The most samples one rank's batch can hold from `first` on: split_bounds().hi, or more for
// a larger first split.
int64_t split_capacity(const std::vector<int64_t>& first, int world, int64_t batch);
int64_t split_offset(const std::vector<int64_t>& sizes, int rank);
int64_t split_total(const std::vector<int64_t>& sizes);
std::string split_text(const std::vector<int64_t>& sizes);  // "40/88"
std::string speeds_text(const std::vector<double>& speeds);  // "6913/2459", rounded
// Throws, naming `what`, unless sizes gives each of `world` ranks at least one sample and
// world * batch in all.
void check_split(const std::vector<int64_t>& sizes, int world, int64_t batch,
                 const char* what = "batch split");
// An epoch's last step holds only `total` (< the sum of sizes, >= one per rank) positions: each
// rank keeps one and the rest is shared in proportion to sizes, largest remainder first (the
// lower rank on a tie), the same on every rank.
std::vector<int64_t> shrink_split(const std::vector<int64_t>& sizes, int64_t total);

// The split that makes a step of `global` samples shortest when rank r processes rates[r]
// samples a second: sizes proportional to the rates, each a multiple of `quantum` within
// [lo, hi] (multiples of quantum themselves), summing to `global` (a multiple of quantum, with
// W * lo <= global <= W * hi). Rounding gives the leftover quanta to the largest remainders.
std::vector<int64_t> balanced_split(const std::vector<double>& rates, int64_t global,
                                    int64_t quantum, int64_t lo, int64_t hi);
// A step's time under a split: the slowest rank's sizes[r] / rates[r].
double split_step_time(const std::vector<int64_t>& sizes, const std::vector<double>& rates);

// The splits of the batches to come, in the order the trainer consumes them: the k-th pushed
// split (counting the `lookahead` copies of `first` the queue starts with) is the k-th batch's.
// Not thread-safe: the Loader guards it with its mutex.
class SplitQueue {
 public:
  SplitQueue(const std::vector<int64_t>& first, int lookahead);
  void push(std::vector<int64_t> sizes);  // the split of batch number pushed()
  bool has(int64_t seq) const { return seq < base_ + static_cast<int64_t>(q_.size()); }
  const std::vector<int64_t>& at(int64_t seq) const;  // has(seq) and seq >= the last forget()
  void forget_before(int64_t seq);                    // batches before seq were consumed
  int64_t pushed() const { return base_ + static_cast<int64_t>(q_.size()); }

 private:
  std::deque<std::vector<int64_t>> q_;
  int64_t base_ = 0;  // the batch number of q_.front()
};

}  // namespace ddpv
