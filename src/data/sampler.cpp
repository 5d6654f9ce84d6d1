// DistributedSampler: PyTorch's sharding rule over a deterministic per-epoch permutation.
#include "ddpv/data/sampler.hpp"

#include <numeric>
#include <utility>

#include "ddpv/core/error.hpp"
#include "ddpv/core/rng.hpp"

namespace ddpv {

DistributedSampler::DistributedSampler(int64_t dataset_size, int world_size, int rank, bool shuffle,
                                       uint64_t seed, bool drop_last)
    : n_(dataset_size),
      world_(world_size),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  DDPV_CHECK(world_size > 0, "world size must be positive, got ", world_size);
  DDPV_CHECK(rank >= 0 && rank < world_size, "rank ", rank, " outside [0, ", world_size, ")");
  DDPV_CHECK(dataset_size > 0, "the split is empty: nothing to sample");
  // PyTorch: drop_last with a remainder gives floor(N / W), otherwise ceil(N / W).
  if (drop_last_ && n_ % world_ != 0)
    num_samples_ = n_ / world_;
  else
    num_samples_ = (n_ + world_ - 1) / world_;
  DDPV_CHECK(num_samples_ > 0, "drop_last with ", n_, " samples and ", world_,
             " ranks leaves no sample per rank");
}

std::vector<int64_t> DistributedSampler::epoch_order(int64_t n, bool shuffle, uint64_t seed,
                                                     int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!shuffle) return order;
  Rng rng(derive_key(seed, static_cast<uint64_t>(epoch)));
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(i + 1 <= int64_t{0xffffffff}
                                               ? rng.uniform_int(static_cast<uint32_t>(i + 1))
                                               : rng.next_u64() % static_cast<uint64_t>(i + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

std::vector<int64_t> DistributedSampler::indices() const {
  const std::vector<int64_t> all = padded_order();
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(num_samples_));
  for (size_t p = static_cast<size_t>(rank_); p < all.size(); p += static_cast<size_t>(world_))
    out.push_back(all[p]);
  return out;
}

std::vector<int64_t> DistributedSampler::padded_order() const {
  const std::vector<int64_t> order = epoch_order(n_, shuffle_, seed_, epoch_);
  const int64_t total = total_size();
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(total));
  // Position p of the padded (or cut) list is order[p % N]: padding repeats from the start, and
  // repeats the whole list again when the padding is longer than N (PyTorch does the same).
  for (int64_t p = 0; p < total; ++p) out.push_back(order[static_cast<size_t>(p % n_)]);
  return out;
}

std::vector<int64_t> DistributedSampler::shard_unpadded() const {
  const std::vector<int64_t> order = epoch_order(n_, shuffle_, seed_, epoch_);
  std::vector<int64_t> out;
  for (int64_t p = rank_; p < n_; p += world_) out.push_back(order[static_cast<size_t>(p)]);
  return out;
}

}  // namespace ddpv
