// Loader: background reading, augmentation and normalisation into a bounded queue of batches.
#include "ddpv/data/loader.hpp"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "data/host_memory.hpp"
#include "data/image_codec.hpp"
#include "data/work_pool.hpp"
#include "ddpv/core/log.hpp"

namespace ddpv {
namespace {

struct Slot {
  Tensor images;  // (batch_size, H, W, C) float32
  Tensor labels;  // (batch_size) int32
};

struct Ready {
  int slot = -1;  // -1 marks the end of the epoch
  int64_t size = 0, epoch = 0, step = 0, global = 0;
};

struct Request {
  int64_t epoch = 0, start_step = 0;
  int64_t first_seq = 0;  // the number of the epoch's first batch (Note [Balanced batches])
};

}  // namespace

struct Loader::State {
  const ImageStore* store;
  LoaderOptions opt;
  DistributedSampler sampler;
  int height, width, channels;
  size_t image_bytes;
  std::optional<NormalizeTable> normalize;  // the store's mean and std, once per loader
  const std::vector<int32_t>* labels;
  std::vector<uint8_t> cache;  // (N, H, W, C) when the split fits under cache_mb
  bool is_cached = false;
  // Encoded splits (Note [Encoded cache]): bytes kept in an arena filled in the order read,
  // cache_at[i] where image i begins in it (-1: not kept).
  bool encoded = false;
  std::unique_ptr<uint8_t[]> arena;
  int64_t arena_size = 0, arena_used = 0;
  std::vector<int64_t> cache_at;
  const std::vector<int32_t>* shapes = nullptr;
  std::unique_ptr<WorkPool> pool;
  std::vector<codec::TransformScratch> scratch;  // one per worker
  std::vector<std::vector<uint8_t>> resized;     // one (H, W, C) per worker
  EncodedBatch encoded_read;                     // the loader thread's, reused
  std::vector<Slot> slots;
  Device device = Device::kCpu;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<int> free_slots;
  std::deque<Ready> ready;
  std::optional<Request> pending;
  std::optional<SplitQueue> splits;  // with balanced only
  int64_t consumed = 0;              // batches next() has returned
  uint64_t generation = 0;           // bumped by every start_epoch; stale work is dropped
  bool active = false;               // an epoch was started and its end marker not yet consumed
  bool stop = false;
  std::exception_ptr error;
  std::thread worker;

  State(const ImageStore& s, LoaderOptions o)
      : store(&s),
        opt(std::move(o)),
        sampler(nonempty_size(s, opt), opt.world_size, opt.rank, opt.shuffle, opt.seed,
                opt.drop_last) {}

  // The split's size, named in an error when it has no image (before the sampler says so
  // without naming the store).
  static int64_t nonempty_size(const ImageStore& s, const LoaderOptions& o) {
    const int64_t n = s.split_size(o.split);
    DDPV_CHECK(n > 0, "store ", s.path(), ": split '", o.split, "' is empty: ",
               o.unpadded ? "nothing to evaluate (name another with --val-split, or give "
                            "--val-split none)"
                          : "nothing to train on (name another with --train-split, or convert "
                            "the data again)");
    return n;
  }

  void release(int slot) {
    {
      std::lock_guard<std::mutex> lock(mu);
      free_slots.push_back(slot);
    }
    cv.notify_all();
  }

  std::vector<int64_t> epoch_indices(int64_t epoch) {
    sampler.set_epoch(epoch);
    if (opt.balanced) return sampler.padded_order();
    return opt.unpadded ? sampler.shard_unpadded() : sampler.indices();
  }

  void fill(Slot& slot, const int64_t* idx, int64_t n, int64_t epoch, std::vector<uint8_t>& raw) {
    if (encoded) return fill_encoded(slot, idx, n, epoch);
    const uint8_t* base = cache.data();
    if (!is_cached) {
      raw.resize(static_cast<size_t>(n) * image_bytes);
      store->read_rows(opt.split, idx, static_cast<size_t>(n), raw.data());
    }
    float* images = slot.images.data<float>();
    int32_t* labels_out = slot.labels.data<int32_t>();
    const size_t out_elems = image_bytes;  // one float per byte
    pool->run(n, [&](int64_t i, int) {
      const uint8_t* src = is_cached ? base + static_cast<size_t>(idx[i]) * image_bytes
                                     : raw.data() + static_cast<size_t>(i) * image_bytes;
      const AugmentDraw draw = opt.augment
                                   ? draw_augmentation(opt.augment_options, opt.seed, epoch, idx[i])
                                   : identity_draw(opt.augment_options);
      augment_normalize(src, height, width, opt.augment_options.pad, draw, *normalize,
                        images + static_cast<size_t>(i) * out_elems);
      labels_out[i] = (*labels)[static_cast<size_t>(idx[i])];
    });
  }

