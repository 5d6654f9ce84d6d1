// The trainer's batch sources: the Loader over the store, and synthetic data.
#include "train/batch_source.hpp"

#include <algorithm>
#include <vector>

#include "ddpv/core/error.hpp"
#include "ddpv/core/log.hpp"
#include "ddpv/core/rng.hpp"
#include "ddpv/data/batch_split.hpp"

namespace ddpv {
namespace {

class LoaderSource final : public BatchSource {
 public:
  LoaderSource(const ImageStore& store, LoaderOptions lo, int64_t split_size)
      : loader_(store, std::move(lo)), split_size_(split_size) {}
  void start_epoch(int64_t epoch, int64_t start_step) override {
    loader_.start_epoch(epoch, start_step);
  }
  std::optional<Batch> next() override { return loader_.next(); }
  void push_split(std::vector<int64_t> sizes) override { loader_.push_split(std::move(sizes)); }
  int64_t steps_per_epoch() const override { return loader_.steps_per_epoch(); }
  int64_t samples_per_epoch() const override { return split_size_; }

 private:
  Loader loader_;
  int64_t split_size_;
};

LoaderOptions base_options(const ImageStore& store, const TrainOptions& o, int rank, int world,
                           Allocator* staging) {
  LoaderOptions lo;
  lo.batch_size = o.batch_size;
  lo.rank = rank;
  lo.world_size = world;
  lo.seed = o.seed;
  lo.cache_mb = o.cache_mb;
  lo.threads = std::max(1, o.loader_threads);
  lo.crop_h = lo.crop_w = o.crop;
  lo.allocator = staging;
  // Small images (28x28) lose too much to a 4-pixel shift; 1/8 of the side, as 4 is of 32.
  lo.augment_options.pad = std::max(1, std::min(store.height(), store.width()) / 8);
  return lo;
}

class SyntheticSource final : public BatchSource {
 public:
  SyntheticSource(const SourceShape& s, const TrainOptions& o, int rank, int world,
                  Allocator* staging)
      : batch_(o.batch_size), rank_(rank), world_(world), shape_(s) {
    const int64_t global = batch_ * world;
    steps_ = std::max<int64_t>(1, (o.synthetic_size + global - 1) / global);
    samples_ = o.synthetic_size;
    int64_t slot_batch = batch_;
    if (balanced(o, world)) {  // Note [Balanced batches]
      const std::vector<int64_t> first =
          first_split(parse_batch_split(o.batch_split), world, batch_);
      splits_.emplace(first, kLookahead);
      slot_batch = split_capacity(first, world, batch_);
    }
    const Shape image{slot_batch, s.height, s.width, s.channels};
    for (int k = 0; k < kPool; ++k) {
      Batch b;
      b.images = Tensor::empty(image, DType::kF32, staging);
      b.labels = Tensor::empty(Shape{slot_batch}, DType::kI32, staging);
      b.size = slot_batch;
      Rng rng(derive_key(o.seed, 0x5e7, static_cast<uint64_t>(rank), static_cast<uint64_t>(k)));
      float* x = b.images.data<float>();
      for (int64_t i = 0; i < image.numel(); ++i) x[i] = rng.normal();
      int32_t* y = b.labels.data<int32_t>();
      for (int64_t i = 0; i < slot_batch; ++i)
        y[i] = static_cast<int32_t>(rng.uniform_int(static_cast<uint32_t>(s.num_classes)));
      pool_.push_back(std::move(b));
    }
  }
  void start_epoch(int64_t epoch, int64_t start_step) override {
    epoch_ = epoch;
    step_ = start_step;
  }
  std::optional<Batch> next() override {
    if (step_ >= steps_) return std::nullopt;
    Batch b = pool_[static_cast<size_t>(step_ % kPool)];
    int64_t n = batch_;
    if (splits_) {
      n = splits_->at(consumed_)[static_cast<size_t>(rank_)];
      splits_->forget_before(++consumed_);
    }
    b.images = Tensor::wrap(b.images.raw(), Shape{n, shape_.height, shape_.width, shape_.channels},
                            DType::kF32, b.images.device());
    b.labels = Tensor::wrap(b.labels.raw(), Shape{n}, DType::kI32, b.labels.device());
    b.size = n;
    b.global = batch_ * world_;
    b.epoch = epoch_;
    b.step = step_++;
    return b;
  }
  void push_split(std::vector<int64_t> sizes) override {
    DDPV_CHECK(splits_.has_value(), "push_split without --balance (internal)");
    splits_->push(std::move(sizes));
  }
  int64_t steps_per_epoch() const override { return steps_; }
  int64_t samples_per_epoch() const override { return samples_; }

