// Loader: a background thread that turns this rank's share of a split into ready float batches.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ddpv/core/tensor.hpp"
#include "ddpv/data/augment.hpp"
#include "ddpv/data/batch_split.hpp"
#include "ddpv/data/image_store.hpp"
#include "ddpv/data/sampler.hpp"

namespace ddpv {

struct LoaderOptions {
  std::string split = "train";
  int64_t batch_size = 64;  // per rank
  int rank = 0;
  int world_size = 1;
  bool shuffle = true;
  bool drop_last = false;  // of the sampler (PyTorch's DistributedSampler drop_last)
  // Each epoch's last step is dropped when it is short (PyTorch's DataLoader drop_last), so
  // every step trains on the full global batch; not with `unpadded`.
  bool drop_last_batch = false;
  // Evaluation: every sample exactly once across ranks, no padding (shard_unpadded()); ranks may
  // then differ by one sample and the last batches may differ in size.
  bool unpadded = false;
  // Note [Balanced batches]: each step's batch is a slice of the global one, its size queued
  // by push_split(); batch_size is then the per-rank mean, and slots hold split_bounds().hi
  // (or more, for a larger first split). first_split: the split until the first push takes
  // over (empty: batch_size each).
  bool balanced = false;
  std::vector<int64_t> first_split;
  uint64_t seed = 0;
  bool augment = true;  // crop + flip; off for evaluation
  AugmentOptions augment_options;
  int prefetch = 4;        // ready batches queued ahead of the consumer
  // Raw splits: the split is held in memory when its images fit under this. Encoded splits:
  // the bytes this rank reads are kept, up to this and to about its shard of the split
  // (Note [Encoded cache]).
  double cache_mb = 2048;
  // Threads preparing a batch, the loader's own included (Note [Decode pool]).
  int threads = 1;
  // Encoded splits: the output size (0: the store's height and width) and the transforms:
  // RandomResizedCrop + flip with augment, else resize + centre crop (Note [Resized crop]).
  int crop_h = 0, crop_w = 0;
  ResizedCropOptions crop_options;
  // Memory of the delivered batches (e.g. the backend's pinned staging_allocator(), so a GPU
  // trainer can copy asynchronously); host memory when null. Must outlive the Loader.
  Allocator* allocator = nullptr;
};

// One ready batch. Its memory is lent from the Loader's pool and goes back when the last copy
// of this Batch is destroyed, so keep it alive until an asynchronous copy out of it is done.
// The pool has prefetch + 2 slots: a consumer holding all of them would wait forever in next().
struct Batch {
  Tensor images;  // (B, H, W, C) float32, normalised
  Tensor labels;  // (B) int32
  int64_t size = 0;
  int64_t epoch = 0;
  int64_t step = 0;  // index of this batch within its epoch
  int64_t global = 0;  // all ranks' samples in this step (Note [Balanced batches])
  std::shared_ptr<void> lease;
};

// Note [Loader thread]: start_epoch() hands the thread an epoch; it reads each batch's rows
// (from the in-memory cache or with one HDF5 read; it is the only thread that calls HDF5:
// Debian's libhdf5 is built thread-safe, but that is one global lock, so more readers would
// only queue), decodes and augments on the decode pool, and normalises into a free slot
// of a fixed pool (prefetch + 2 slots, allocated once: pinned allocations are slow), and queues
// it. next() pops in order; at the end of the epoch it returns nullopt. An exception in the
// thread is rethrown by next(). The store must outlive the Loader.
class Loader {
 public:
  Loader(const ImageStore& store, LoaderOptions options);
  ~Loader();  // stops and joins the thread
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Starts producing `epoch`, skipping its first `start_step` batches (exact resume). Any batch
  // of a previous epoch not yet consumed is dropped.
  void start_epoch(int64_t epoch, int64_t start_step = 0);
  std::optional<Batch> next();
  // --balance: the split of the batch after the ones already queued, counting batches in the
  // order next() returns them across epochs (Note [Balanced batches]); prefetch + 2 copies of
  // the first split are queued at the start, and the trainer pushes one for each batch it takes.
  void push_split(std::vector<int64_t> sizes);

  int64_t samples_per_epoch() const;  // this rank's samples
  int64_t steps_per_epoch() const;    // this rank's batches (the last may be short)
  bool cached() const;                // whether the split is served from memory
  const LoaderOptions& options() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace ddpv