  // Note [Encoded cache]: a rank keeps the encoded bytes it reads, in the order it reads them,
  // while they fit under --cache-mb and under its share of the split (the split's bytes over
  // the world size, plus the largest image), so ranks sharing a node never hold the split
  // once each. The arena is allocated once at its full size, untouched pages cost nothing.
  void fill_encoded(Slot& slot, const int64_t* idx, int64_t n, int64_t epoch) {
    std::vector<int64_t> missing;
    for (int64_t i = 0; i < n; ++i)
      if (cache_at[static_cast<size_t>(idx[i])] < 0) missing.push_back(idx[i]);
    EncodedBatch& read = encoded_read;
    if (!missing.empty()) store->read_encoded(opt.split, missing.data(), missing.size(), &read);
    // Where position i's bytes are: the arena, or the batch just read.
    std::vector<const uint8_t*> where(static_cast<size_t>(n));
    const std::vector<int64_t>& offsets = store->offsets(opt.split);
    for (size_t m = 0; m < missing.size(); ++m) {
      const size_t row = static_cast<size_t>(missing[m]);
      const int64_t size = read.size[m];
      if (cache_at[row] < 0 && arena_used + size <= arena_size) {
        std::copy_n(read.bytes.data() + read.begin[m], size, arena.get() + arena_used);
        cache_at[row] = arena_used;
        arena_used += size;
      }
    }
    size_t m = 0;
    for (int64_t i = 0; i < n; ++i) {
      const size_t row = static_cast<size_t>(idx[i]);
      if (cache_at[row] >= 0) {
        where[static_cast<size_t>(i)] = arena.get() + cache_at[row];
      } else {  // not kept: it was read now, at the first position asking for it
        while (missing[m] != idx[i]) ++m;
        where[static_cast<size_t>(i)] = read.bytes.data() + read.begin[m];
      }
    }
    float* images = slot.images.data<float>();
    int32_t* labels_out = slot.labels.data<int32_t>();
    const size_t out_elems = static_cast<size_t>(height) * width * channels;
    const ResizedCropOptions& co = opt.crop_options;
    pool->run(n, [&](int64_t i, int worker) {
      const size_t row = static_cast<size_t>(idx[i]);
      const int h = (*shapes)[3 * row], w = (*shapes)[3 * row + 1];
      const CropRegion region = opt.augment ? draw_resized_crop(co, h, w, opt.seed, epoch, idx[i])
                                            : center_crop_region(co, h, w, height, width);
      std::vector<uint8_t>& out = resized[static_cast<size_t>(worker)];
      std::string error;
      DDPV_CHECK(
          codec::crop_resize_jpeg(
              where[static_cast<size_t>(i)], static_cast<size_t>(offsets[row + 1] - offsets[row]),
              channels, h, w, codec::Region{region.y, region.x, region.h, region.w}, opt.augment,
              height, width, out.data(), &scratch[static_cast<size_t>(worker)], &error),
          "store ", store->path(), ": split '", opt.split, "' image ", idx[i], ": ", error,
          " (a damaged store: check it with `ddpv-convert inspect --read-all`, convert "
          "again)");
      augment_normalize(out.data(), height, width, 0, AugmentDraw{0, 0, region.flip}, *normalize,
                        images + static_cast<size_t>(i) * out_elems);
      labels_out[i] = (*labels)[row];
    });
  }

