// Note [Rank times]: the spread of the ranks' busy times, worked out by hand.
#include <vector>

#include "ddpv/train/trainer.hpp"
#include "support/test_support.hpp"

namespace ddpv {
namespace {

std::vector<RankTimes> busy(const std::vector<double>& seconds) {
  std::vector<RankTimes> ranks;
  for (double s : seconds) ranks.push_back({s, 1.0, 0.5});  // the waits play no part
  return ranks;
}

TEST(RankSpread, FourRanksOneStraggler) {
  // Sorted 4, 5, 6, 9: median (5 + 6) / 2 = 5.5; the others' (4, 5, 6) median 5, and rank 2's
  // 9 is (9 - 5) / 5 = 80% above it.
  const RankSpread r = rank_spread(busy({5, 4, 9, 6}));
  EXPECT_DOUBLE_EQ(r.min_s, 4);
  EXPECT_DOUBLE_EQ(r.max_s, 9);
  EXPECT_DOUBLE_EQ(r.median_s, 5.5);
  EXPECT_EQ(r.busiest, 2);
  EXPECT_DOUBLE_EQ(r.above_others, 0.8);
}

TEST(RankSpread, TwoRanksCompareWithTheOther) {
  // The median of both is 1.5; the busier, 2, is 100% above the other's 1.
  const RankSpread r = rank_spread(busy({2, 1}));
  EXPECT_DOUBLE_EQ(r.median_s, 1.5);
  EXPECT_EQ(r.busiest, 0);
  EXPECT_DOUBLE_EQ(r.above_others, 1.0);
}

TEST(RankSpread, OddCountTiesAndEdges) {
  // 3, 3, 1: median 3; the busiest is the lowest rank with the most (0); the others (3, 1)
  // have median 2, so 50% above.
  const RankSpread r = rank_spread(busy({3, 3, 1}));
  EXPECT_DOUBLE_EQ(r.median_s, 3);
  EXPECT_EQ(r.busiest, 0);
  EXPECT_DOUBLE_EQ(r.above_others, 0.5);
  // Equal ranks: nobody above anybody.
  EXPECT_DOUBLE_EQ(rank_spread(busy({2, 2, 2, 2})).above_others, 0.0);
  // One rank: no others to compare with.
  const RankSpread one = rank_spread(busy({7}));
  EXPECT_EQ(one.busiest, 0);
  EXPECT_DOUBLE_EQ(one.median_s, 7);
  EXPECT_DOUBLE_EQ(one.above_others, 0.0);
  // Others that did nothing: no share to give (not a division by zero).
  EXPECT_DOUBLE_EQ(rank_spread(busy({0, 0, 3})).above_others, 0.0);
  // No ranks at all (the CUDA backend's summary): all zero.
  const RankSpread none = rank_spread({});
  EXPECT_EQ(none.busiest, 0);
  EXPECT_DOUBLE_EQ(none.max_s, 0.0);
}

TEST(Straggler, ATenthAboveTheOthersOverFiftySteps) {
  // 11 against others of 10: exactly 10% above, at the bound; 10.9: 9%, below it.
  const RankSpread at = rank_spread(busy({10, 11, 10, 10}));
  ASSERT_DOUBLE_EQ(at.above_others, 0.1);
  EXPECT_TRUE(is_straggler(at, 50));
  EXPECT_TRUE(is_straggler(at, 1000));
  // Fewer than 50 steps: start-up may be what made it busiest.
  EXPECT_FALSE(is_straggler(at, 49));
  EXPECT_FALSE(is_straggler(rank_spread(busy({10, 10.9, 10, 10})), 1000));
  // Equal ranks, or one rank: nobody to hold back.
  EXPECT_FALSE(is_straggler(rank_spread(busy({3, 3})), 1000));
  EXPECT_FALSE(is_straggler(rank_spread(busy({30})), 1000));
}

}  // namespace
}  // namespace ddpv
