// DistributedSampler: which sample indices each rank reads in an epoch (PyTorch semantics).
#pragma once

#include <cstdint>
#include <vector>

namespace ddpv {

// Note [Sampler semantics]: as torch.utils.data.DistributedSampler. With shuffle the epoch's
// order is a permutation of [0, N) fixed by (seed, epoch) alone (Fisher-Yates driven by
// Rng(derive_key(seed, epoch)), not PyTorch's generator, so orders differ from PyTorch but the
// rules match). Without drop_last the list is padded to a multiple of the world size by
// repeating its start; with drop_last its tail is cut instead. Rank r takes positions r, r+W,
// r+2W, ... so every rank gets num_samples() indices and the same number of batches: no rank
// ever waits in a collective that the others skip. The order depends on (seed, epoch) only, so
// the position (epoch, batches consumed) saved in a checkpoint resumes exactly: see
// Loader::start_epoch(epoch, start_step).
class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int world_size, int rank, bool shuffle = true,
                     uint64_t seed = 0, bool drop_last = false);

  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  int64_t dataset_size() const { return n_; }
  int world_size() const { return world_; }
  int rank() const { return rank_; }
  int64_t num_samples() const { return num_samples_; }  // per rank
  int64_t total_size() const { return num_samples_ * world_; }

  // This rank's indices for the current epoch, num_samples() of them.
  std::vector<int64_t> indices() const;
  // This rank's share of the epoch order without padding or dropping (positions r, r+W, ...
  // < N): across ranks every sample appears exactly once, as evaluation needs. Ranks may
  // differ in length by one.
  std::vector<int64_t> shard_unpadded() const;

  // The whole padded (or cut) list, total_size() positions, of which indices() takes every
  // world_size-th: --balance slices each step's global batch out of it instead.
  std::vector<int64_t> padded_order() const;
  // The epoch order before sharding: a permutation of [0, n) (identity without shuffle).
  static std::vector<int64_t> epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch);

 private:
  int64_t n_;
  int world_;
  int rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t epoch_ = 0;
  int64_t num_samples_;
};

}  // namespace ddpv