  void run() {
    std::vector<uint8_t> raw;
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      cv.wait(lock, [&] { return stop || pending.has_value(); });
      if (stop) return;
      const Request req = *pending;
      pending.reset();
      const uint64_t gen = generation;
      lock.unlock();
      bool superseded = false;
      try {
        const std::vector<int64_t> idx = epoch_indices(req.epoch);
        const int64_t total = static_cast<int64_t>(idx.size());
        // A step's positions: this rank's batch_size of its shard, or (balanced) the global
        // batch of which this rank takes its slice.
        const int64_t per_step = opt.balanced ? opt.batch_size * opt.world_size : opt.batch_size;
        const int64_t steps =
            opt.drop_last_batch ? total / per_step : (total + per_step - 1) / per_step;
        for (int64_t step = req.start_step; step < steps; ++step) {
          const int64_t seq = req.first_seq + (step - req.start_step);
          lock.lock();
          cv.wait(lock, [&] {
            return stop || generation != gen ||
                   (!free_slots.empty() && (!splits || splits->has(seq)));
          });
          if (stop || generation != gen) {
            superseded = true;
            lock.unlock();
            break;
          }
          const int s = free_slots.front();
          free_slots.pop_front();
          const int64_t begin = step * per_step;
          const int64_t in_step = std::min(per_step, total - begin);
          int64_t first = begin, n = in_step, global = in_step * opt.world_size;
          if (splits) {
            std::vector<int64_t> sizes = splits->at(seq);
            if (in_step < per_step) sizes = shrink_split(sizes, in_step);
            first = begin + split_offset(sizes, opt.rank);
            n = sizes[static_cast<size_t>(opt.rank)];
            global = in_step;
          }
          lock.unlock();
          fill(slots[static_cast<size_t>(s)], idx.data() + first, n, req.epoch, raw);
          lock.lock();
          if (generation != gen) {
            free_slots.push_back(s);
            superseded = true;
            lock.unlock();
            break;
          }
          ready.push_back(Ready{s, n, req.epoch, step, global});
          lock.unlock();
          cv.notify_all();
        }
      } catch (...) {
        lock.lock();
        error = std::current_exception();
        cv.notify_all();
        return;
      }
      lock.lock();
      if (!superseded && generation == gen) ready.push_back(Ready{});
      cv.notify_all();
    }
  }
};

