// DistributedSampler against a literal transcription of PyTorch's DistributedSampler rules.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "ddpv/data/sampler.hpp"
#include "support/test_support.hpp"

namespace ddpv {
namespace {

// torch/utils/data/distributed.py, __iter__, over a given epoch order.
std::vector<int64_t> pytorch_indices(std::vector<int64_t> indices, int64_t n, int w, int r,
                                     bool drop_last) {
  int64_t num_samples;
  if (drop_last && n % w != 0)
    num_samples = static_cast<int64_t>(std::ceil((n - w) / static_cast<double>(w)));
  else
    num_samples = static_cast<int64_t>(std::ceil(n / static_cast<double>(w)));
  const int64_t total = num_samples * w;
  if (!drop_last) {
    const int64_t padding = total - static_cast<int64_t>(indices.size());
    if (padding <= static_cast<int64_t>(indices.size())) {
      indices.insert(indices.end(), indices.begin(), indices.begin() + padding);
    } else {
      const int64_t reps = (padding + n - 1) / n;
      std::vector<int64_t> rep;
      for (int64_t k = 0; k < reps; ++k) rep.insert(rep.end(), indices.begin(), indices.end());
      indices.insert(indices.end(), rep.begin(), rep.begin() + padding);
    }
  } else {
    indices.resize(static_cast<size_t>(total));
  }
  std::vector<int64_t> out;
  for (int64_t p = r; p < total; p += w) out.push_back(indices[static_cast<size_t>(p)]);
  return out;
}

TEST(DataSampler, EpochOrderIsAPermutationFixedBySeedAndEpoch) {
  const auto a = DistributedSampler::epoch_order(1000, true, 7, 3);
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota);
  EXPECT_NE(a, iota);
  EXPECT_EQ(a, DistributedSampler::epoch_order(1000, true, 7, 3));
  EXPECT_NE(a, DistributedSampler::epoch_order(1000, true, 7, 4));
  EXPECT_NE(a, DistributedSampler::epoch_order(1000, true, 8, 3));
  EXPECT_EQ(DistributedSampler::epoch_order(1000, false, 7, 3), iota);
}

TEST(DataSampler, MatchesPyTorchRulesAndShardsCoverTheSplit) {
  for (int64_t n : {1, 2, 5, 17, 64, 101}) {
    for (int w = 1; w <= 8; ++w) {
      for (bool drop_last : {false, true}) {
        if (drop_last && n < w) continue;  // PyTorch gives no samples then; we refuse
        for (bool shuffle : {false, true}) {
          const auto order = DistributedSampler::epoch_order(n, shuffle, 11, 2);
          std::vector<int64_t> all;
          std::set<int64_t> seen;
          for (int r = 0; r < w; ++r) {
            DistributedSampler s(n, w, r, shuffle, 11, drop_last);
            s.set_epoch(2);
            const auto idx = s.indices();
            ASSERT_EQ(idx, pytorch_indices(order, n, w, r, drop_last))
                << "n=" << n << " w=" << w << " r=" << r << " drop_last=" << drop_last;
            ASSERT_EQ(static_cast<int64_t>(idx.size()), s.num_samples());
            all.insert(all.end(), idx.begin(), idx.end());
            seen.insert(idx.begin(), idx.end());
          }
          EXPECT_EQ(static_cast<int64_t>(all.size()),
                    DistributedSampler(n, w, 0, shuffle, 11, drop_last).total_size());
          if (!drop_last) {
            EXPECT_EQ(static_cast<int64_t>(seen.size()), n) << "every sample covered";
            EXPECT_LT(static_cast<int64_t>(all.size()) - n, w) << "padding below the world size";
          } else {
            EXPECT_EQ(seen.size(), all.size()) << "drop_last shards are disjoint";
            EXPECT_GT(static_cast<int64_t>(all.size()) + w, n);
          }
          if (n % w == 0) {
            EXPECT_EQ(seen.size(), all.size()) << "no padding needed: disjoint";
          }
        }
      }
    }
  }
}

TEST(DataSampler, UnpaddedShardsHoldEverySampleExactlyOnce) {
  for (int64_t n : {1, 7, 100, 103}) {
    for (int w = 1; w <= 8; ++w) {
      std::vector<int64_t> all;
      for (int r = 0; r < w; ++r) {
        DistributedSampler s(n, w, r, true, 3);
        s.set_epoch(1);
        const auto idx = s.shard_unpadded();
        EXPECT_LE(static_cast<int64_t>(idx.size()), (n + w - 1) / w);
        EXPECT_GE(static_cast<int64_t>(idx.size()), n / w);
        all.insert(all.end(), idx.begin(), idx.end());
      }
      std::sort(all.begin(), all.end());
      std::vector<int64_t> iota(static_cast<size_t>(n));
      std::iota(iota.begin(), iota.end(), 0);
      EXPECT_EQ(all, iota) << "n=" << n << " w=" << w;
    }
  }
}

TEST(DataSampler, RejectsBadArguments) {
  EXPECT_THROW(DistributedSampler(10, 0, 0), Error);
  EXPECT_THROW(DistributedSampler(10, 2, 2), Error);
  EXPECT_THROW(DistributedSampler(0, 1, 0), Error);
  EXPECT_THROW(DistributedSampler(3, 4, 0, true, 0, true), Error);
}

}  // namespace
}  // namespace ddpv
