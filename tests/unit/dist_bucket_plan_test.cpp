// BucketPlan: sizes, order, caps and the first bucket, on synthetic arenas.
#include <gtest/gtest.h>

#include <vector>

#include "ddpv/dist/bucket_plan.hpp"

namespace ddpv {
namespace {

constexpr int64_t kMiB = 1 << 20;

// An arena of tensors with the given sizes in bytes (multiples of 4), contiguous from 0.
std::vector<ArenaEntry> arena(const std::vector<int64_t>& bytes) {
  std::vector<ArenaEntry> out;
  int64_t offset = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    ArenaEntry e;
    e.name = std::to_string(i);
    e.count = bytes[i] / 4;
    e.extent = e.count;
    e.shape = Shape{e.count};
    e.offset = offset;
    offset += e.count;
    out.push_back(e);
  }
  return out;
}

std::vector<std::vector<int>> groups(const BucketPlan& plan) {
  std::vector<std::vector<int>> g;
  for (const Bucket& b : plan.buckets()) g.push_back(b.params);
  return g;
}

// Every bucket is the contiguous slice of its tensors, and the buckets tile the arena in order.
void expect_tiles(const BucketPlan& plan, const std::vector<ArenaEntry>& params) {
  int64_t offset = 0;
  int next_param = 0;
  for (int b = 0; b < plan.size(); ++b) {
    const Bucket& bk = plan.buckets()[static_cast<size_t>(b)];
    EXPECT_EQ(bk.offset, offset);
    int64_t count = 0;
    for (int p : bk.params) {
      EXPECT_EQ(p, next_param++);
      EXPECT_EQ(plan.bucket_of(p), b);
      count += params[static_cast<size_t>(p)].count;
    }
    EXPECT_EQ(bk.count, count);
    offset += count;
  }
  EXPECT_EQ(next_param, static_cast<int>(params.size()));
  EXPECT_EQ(plan.total_count(), offset);
}

TEST(BucketPlan, FirstBucketCappedAtOneMiBRestAtBucketMb) {
  // Sizes in MiB: 0.5 0.25 0.5 | 10 10 | 10 | 30 | 1 ; worked out by hand:
  // 0.5 + 0.25 = 0.75 fits 1 MiB, + 0.5 would not; 0.5 + 10 + 10 = 20.5 fits 25, + 10 would not;
  // 10 + 30 would not; 30 exceeds the cap and stands alone; 1 starts the last bucket.
  const auto params =
      arena({kMiB / 2, kMiB / 4, kMiB / 2, 10 * kMiB, 10 * kMiB, 10 * kMiB, 30 * kMiB, kMiB});
  BucketPlan plan(params, 25);
  const std::vector<std::vector<int>> want = {{0, 1}, {2, 3, 4}, {5}, {6}, {7}};
  EXPECT_EQ(groups(plan), want);
  expect_tiles(plan, params);
  EXPECT_LE(plan.buckets()[0].bytes(), BucketPlan::kFirstBucketBytes);
}

TEST(BucketPlan, ExactlyFullBucketIsClosed) {
  const auto params = arena({kMiB / 2, kMiB / 2, 2 * kMiB, 2 * kMiB, 4});
  BucketPlan plan(params, 4);
  const std::vector<std::vector<int>> want = {{0, 1}, {2, 3}, {4}};
  EXPECT_EQ(groups(plan), want);
  expect_tiles(plan, params);
}

TEST(BucketPlan, ZeroMeansOneBucketPerTensor) {
  const auto params = arena({4, 400, kMiB, 8, 3 * kMiB});
  BucketPlan plan(params, 0);
  ASSERT_EQ(plan.size(), 5);
  for (int b = 0; b < 5; ++b)
    EXPECT_EQ(plan.buckets()[static_cast<size_t>(b)].params, std::vector<int>{b});
  expect_tiles(plan, params);
}

TEST(BucketPlan, LargeFirstTensorGetsItsOwnFirstBucket) {
  const auto params = arena({3 * kMiB, 4, 4, 2 * kMiB});
  BucketPlan plan(params, 25);
  const std::vector<std::vector<int>> want = {{0}, {1, 2, 3}};
  EXPECT_EQ(groups(plan), want);
  expect_tiles(plan, params);
}

TEST(BucketPlan, SmallCapAlsoLimitsTheFirstBucket) {
  // bucket_mb below 1 MiB: the first bucket takes the smaller cap.
  const auto params = arena({kMiB / 4, kMiB / 4, kMiB / 4, kMiB / 4});
  BucketPlan plan(params, 0.5);
  const std::vector<std::vector<int>> want = {{0, 1}, {2, 3}};
  EXPECT_EQ(groups(plan), want);
}

TEST(BucketPlan, GreedyAndWithinCapsOnAManyTensorArena) {
  // resnet-like sizes: each bucket is within its cap unless it is one tensor, and the next
  // tensor would not have fitted (buckets are as full as the greedy walk allows).
  std::vector<int64_t> bytes;
  for (int i = 0; i < 60; ++i) bytes.push_back(4 * ((i % 7 == 0) ? 590000 : 2300 * (i % 5 + 1)));
  const auto params = arena(bytes);
  for (double mb : {0.0, 1.0, 2.5, 25.0}) {
    BucketPlan plan(params, mb);
    expect_tiles(plan, params);
    const auto cap = static_cast<int64_t>(mb * kMiB);
    for (int b = 0; b < plan.size(); ++b) {
      const Bucket& bk = plan.buckets()[static_cast<size_t>(b)];
      const int64_t limit = b == 0 ? std::min(cap, BucketPlan::kFirstBucketBytes) : cap;
      if (bk.params.size() > 1) {
        EXPECT_LE(bk.bytes(), limit) << "bucket " << b << " mb " << mb;
      }
      if (b + 1 < plan.size() && bk.bytes() < limit) {
        const int next = plan.buckets()[static_cast<size_t>(b + 1)].params.front();
        EXPECT_GT(bk.bytes() + bytes[static_cast<size_t>(next)], limit) << "bucket " << b;
      }
    }
  }
}

// Note [Aligned entries]: a tensor's padding belongs to its bucket, so the buckets still tile
// the arena and the cap counts the padding.
TEST(BucketPlan, PaddingGoesWithItsTensor) {
  std::vector<ArenaEntry> params = arena({40, 64, 8});
  const int64_t extents[] = {16, 16, 16};
  int64_t offset = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].offset = offset;
    params[i].extent = extents[i];
    offset += extents[i];
  }
  BucketPlan one(params, 25);
  ASSERT_EQ(one.size(), 1);
  EXPECT_EQ(one.buckets()[0].offset, 0);
  EXPECT_EQ(one.buckets()[0].count, 48);
  EXPECT_EQ(one.total_count(), 48);
  BucketPlan each(params, 0);
  ASSERT_EQ(each.size(), 3);
  for (int b = 0; b < 3; ++b) {
    EXPECT_EQ(each.buckets()[static_cast<size_t>(b)].offset, 16 * b);
    EXPECT_EQ(each.buckets()[static_cast<size_t>(b)].count, 16);
  }
  // 64 bytes of cap: the first tensor's 40 bytes and its padding fill it.
  BucketPlan capped(params, 64.0 / kMiB);
  EXPECT_EQ(capped.size(), 3);
}

TEST(BucketPlan, RejectsGapsAndBadSizes) {
  auto params = arena({400, 400});
  params[1].offset += 1;
  EXPECT_THROW(BucketPlan(params, 25), Error);
  params = arena({400, 400});
  params[0].extent = 99;  // less than its count
  EXPECT_THROW(BucketPlan(params, 25), Error);
  EXPECT_THROW(BucketPlan(arena({400}), -1), Error);
  BucketPlan plan(arena({400}), 25);
  EXPECT_THROW(plan.bucket_of(1), Error);
  EXPECT_NE(plan.summary().find("1 bucket"), std::string::npos);
}

}  // namespace
}  // namespace ddpv
