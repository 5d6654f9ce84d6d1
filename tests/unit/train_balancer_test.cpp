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
  // 640 samples in 1.00 and 1.02 s: 2% apart, and the nearest other split (quanta of 8) is worse.
  EXPECT_FALSE(b.decide({1.00, 1.02}, {640, 640}));
  EXPECT_EQ(b.sizes(), (Split{64, 64}));
  EXPECT_EQ(b.changes(), 0);
}

TEST(BatchBalancer, MovesTowardsTheFasterRankAndAveragesWindows) {
  BatchBalancer b(2, 64, {});
  // Rank 0 twice as fast: shares 85.3 / 42.7, in quanta of 8 (10.67 / 5.33): 88 / 40. The step
  // goes from 64 / 1 to 88 / 2 = 44 time units.
  EXPECT_TRUE(b.decide({1.0, 2.0}, {640, 640}));
  EXPECT_EQ(b.sizes(), (Split{88, 40}));
  EXPECT_DOUBLE_EQ(b.rates()[0], 640.0);
  EXPECT_DOUBLE_EQ(b.rates()[1], 320.0);
  // The same speeds again: nothing to gain.
  EXPECT_FALSE(b.decide({880.0 / 640, 400.0 / 320}, {880, 400}));
  // Then a window of equal speeds (640 and 640): the average, 640 and 480, gives 73.1 / 54.9,
  // in quanta 9.14 / 6.86: 72 / 56 (the spare quantum to rank 1's larger remainder). Its step,
  // max(72 / 640, 56 / 480) = 0.1167 s, against 88 / 640 = 0.1375 s: 15% shorter.
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
