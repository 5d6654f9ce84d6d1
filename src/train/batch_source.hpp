// BatchSource: where the trainer's batches come from — the HDF5 store through the Loader, or
// synthetic data for benchmarks. Both hand out host batches of normalised float NHWC images.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "ddpv/data/loader.hpp"
#include "ddpv/train/options.hpp"

namespace ddpv {

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Starts `epoch`, skipping its first `start_step` batches (exact resume).
  virtual void start_epoch(int64_t epoch, int64_t start_step) = 0;
  virtual std::optional<Batch> next() = 0;  // nullopt at the end of the epoch
  // --balance: the split of the next batch to queue (Loader::push_split).
  virtual void push_split(std::vector<int64_t> sizes) = 0;
  virtual int64_t steps_per_epoch() const = 0;  // this rank's batches per epoch
  virtual int64_t samples_per_epoch() const = 0;  // all ranks' samples (the split's size)
};

// Whether training batches are slices of a global one (Note [Balanced batches]): --balance or
// --batch-split on more than one rank.
bool balanced(const TrainOptions& o, int world);

struct SourceShape {
  int64_t height = 0, width = 0, channels = 0, num_classes = 0;
};

// The model's natural input for synthetic data: 28x28x1 for lenet, 32x32x3 for the CIFAR
// ResNets, 224x224x3 and 1000 classes for the ImageNet ones.
SourceShape synthetic_shape(const std::string& model);

// Training batches from the store: shuffled, augmented (unless --no-augment), padded shards.
std::unique_ptr<BatchSource> make_train_source(const ImageStore& store, const TrainOptions& o,
                                               int rank, int world, Allocator* staging);
// --val-split resolved against the store: "auto" gives val, else test, whichever the store
// has ("" when it has neither: no evaluation); "" and "none" give ""; another name is
// returned when the store has that split, and refused with a message naming the splits it
// has otherwise.
std::string resolve_val_split(const ImageStore& store, const std::string& asked);
// Evaluation batches: every sample of the split exactly once across ranks, no augmentation.
std::unique_ptr<BatchSource> make_eval_source(const ImageStore& store, const std::string& split,
                                              const TrainOptions& o, int rank, int world,
                                              Allocator* staging);
// Random normal images and uniform labels, drawn once from (seed, rank) into a few batches
// that are then served round-robin, so benchmarks measure training, not data.
std::unique_ptr<BatchSource> make_synthetic_source(const SourceShape& shape, const TrainOptions& o,
                                                   int rank, int world, Allocator* staging);

}  // namespace ddpv