Loader::Loader(const ImageStore& store, LoaderOptions options)
    : state_(std::make_shared<State>(store, std::move(options))) {
  State& s = *state_;
  const LoaderOptions& o = s.opt;
  DDPV_CHECK(o.batch_size > 0, "batch size must be positive, got ", o.batch_size);
  DDPV_CHECK(o.prefetch >= 1, "prefetch must be at least 1, got ", o.prefetch);
  DDPV_CHECK(o.augment_options.pad >= 0, "crop padding must be non-negative");
  DDPV_CHECK(std::isfinite(o.cache_mb) && o.cache_mb >= 0,
             "cache size must be a finite number of MiB >= 0, got ", o.cache_mb);
  DDPV_CHECK(o.threads >= 1 && o.threads <= 256, "loader threads must be in 1..256, got ",
             o.threads);
  DDPV_CHECK(o.crop_h >= 0 && o.crop_w >= 0 && o.crop_h <= 65535 && o.crop_w <= 65535,
             "crop size must be in 0..65535 (0: the store's size)");
  s.encoded = store.encoding(o.split) != SplitEncoding::kRaw;
  s.height = store.height();
  s.width = store.width();
  if (s.encoded && o.crop_h > 0) s.height = o.crop_h, s.width = o.crop_w;
  DDPV_CHECK(s.encoded || o.crop_h == 0 || (o.crop_h == s.height && o.crop_w == s.width), "store ",
             store.path(), ": split '", o.split, "' holds raw ", s.height, "x", s.width,
             " images: a crop size applies to JPEG stores only (leave --crop out)");
  s.channels = store.channels();
  s.image_bytes = static_cast<size_t>(s.height) * s.width * s.channels;
  std::vector<float> inv_std;
  for (float v : store.std()) inv_std.push_back(1.0f / v);
  s.normalize.emplace(s.channels, store.mean().data(), inv_std.data());
  s.labels = &store.labels(o.split);
  s.pool = std::make_unique<WorkPool>(o.threads);

  const int64_t n = store.split_size(o.split);
  const double split_mb = static_cast<double>(n) * static_cast<double>(s.image_bytes) / (1 << 20);
  if (s.encoded) {
    s.scratch.resize(static_cast<size_t>(o.threads));
    s.resized.assign(static_cast<size_t>(o.threads), std::vector<uint8_t>(s.image_bytes));
    s.shapes = &store.shapes(o.split);
    const std::vector<int64_t>& offsets = store.offsets(o.split);
    int64_t largest = 0;
    for (size_t i = 0; i + 1 < offsets.size(); ++i)
      largest = std::max(largest, offsets[i + 1] - offsets[i]);
    const double share = static_cast<double>(offsets.back()) / o.world_size + largest;
    s.arena_size = static_cast<int64_t>(std::min(share, o.cache_mb * (1 << 20)));
    if (s.arena_size > 0) s.arena.reset(new uint8_t[static_cast<size_t>(s.arena_size)]);
    s.cache_at.assign(static_cast<size_t>(n), -1);
  } else if (split_mb <= o.cache_mb) {
    s.cache.resize(static_cast<size_t>(n) * s.image_bytes);
    store.read_range(o.split, 0, n, s.cache.data());
    s.is_cached = true;
    DDPV_DEBUG("loader: split '", o.split, "' cached in memory (", split_mb, " MB)");
  }

  Allocator* alloc = o.allocator ? o.allocator : host_allocator();
  s.device = alloc->device();
  const int num_slots = o.prefetch + 2;  // queued + one being filled + one held by the consumer
  int64_t slot_batch = o.batch_size;
  if (o.balanced) {
    DDPV_CHECK(!o.unpadded, "a balanced loader serves training, not evaluation (internal)");
    const std::vector<int64_t> first = first_split(o.first_split, o.world_size, o.batch_size);
    s.splits.emplace(first, num_slots);
    slot_batch = split_capacity(first, o.world_size, o.batch_size);
  }
  // The pool's size comes from the store's image size (up to 65536 x 65536 x 3) and the batch
  // size: checked, so that an absurd one fails with a line instead of std::bad_alloc.
  const double pool_bytes = static_cast<double>(num_slots) * static_cast<double>(slot_batch) *
                            static_cast<double>(s.image_bytes) * sizeof(float);
  DDPV_CHECK(pool_bytes <= static_cast<double>(host_memory_bytes()), "store ", store.path(), ": ",
             num_slots, " batches of ", slot_batch, " images of ", s.height, "x", s.width, "x",
             s.channels, " need ", gib_text(pool_bytes), ", more than the ",
             gib_text(static_cast<double>(host_memory_bytes())),
             " of this node: use a smaller --batch-size or smaller images");
  for (int i = 0; i < num_slots; ++i) {
    s.slots.push_back(
        Slot{Tensor::empty(Shape{slot_batch, s.height, s.width, s.channels}, DType::kF32, alloc),
             Tensor::empty(Shape{slot_batch}, DType::kI32, alloc)});
    s.free_slots.push_back(i);
  }
  s.worker = std::thread([st = state_.get()] { st->run(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
  if (state_->worker.joinable()) state_->worker.join();
}

void Loader::start_epoch(int64_t epoch, int64_t start_step) {
  DDPV_CHECK(epoch >= 0 && start_step >= 0, "bad loader position (epoch ", epoch, ", step ",
             start_step, ")");
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    ++s.generation;
    for (const Ready& r : s.ready)
      if (r.slot >= 0) s.free_slots.push_back(r.slot);
    s.ready.clear();
    s.pending = Request{epoch, start_step, s.consumed};
    s.active = true;
  }
  s.cv.notify_all();
}

std::optional<Batch> Loader::next() {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mu);
  if (!s.active) return std::nullopt;
  s.cv.wait(lock, [&] { return s.error || !s.ready.empty(); });
  if (s.error) std::rethrow_exception(s.error);
  const Ready r = s.ready.front();
  s.ready.pop_front();
  if (r.slot < 0) {
    s.active = false;
    return std::nullopt;
  }
  ++s.consumed;
  if (s.splits) s.splits->forget_before(s.consumed);
  lock.unlock();
  s.cv.notify_all();
  const Slot& slot = s.slots[static_cast<size_t>(r.slot)];
  Batch b;
  b.images = Tensor::wrap(slot.images.raw(), Shape{r.size, s.height, s.width, s.channels},
                          DType::kF32, s.device);
  b.labels = Tensor::wrap(slot.labels.raw(), Shape{r.size}, DType::kI32, s.device);
  b.size = r.size;
  b.epoch = r.epoch;
  b.step = r.step;
  b.global = r.global;
  // The lease holds the State, so a Batch outliving the Loader still points at live memory.
  std::shared_ptr<State> keep = state_;
  const int index = r.slot;
  b.lease =
      std::shared_ptr<void>(slot.images.raw(), [keep, index](void*) { keep->release(index); });
  return b;
}

void Loader::push_split(std::vector<int64_t> sizes) {
  State& s = *state_;
  DDPV_CHECK(s.splits.has_value(), "push_split on a loader without balanced batches (internal)");
  check_split(sizes, s.opt.world_size, s.opt.batch_size);
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.splits->push(std::move(sizes));
  }
  s.cv.notify_all();
}

int64_t Loader::samples_per_epoch() const {
  const State& s = *state_;
  if (!s.opt.unpadded) return s.sampler.num_samples();
  const int64_t n = s.sampler.dataset_size();
  const int64_t w = s.opt.world_size, r = s.opt.rank;
  return r < n % w ? n / w + 1 : n / w;
}

int64_t Loader::steps_per_epoch() const {
  const int64_t b = state_->opt.batch_size;
  return state_->opt.drop_last_batch ? samples_per_epoch() / b : (samples_per_epoch() + b - 1) / b;
}

bool Loader::cached() const { return state_->is_cached; }
const LoaderOptions& Loader::options() const { return state_->opt; }

}  // namespace ddpv
