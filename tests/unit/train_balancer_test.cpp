// BatchBalancer (Note [Balanced batches]): the split follows the pooled speeds, averaged over
// windows, and moves only for a clear gain.
#include <gtest/gtest.h>

#include "ddpv/core/error.hpp"
#include "train/balancer.hpp"

namespace ddpv {
namespace {

using Split = std::vector<int64_t>;

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
  // = 0.1063 s against 64 / 571.4 = 0.1120, 5.1% shorter. 10% faster (640 and 581.8): the same
  // split takes 0.1063 s against 0.1100, 3.4%: not enough.
  BatchBalancer fast(2, 64, {});
  EXPECT_TRUE(fast.decide({1.0, 1.12}, {640, 640}));
  EXPECT_EQ(fast.sizes(), (Split{68, 60}));
  BatchBalancer slight(2, 64, {});
  EXPECT_FALSE(slight.decide({1.0, 1.10}, {640, 640}));
  EXPECT_EQ(slight.sizes(), (Split{64, 64}));
}

TEST(BatchBalancer, MovesTowardsTheFasterRankAndAveragesWindows) {
  BatchBalancer b(2, 64, {});
  // Rank 0 twice as fast: shares 85.3 / 42.7, in quanta of 4 (21.33 / 10.67): the floors 21 /
  // 10 and the spare quantum to rank 1's larger remainder, 84 / 44. The step goes from 64 / 320
  // = 0.2 s to max(84 / 640, 44 / 320) = 0.1375 s.
  EXPECT_TRUE(b.decide({1.0, 2.0}, {640, 640}));
  EXPECT_EQ(b.sizes(), (Split{84, 44}));
  EXPECT_DOUBLE_EQ(b.rates()[0], 640.0);
  EXPECT_DOUBLE_EQ(b.rates()[1], 320.0);
  // The same speeds again: nothing to gain.
  EXPECT_FALSE(b.decide({840.0 / 640, 440.0 / 320}, {840, 440}));
  // Then a window of equal speeds (640 and 640): the average, 640 and 480, gives 73.1 / 54.9,
  // in quanta 18.29 / 13.71: 72 / 56 (the spare quantum to rank 1's larger remainder). Its
  // step, max(72 / 640, 56 / 480) = 0.1167 s, against 84 / 640 = 0.1313 s: 11% shorter.
  EXPECT_TRUE(b.decide({1.0, 1.0}, {640, 640}));
  EXPECT_DOUBLE_EQ(b.rates()[1], 480.0);
  EXPECT_EQ(b.sizes(), (Split{72, 56}));
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
