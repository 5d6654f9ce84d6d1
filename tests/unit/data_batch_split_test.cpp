// Balanced batches (Note [Balanced batches]): bounds, splits against brute force, the last
// step's split, the queue of splits to come.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "ddpv/core/error.hpp"
#include "ddpv/data/batch_split.hpp"

namespace ddpv {
namespace {

TEST(BatchSplit, BoundsAreQuantaOfTheBatch) {
  struct Case {
    int64_t batch;
    int world;
    SplitBounds want;
  };
  // quantum: batch / 16 rounded down to a power of two that divides the batch (100: 6.25 ->
  // 4; 30: 1.9 -> 1); lo: a quarter of the batch in whole quanta; hi: twice the batch, less
  // the others' lo.
  for (const Case& c : {Case{64, 2, {4, 16, 112}}, Case{64, 4, {4, 16, 128}},
                        Case{100, 2, {4, 24, 176}}, Case{1, 2, {1, 1, 1}}, Case{30, 3, {1, 7, 60}},
                        Case{256, 8, {16, 64, 512}}, Case{48, 2, {2, 12, 84}}}) {
    const SplitBounds b = split_bounds(c.batch, c.world);
    EXPECT_EQ(b.quantum, c.want.quantum) << c.batch << " x " << c.world;
    EXPECT_EQ(b.lo, c.want.lo) << c.batch << " x " << c.world;
    EXPECT_EQ(b.hi, c.want.hi) << c.batch << " x " << c.world;
  }
}

TEST(BatchSplit, OffsetsTotalsAndText) {
  const std::vector<int64_t> s{88, 40, 0, 12};
  EXPECT_EQ(split_offset(s, 0), 0);
  EXPECT_EQ(split_offset(s, 1), 88);
  EXPECT_EQ(split_offset(s, 3), 128);
  EXPECT_EQ(split_total(s), 140);
  EXPECT_EQ(split_text(s), "88/40/0/12");
  EXPECT_EQ(speeds_text({6913.4, 2458.5, 0.2}), "6913/2459/0");
  EXPECT_EQ(speeds_text({}), "");
  EXPECT_EQ(equal_split(3, 7), (std::vector<int64_t>{7, 7, 7}));
}

TEST(BatchSplit, ProportionalToTheRatesInWholeQuanta) {
  // 2:1 -> 85.3 / 42.7 samples, 21.33 / 10.67 quanta of 4: the floors 21 / 10 and the spare
  // quantum to the larger remainder (rank 1).
  EXPECT_EQ(balanced_split({2.0, 1.0}, 128, 4, 16, 112), (std::vector<int64_t>{84, 44}));
  EXPECT_EQ(balanced_split({1.0, 1.0}, 128, 4, 16, 112), (std::vector<int64_t>{64, 64}));
  // A rank 100 times slower is held at lo, the rest goes to the other (within hi).
  EXPECT_EQ(balanced_split({100.0, 1.0}, 128, 4, 16, 112), (std::vector<int64_t>{112, 16}));
  // Pinned at hi, the remainder shared by the others in proportion: 3 ranks of 64, hi 80.
  EXPECT_EQ(balanced_split({10.0, 1.0, 1.0}, 192, 4, 16, 80), (std::vector<int64_t>{80, 56, 56}));
  EXPECT_THROW(balanced_split({1.0, 0.0}, 128, 4, 16, 112), Error);
  EXPECT_THROW(balanced_split({1.0, 1.0}, 130, 4, 16, 112), Error);
}

// Every split of `global` into multiples of q within [lo, hi], by brute force.
void for_each_split(int world, int64_t global, int64_t q, int64_t lo, int64_t hi,
                    const std::function<void(const std::vector<int64_t>&)>& fn) {
  std::vector<int64_t> s(static_cast<size_t>(world));
  std::function<void(int, int64_t)> rec = [&](int r, int64_t left) {
    if (r == world - 1) {
      if (left >= lo && left <= hi) {
        s[static_cast<size_t>(r)] = left;
        fn(s);
      }
      return;
    }
    for (int64_t v = lo; v <= std::min(hi, left); v += q) {
      s[static_cast<size_t>(r)] = v;
      rec(r + 1, left - v);
    }
  };
  rec(0, global);
}

TEST(BatchSplit, WithinOneQuantumOfTheBestSplitByBruteForce) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> speed(0.3, 3.0);
  for (int world : {2, 3, 4}) {
    for (int trial = 0; trial < 40; ++trial) {
      const int64_t batch = 32, global = batch * world;
      const SplitBounds b = split_bounds(batch, world);
      std::vector<double> rates(static_cast<size_t>(world));
      for (double& v : rates) v = speed(gen);
      const std::vector<int64_t> got = balanced_split(rates, global, b.quantum, b.lo, b.hi);
      ASSERT_EQ(split_total(got), global);
      for (int64_t n : got) {
        EXPECT_EQ(n % b.quantum, 0);
        EXPECT_GE(n, b.lo);
        EXPECT_LE(n, b.hi);
      }
      double best = std::numeric_limits<double>::infinity();
      for_each_split(world, global, b.quantum, b.lo, b.hi, [&](const std::vector<int64_t>& s) {
        best = std::min(best, split_step_time(s, rates));
      });
      // Rounding to quanta may cost at most one quantum on the slowest rank.
      const double slack =
          static_cast<double>(b.quantum) / *std::min_element(rates.begin(), rates.end());
      EXPECT_LE(split_step_time(got, rates), best + slack + 1e-9) << split_text(got);
    }
  }
}

TEST(BatchSplit, ShrinkKeepsOnePerRankAndSharesTheRestInProportion) {
  // 10 of 128: one each, then 8 shared 88:40 -> 5.5 / 2.5, the tie to the lower rank.
  EXPECT_EQ(shrink_split({88, 40}, 10), (std::vector<int64_t>{7, 3}));
  EXPECT_EQ(shrink_split({64, 64}, 128), (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(shrink_split({16, 112}, 2), (std::vector<int64_t>{1, 1}));
  for (int64_t total = 4; total <= 256; total += 3) {
    const std::vector<int64_t> sizes{16, 100, 60, 80};
    const std::vector<int64_t> got = shrink_split(sizes, total);
    ASSERT_EQ(split_total(got), total);
    for (size_t r = 0; r < got.size(); ++r) {
      EXPECT_GE(got[r], 1);
      const double share = 1 + static_cast<double>(total - 4) * static_cast<double>(sizes[r]) / 256;
      EXPECT_LT(std::abs(static_cast<double>(got[r]) - share), 1.0)
          << total << ": " << split_text(got);
    }
  }
  EXPECT_THROW(shrink_split({64, 64}, 1), Error);
}

TEST(BatchSplit, QueueHandsOutSplitsInPushOrderAfterTheEqualOnes) {
  SplitQueue q(equal_split(2, 8), 3);
  EXPECT_EQ(q.pushed(), 3);
  EXPECT_TRUE(q.has(2));
  EXPECT_FALSE(q.has(3));
  EXPECT_EQ(q.at(0), (std::vector<int64_t>{8, 8}));
  q.push({4, 12});
  q.push({12, 4});
  EXPECT_EQ(q.at(3), (std::vector<int64_t>{4, 12}));
  EXPECT_EQ(q.at(4), (std::vector<int64_t>{12, 4}));
  q.forget_before(4);
  EXPECT_THROW(q.at(3), Error);
  EXPECT_EQ(q.at(4), (std::vector<int64_t>{12, 4}));
  EXPECT_FALSE(q.has(5));
}

}  // namespace
}  // namespace ddpv
