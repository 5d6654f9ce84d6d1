// BatchBalancer (Note [Balanced batches]): the split follows the pooled speeds, averaged over
// windows, and moves only for a clear gain.
#include <gtest/gtest.h>

#include "ddpv/core/error.hpp"
#include "train/balancer.hpp"

namespace ddpv {
namespace {

using Split = std::vector<int64_t>;

// Busy seconds for 320 samples a rank at these speeds.
std::vector<double> busy(const std::vector<double>& rates) {
  std::vector<double> s;
  for (double r : rates) s.push_back(320 / r);
  return s;
}

TEST(BatchBalancer, EvenRanksKeepTheEvenSplit) {
  BatchBalancer b(2, 64, {});
  EXPECT_EQ(b.sizes(), (Split{64, 64}));
  // 640 samples in 1.00 and 1.02 s: 2% apart, and the nearest other split (quanta of 4: 68/60)
  // is worse: 68 / 640 = 0.106 s against 64 / 627.5 = 0.102.
  EXPECT_FALSE(b.decide({1.00, 1.02}, {640, 640}));
  EXPECT_EQ(b.sizes(), (Split{64, 64}));
  EXPECT_EQ(b.changes(), 0);
}

TEST(BatchBalancer, MovesForTwelvePercentButNotForTen) {
  // Rank 0 12% faster (640 and 571.4 samples a second): 68/60 takes max(68 / 640, 60 / 571.4)
  // = 0.1063 s against 64 / 571.4 = 0.1120, 5.1% shorter; the second window in a row that
  // calls for it moves the split. 10% faster (640 and 581.8): the same split takes 0.1063 s
  // against 0.1100, 3.4%: not enough, however long it lasts.
  BatchBalancer fast(2, 64, {});
  EXPECT_FALSE(fast.decide({1.0, 1.12}, {640, 640}));
  EXPECT_EQ(fast.sizes(), (Split{64, 64}));
  EXPECT_TRUE(fast.decide({1.0, 1.12}, {640, 640}));
  EXPECT_EQ(fast.sizes(), (Split{68, 60}));
  BatchBalancer slight(2, 64, {});
  for (int k = 0; k < 3; ++k) EXPECT_FALSE(slight.decide({1.0, 1.10}, {640, 640}));
  EXPECT_EQ(slight.sizes(), (Split{64, 64}));
}

TEST(BatchBalancer, OneSlowWindowDoesNotMoveTheSplit) {
  BatchBalancer b(2, 64, {});
  // Rank 1 30% slower for one window (640 and 492.3): it proposes 72/56 (shares 72.3 / 55.7).
  EXPECT_FALSE(b.decide({1.0, 1.3}, {640, 640}));
  // Then even windows: the averaged rates 640 and 566.2 would still gain 6% from 68/60, but
  // by the window's own speeds 68/60 is slower than 64/64; then 640 and 603.1, where the best split
  // is the even one.
  EXPECT_FALSE(b.decide({1.0, 1.0}, {640, 640}));
  EXPECT_FALSE(b.decide({1.0, 1.0}, {640, 640}));
  EXPECT_EQ(b.sizes(), (Split{64, 64}));
  EXPECT_EQ(b.changes(), 0);
}

TEST(BatchBalancer, MovesTowardsTheFasterRankAndAveragesWindows) {
  BatchBalancer b(2, 64, {});
  // Rank 0 twice as fast: shares 85.3 / 42.7, in quanta of 4 (21.33 / 10.67): the floors 21 /
  // 10 and the spare quantum to rank 1's larger remainder, 84 / 44. The step goes from 64 / 320
  // = 0.2 s to max(84 / 640, 44 / 320) = 0.1375 s, once a second window agrees.
  EXPECT_FALSE(b.decide({1.0, 2.0}, {640, 640}));
  EXPECT_TRUE(b.decide({1.0, 2.0}, {640, 640}));
  EXPECT_EQ(b.sizes(), (Split{84, 44}));
  EXPECT_DOUBLE_EQ(b.rates()[0], 640.0);
  EXPECT_DOUBLE_EQ(b.rates()[1], 320.0);
  // The same speeds again: nothing to gain.
  EXPECT_FALSE(b.decide({840.0 / 640, 440.0 / 320}, {840, 440}));
  // Then windows of equal speeds (640 and 640). Averaged, rank 1's rate goes 480, 560, 600.
  // 480: 73.1 / 54.9 samples, quanta 18.29 / 13.71, so 72 / 56, 11% shorter than 84/44 by the
  // averaged speeds and by the window's own, but by the window before's (640 and 320) it takes
  // 56 / 320 = 0.175 s against 44 / 320 = 0.1375: it waits. 560: 68.27 / 59.73, quanta 17.07
  // / 14.93, so 68 / 60 (the spare quantum to rank 1's larger remainder), max(68 / 640, 60 /
  // 560) = 0.1071 s against 84 / 640 = 0.1313, and 0.1063 against 0.1313 by both windows'
  // own: it moves. 600: 66.06 / 61.94, quanta 16.52 / 15.48, so 68 / 60 (the spare to rank
  // 0): the split it has.
  EXPECT_FALSE(b.decide({1.0, 1.0}, {640, 640}));
  EXPECT_DOUBLE_EQ(b.rates()[1], 480.0);
  EXPECT_TRUE(b.decide({1.0, 1.0}, {640, 640}));
  EXPECT_DOUBLE_EQ(b.rates()[1], 560.0);
  EXPECT_EQ(b.sizes(), (Split{68, 60}));
  EXPECT_FALSE(b.decide({1.0, 1.0}, {640, 640}));
  EXPECT_DOUBLE_EQ(b.rates()[1], 600.0);
  EXPECT_EQ(b.sizes(), (Split{68, 60}));
  EXPECT_EQ(b.changes(), 2);
}

TEST(BatchBalancer, MovesFromASlowRankWhileTheOthersWander) {
  // Four ranks on two cores: rank 3 at 1000 samples a second in both windows, ranks 0 and 1
  // trading 3200 and 4800 between them. The two windows' proposals differ (the averaged
  // speeds are 4000 / 4000 / 3200 / 1000 at the second), yet by the speeds of either the
  // second is far shorter than the even split: it moves, and rank 3 gets less than its 32.
  const SplitBounds q = split_bounds(32, 4);
  const std::vector<double> first{3200, 4800, 3200, 1000}, second{4800, 3200, 3200, 1000};
  const Split proposed = balanced_split({4000, 4000, 3200, 1000}, 128, q.quantum, q.lo, q.hi);
  ASSERT_NE(balanced_split(first, 128, q.quantum, q.lo, q.hi), proposed);
  BatchBalancer b(4, 32, {});
  EXPECT_FALSE(b.decide(busy(first), {320, 320, 320, 320}));
  EXPECT_TRUE(b.decide(busy(second), {320, 320, 320, 320}));
  EXPECT_EQ(b.sizes(), proposed);
  EXPECT_LT(b.sizes()[3], 32);
}

TEST(BatchBalancer, AfterAChangeTwoWindowsOfTheNewSplit) {
  // Rank 3 turns slow after an even window and stays at 1000 samples a second. The averaged
  // speeds lag behind it (2500, 1750, 1375, 1187.5): the move after the second slow window
  // gives it too much, and the windows after it show that at once. Still the next move waits
  // for a second window measured under the new split.
  const std::vector<double> even{4000, 4000, 4000, 4000}, slow{4000, 4000, 4000, 1000};
  const std::vector<double> samples{320, 320, 320, 320};
  BatchBalancer b(4, 32, {});
  EXPECT_FALSE(b.decide(busy(even), samples));
  EXPECT_FALSE(b.decide(busy(slow), samples));  // the window before was even
  EXPECT_TRUE(b.decide(busy(slow), samples));
  const Split first = b.sizes();
  EXPECT_LT(first[3], 32);
  EXPECT_FALSE(b.decide(busy(slow), samples));  // the first window of the new split
  EXPECT_EQ(b.sizes(), first);
  EXPECT_TRUE(b.decide(busy(slow), samples));
  EXPECT_LT(b.sizes()[3], first[3]);
  EXPECT_EQ(b.changes(), 2);
}

TEST(BatchBalancer, AWindowWithoutWorkChangesNothing) {
  BatchBalancer b(2, 64, {96, 32});
  EXPECT_EQ(b.sizes(), (Split{96, 32}));
  EXPECT_FALSE(b.decide({0.0, 1.0}, {0, 320}));
  EXPECT_TRUE(b.rates().empty());
  EXPECT_EQ(b.sizes(), (Split{96, 32}));
}

TEST(BatchBalancer, AFirstSplitMustFitTheWorld) {
  EXPECT_THROW(BatchBalancer(2, 64, {100, 20}), Error);
  EXPECT_THROW(BatchBalancer(3, 64, {64, 128}), Error);
  EXPECT_THROW(BatchBalancer(2, 64, {128, 0}), Error);
}

}  // namespace
}  // namespace ddpv