 private:
  static constexpr int kPool = 2;
  static constexpr int kLookahead = 2;  // the trainer's pushes run this far ahead
  int64_t batch_;
  int rank_, world_;
  SourceShape shape_;
  int64_t steps_ = 1, samples_ = 0, epoch_ = 0, step_ = 0, consumed_ = 0;
  std::vector<Batch> pool_;
  std::optional<SplitQueue> splits_;
};

}  // namespace

bool balanced(const TrainOptions& o, int world) {
  return world > 1 && (o.balance || !o.batch_split.empty());
}

SourceShape synthetic_shape(const std::string& model) {
  if (model == "lenet") return {28, 28, 1, 10};
  if (model == "resnet18" || model == "resnet50") return {224, 224, 3, 1000};
  return {32, 32, 3, 10};
}

std::unique_ptr<BatchSource> make_train_source(const ImageStore& store, const TrainOptions& o,
                                               int rank, int world, Allocator* staging) {
  LoaderOptions lo = base_options(store, o, rank, world, staging);
  lo.split = o.train_split;
  lo.shuffle = true;
  lo.augment = o.augment;
  lo.balanced = balanced(o, world);  // Note [Balanced batches]; evaluation stays unpadded
  lo.first_split = parse_batch_split(o.batch_split);
  lo.drop_last_batch = o.drop_last;
  const int64_t size = store.split_size(o.train_split);
  DDPV_CHECK(!o.drop_last || size >= o.batch_size * world, "--drop-last: split ", o.train_split,
             " of ", store.path(), " has ", size, " images, fewer than one global batch of ",
             o.batch_size * world, " (", world, " ranks x --batch-size ", o.batch_size,
             "): use a smaller --batch-size or leave --drop-last out");
  return std::make_unique<LoaderSource>(store, std::move(lo), size);
}

std::string resolve_val_split(const ImageStore& store, const std::string& asked) {
  if (asked.empty() || asked == "none") return "";
  if (asked == "auto") {
    for (const char* name : {"val", "test"})
      if (store.has_split(name)) return name;
    return "";
  }
  if (store.has_split(asked)) return asked;
  std::string have;
  for (const std::string& s : store.splits()) have += (have.empty() ? "" : ", ") + s;
  DDPV_FAIL("--val-split ", asked, ": store ", store.path(), " has no such split (it has ", have,
            "); name one of them, or use --val-split none");
}

std::unique_ptr<BatchSource> make_eval_source(const ImageStore& store, const std::string& split,
                                              const TrainOptions& o, int rank, int world,
                                              Allocator* staging) {
  LoaderOptions lo = base_options(store, o, rank, world, staging);
  lo.split = split;
  lo.shuffle = false;
  lo.augment = false;
  lo.unpadded = true;
  return std::make_unique<LoaderSource>(store, std::move(lo), store.split_size(split));
}

std::unique_ptr<BatchSource> make_synthetic_source(const SourceShape& shape, const TrainOptions& o,
                                                   int rank, int world, Allocator* staging) {
  return std::make_unique<SyntheticSource>(shape, o, rank, world, staging);
}

}  // namespace ddpv
