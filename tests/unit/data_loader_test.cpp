// Loader and augmentation: naive-loop reference, determinism, world-size independence, resume.
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "ddpv/data/loader.hpp"
#include "ddpv/data/store_writer.hpp"
#include "support/test_support.hpp"

namespace ddpv {
namespace {

constexpr int kH = 8, kW = 6, kC = 3, kClasses = 5;

// A store of n random images; returns its images for reference.
std::vector<uint8_t> make_store(const std::string& path, int64_t n) {
  std::mt19937 gen(42);
  std::vector<uint8_t> images(static_cast<size_t>(n * kH * kW * kC));
  for (auto& v : images) v = static_cast<uint8_t>(gen() & 0xff);
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < n; ++i) labels.push_back(static_cast<int32_t>(i % kClasses));
  StoreWriter w(path, kH, kW, kC, {"a", "b", "c", "d", "e"}, "test", {.chunk_images = 4});
  w.begin_split("train");
  w.append(images.data(), labels.data(), n);
  w.commit();
  return images;
}

// LoaderOptions from "field=value" pieces (designated initialisers would have to name every
// field before the last one given, -Wmissing-field-initializers).
template <typename F>
LoaderOptions opts(F&& set) {
  LoaderOptions o;
  set(o);
  return o;
}

// Pads with zeros, crops at (dy, dx), flips, normalises: the textbook order of operations.
std::vector<float> naive_augment(const uint8_t* src, int h, int w, int c, int pad,
                                 const AugmentDraw& d, const std::vector<float>& mean,
                                 const std::vector<float>& stdev) {
  const int ph = h + 2 * pad, pw = w + 2 * pad;
  std::vector<int> padded(static_cast<size_t>(ph * pw * c), 0);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int k = 0; k < c; ++k)
        padded[static_cast<size_t>(((y + pad) * pw + x + pad) * c + k)] = src[(y * w + x) * c + k];
  std::vector<float> out(static_cast<size_t>(h * w * c));
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int k = 0; k < c; ++k) {
        const int cx = d.flip ? w - 1 - x : x;
        const int v = padded[static_cast<size_t>(((y + d.dy) * pw + cx + d.dx) * c + k)];
        out[static_cast<size_t>((y * w + x) * c + k)] = static_cast<float>(
            (v / 255.0 - mean[static_cast<size_t>(k)]) / stdev[static_cast<size_t>(k)]);
      }
  return out;
}

TEST(DataAugment, MatchesNaivePadCropFlipNormalise) {
  std::mt19937 gen(1);
  std::vector<uint8_t> img(kH * kW * kC);
  for (auto& v : img) v = static_cast<uint8_t>(gen() & 0xff);
  const std::vector<float> mean{0.1f, 0.5f, 0.9f}, stdev{0.2f, 0.3f, 0.7f};
  std::vector<float> inv;
  for (float s : stdev) inv.push_back(1.0f / s);
  AugmentOptions opt{.crop = true, .pad = 3, .flip = true};
  std::set<std::pair<int, int>> offsets;
  int flips = 0;
  for (int64_t sample = 0; sample < 200; ++sample) {
    const AugmentDraw d = draw_augmentation(opt, 9, 2, sample);
    ASSERT_GE(d.dy, 0);
    ASSERT_LE(d.dy, 6);
    ASSERT_GE(d.dx, 0);
    ASSERT_LE(d.dx, 6);
    offsets.insert({d.dy, d.dx});
    flips += d.flip;
    std::vector<float> got(img.size());
    augment_normalize(img.data(), kH, kW, kC, opt.pad, d, mean.data(), inv.data(), got.data());
    EXPECT_LT(
        test::max_rel_error(got, naive_augment(img.data(), kH, kW, kC, opt.pad, d, mean, stdev)),
        1e-4);
  }
  EXPECT_GT(offsets.size(), 30u);  // 49 possible offsets
  EXPECT_GT(flips, 60);
  EXPECT_LT(flips, 140);
  // Draws depend on (seed, epoch, sample) only.
  const AugmentDraw a = draw_augmentation(opt, 9, 2, 17), b = draw_augmentation(opt, 9, 2, 17);
  EXPECT_TRUE(a.dy == b.dy && a.dx == b.dx && a.flip == b.flip);
  int differ = 0;
  for (int64_t s = 0; s < 50; ++s) {
    const AugmentDraw x = draw_augmentation(opt, 9, 2, s), y = draw_augmentation(opt, 9, 3, s);
    differ += x.dy != y.dy || x.dx != y.dx || x.flip != y.flip;
  }
  EXPECT_GT(differ, 25);
}

// One channel (the identity draw has a loop of its own) and a table built once for many images,
// as the loader uses it, against the naive loop: identity, shifted, flipped.
TEST(DataAugment, OneChannelAndASharedTableMatchTheNaiveLoop) {
  std::mt19937 gen(5);
  const std::vector<float> mean{0.3f}, stdev{0.4f};
  const float inv = 1.0f / stdev[0];
  const NormalizeTable table(1, mean.data(), &inv);
  const AugmentOptions opt{.crop = true, .pad = 2, .flip = true};
  for (const AugmentDraw d : {identity_draw(opt), AugmentDraw{0, 3, false}, AugmentDraw{2, 2, true},
                              AugmentDraw{4, 1, true}}) {
    std::vector<uint8_t> img(kH * kW);
    for (auto& v : img) v = static_cast<uint8_t>(gen() & 0xff);
    std::vector<float> got(img.size());
    augment_normalize(img.data(), kH, kW, opt.pad, d, table, got.data());
    EXPECT_LT(
        test::max_rel_error(got, naive_augment(img.data(), kH, kW, 1, opt.pad, d, mean, stdev)),
        1e-4)
        << "draw (" << d.dy << ", " << d.dx << ", " << d.flip << ")";
  }
}

// Every batch of one epoch: sample index -> its float pixels, plus the labels seen.
struct Epoch {
  std::vector<std::vector<float>> batches;
  std::vector<int64_t> sizes;
  std::vector<int32_t> labels;
};

Epoch run_epoch(Loader& loader, int64_t epoch, int64_t start_step = 0) {
  Epoch e;
  loader.start_epoch(epoch, start_step);
  while (auto b = loader.next()) {
    EXPECT_EQ(b->epoch, epoch);
    EXPECT_EQ(b->step, start_step + static_cast<int64_t>(e.batches.size()));
    const float* p = b->images.data<float>();
    e.batches.emplace_back(p, p + b->images.numel());
    e.sizes.push_back(b->size);
    const int32_t* l = b->labels.data<int32_t>();
    e.labels.insert(e.labels.end(), l, l + b->size);
  }
  return e;
}

TEST(DataLoader, WithoutAugmentationDeliversNormalisedSamplesInSamplerOrder) {
  test::TempDir dir;
  const auto images = make_store(dir.file("s.h5"), 23);
  ImageStore store(dir.file("s.h5"));
  Loader loader(store, opts([&](LoaderOptions& o) {
                  o.batch_size = 5;
                  o.seed = 3;
                  o.augment = false;
                }));
  EXPECT_TRUE(loader.cached());
  EXPECT_EQ(loader.steps_per_epoch(), 5);
  const Epoch e = run_epoch(loader, 1);
  EXPECT_EQ(e.sizes, (std::vector<int64_t>{5, 5, 5, 5, 3}));
  DistributedSampler sampler(23, 1, 0, true, 3);
  sampler.set_epoch(1);
  const auto order = sampler.indices();
  const size_t img = kH * kW * kC;
  for (size_t i = 0; i < order.size(); ++i) {
    const auto& batch = e.batches[i / 5];
    EXPECT_EQ(e.labels[i], order[i] % kClasses);
    for (size_t k = 0; k < img; ++k) {
      const size_t c = k % kC;
      const double want =
          (images[static_cast<size_t>(order[i]) * img + k] / 255.0 - store.mean()[c]) /
          store.std()[c];
      ASSERT_NEAR(batch[(i % 5) * img + k], want, 1e-5);
    }
  }
  EXPECT_FALSE(loader.next().has_value()) << "after the end marker, next() stays empty";
}

TEST(DataLoader, SameSeedSameBytesDifferentSeedDifferentBytesCachedOrNot) {
  test::TempDir dir;
  make_store(dir.file("s.h5"), 40);
  ImageStore store(dir.file("s.h5"));
  Loader a(store, opts([&](LoaderOptions& o) {
             o.batch_size = 8;
             o.seed = 5;
           }));
  Loader b(store, opts([&](LoaderOptions& o) {
             o.batch_size = 8;
             o.seed = 5;
             o.prefetch = 1;
             o.cache_mb = 0;
           }));
  Loader c(store, opts([&](LoaderOptions& o) {
             o.batch_size = 8;
             o.seed = 6;
           }));
  EXPECT_FALSE(b.cached());
  for (int64_t epoch : {0, 1}) {
    const Epoch ea = run_epoch(a, epoch), eb = run_epoch(b, epoch), ec = run_epoch(c, epoch);
    EXPECT_EQ(ea.batches, eb.batches);
    EXPECT_EQ(ea.labels, eb.labels);
    EXPECT_NE(ea.batches, ec.batches);
  }
}

// Note [Augmentation keys]: each sample is augmented the same at world size 1 and 2.
TEST(DataLoader, AugmentedSampleIsTheSameWhateverTheWorldSize) {
  test::TempDir dir;
  make_store(dir.file("s.h5"), 30);
  ImageStore store(dir.file("s.h5"));
  const size_t img = kH * kW * kC;
  auto collect = [&](int world, int rank, std::map<int64_t, std::vector<float>>& out) {
    Loader loader(store, opts([&](LoaderOptions& o) {
                    o.batch_size = 4;
                    o.rank = rank;
                    o.world_size = world;
                    o.seed = 8;
                  }));
    DistributedSampler sampler(30, world, rank, true, 8);
    sampler.set_epoch(2);
    const auto order = sampler.indices();
    const Epoch e = run_epoch(loader, 2);
    for (size_t i = 0; i < order.size(); ++i) {
      const float* p = e.batches[i / 4].data() + (i % 4) * img;
      out[order[i]] = std::vector<float>(p, p + img);
    }
  };
  std::map<int64_t, std::vector<float>> one, two;
  collect(1, 0, one);
  collect(2, 0, two);
  collect(2, 1, two);
  ASSERT_EQ(one.size(), 30u);
  EXPECT_EQ(one, two);
}

TEST(DataLoader, ResumeAtAStepEqualsTheTailOfTheFullEpoch) {
  test::TempDir dir;
  make_store(dir.file("s.h5"), 50);
  ImageStore store(dir.file("s.h5"));
  Loader loader(store, opts([&](LoaderOptions& o) {
                  o.batch_size = 6;
                  o.seed = 2;
                  o.prefetch = 2;
                }));
  const Epoch full = run_epoch(loader, 3);
  const Epoch tail = run_epoch(loader, 3, 4);
  ASSERT_EQ(tail.batches.size(), full.batches.size() - 4);
  for (size_t i = 0; i < tail.batches.size(); ++i) EXPECT_EQ(tail.batches[i], full.batches[i + 4]);
  // Restarting in the middle of an epoch drops what was queued.
  loader.start_epoch(0);
  ASSERT_TRUE(loader.next().has_value());
  const Epoch again = run_epoch(loader, 3);
  EXPECT_EQ(again.batches, full.batches);
}

TEST(DataLoader, UnpaddedEvaluationSeesEverySampleOnce) {
  test::TempDir dir;
  make_store(dir.file("s.h5"), 23);
  ImageStore store(dir.file("s.h5"));
  std::multiset<int32_t> labels;
  int64_t total = 0;
  for (int r = 0; r < 3; ++r) {
    Loader loader(store, opts([&](LoaderOptions& o) {
                    o.batch_size = 4;
                    o.rank = r;
                    o.world_size = 3;
                    o.shuffle = false;
                    o.unpadded = true;
                    o.augment = false;
                  }));
    const Epoch e = run_epoch(loader, 0);
    EXPECT_EQ(static_cast<int64_t>(e.labels.size()), loader.samples_per_epoch());
    total += loader.samples_per_epoch();
    labels.insert(e.labels.begin(), e.labels.end());
  }
  EXPECT_EQ(total, 23);
  for (int c = 0; c < kClasses; ++c) EXPECT_EQ(labels.count(c), c < 3 ? 5u : 4u);
}

// Note [Balanced batches]: two ranks' loaders fed the same splits take, at every step, the
// slices of the step's positions in the padded epoch order that the splits say (the epoch's
// last, short step shrunk alike on both), and a restart inside an epoch keeps them in step.
TEST(DataLoader, BalancedRanksTakeTheirSlicesOfEachStepsGlobalBatch) {
  test::TempDir dir;
  const int64_t n = 23, batch = 5, world = 2, global = batch * world;
  const auto images = make_store(dir.file("s.h5"), n);
  ImageStore store(dir.file("s.h5"));
  std::vector<std::unique_ptr<Loader>> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(std::make_unique<Loader>(store, opts([&](LoaderOptions& o) {
                                               o.batch_size = batch;
                                               o.rank = r;
                                               o.world_size = world;
                                               o.seed = 9;
                                               o.augment = false;
                                               o.prefetch = 1;  // 3 equal splits queued first
                                               o.balanced = true;
                                             })));
  }
  // The split of the k-th batch taken (k >= 3); all sum to the global batch.
  const std::vector<std::vector<int64_t>> pushed{{8, 2}, {3, 7}, {9, 1}, {6, 4}, {2, 8},
                                                 {7, 3}, {5, 5}, {4, 6}, {1, 9}};
  auto split_of = [&](size_t k) { return k < 3 ? std::vector<int64_t>{5, 5} : pushed[k - 3]; };
  // 24 padded positions (23 + the first again), steps of 10: 10, 10, then 4.
  const std::vector<int64_t> want_global{10, 10, 4};
  const size_t img = kH * kW * kC;
  size_t taken = 0;
  auto take_epoch = [&](int64_t epoch, int64_t steps_to_take) {
    for (auto& l : ranks) l->start_epoch(epoch);
    const std::vector<int64_t> order = DistributedSampler::epoch_order(n, true, 9, epoch);
    for (int64_t step = 0; step < steps_to_take; ++step, ++taken) {
      std::vector<int64_t> sizes = split_of(taken);
      const int64_t in_step = want_global[static_cast<size_t>(step)];
      if (in_step < global) {  // one each, the other 2 shared 8:2 (or as the split says)
        const std::vector<int64_t> full = sizes;
        sizes = {1, 1};
        int64_t rest = in_step - 2;
        const double a = static_cast<double>(rest) * static_cast<double>(full[0]) / global;
        const int64_t fa = static_cast<int64_t>(std::floor(a));
        const double b = static_cast<double>(rest) - a;
        const int64_t fb = static_cast<int64_t>(std::floor(b));
        sizes[0] += fa;
        sizes[1] += fb;
        if (fa + fb < rest) ++sizes[a - fa >= b - fb ? 0 : 1];
      }
      int64_t first = step * global;
      for (int r = 0; r < world; ++r) {
        auto b = ranks[static_cast<size_t>(r)]->next();
        ASSERT_TRUE(b.has_value()) << "epoch " << epoch << " step " << step << " rank " << r;
        EXPECT_EQ(b->global, in_step);
        ASSERT_EQ(b->size, sizes[static_cast<size_t>(r)]) << "batch " << taken << " rank " << r;
        const float* x = b->images.data<float>();
        for (int64_t i = 0; i < b->size; ++i) {
          const auto sample = static_cast<size_t>(order[static_cast<size_t>((first + i) % n)]);
          EXPECT_EQ(b->labels.data<int32_t>()[i], static_cast<int32_t>(sample % kClasses));
          const size_t k = img / 2;  // one pixel of each image identifies it
          const double want =
              (images[sample * img + k] / 255.0 - store.mean()[k % kC]) / store.std()[k % kC];
          EXPECT_NEAR(x[static_cast<size_t>(i) * img + k], want, 1e-5);
        }
        first += b->size;
        ranks[static_cast<size_t>(r)]->push_split(pushed[taken]);
      }
    }
  };
  take_epoch(0, 1);  // one batch, then a restart of the epoch drops what was prepared
  taken = 1;
  take_epoch(0, 3);
  for (auto& l : ranks) EXPECT_FALSE(l->next().has_value());
  take_epoch(1, 3);
  for (auto& l : ranks) EXPECT_FALSE(l->next().has_value());
  EXPECT_THROW(ranks[0]->push_split({5, 6}), Error);
}

class CountingAllocator : public Allocator {
 public:
  Device device() const override { return Device::kCpu; }
  void* allocate(size_t bytes) override {
    ++live;
    void* p = host_allocator()->allocate(bytes);
    blocks.push_back({static_cast<char*>(p), bytes});
    return p;
  }
  void deallocate(void* p, size_t bytes) noexcept override {
    --live;
    host_allocator()->deallocate(p, bytes);
  }
  bool owns(const void* p) const {
    for (auto [b, n] : blocks)
      if (p >= b && p < b + n) return true;
    return false;
  }
  int live = 0;
  std::vector<std::pair<char*, size_t>> blocks;
};

TEST(DataLoader, BatchesLiveInTheGivenAllocatorsMemoryAndOutliveTheLoader) {
  test::TempDir dir;
  make_store(dir.file("s.h5"), 20);
  ImageStore store(dir.file("s.h5"));
  CountingAllocator alloc;
  std::optional<Batch> kept;
  {
    Loader loader(store, opts([&](LoaderOptions& o) {
                    o.batch_size = 4;
                    o.prefetch = 2;
                    o.allocator = &alloc;
                  }));
    EXPECT_EQ(alloc.live, 8);  // (prefetch + 2) slots of images and labels
    loader.start_epoch(0);
    kept = loader.next();
    ASSERT_TRUE(kept.has_value());
    EXPECT_TRUE(alloc.owns(kept->images.raw()));
    EXPECT_TRUE(alloc.owns(kept->labels.raw()));
  }
  EXPECT_EQ(alloc.live, 8) << "a held batch keeps the pool alive";
  EXPECT_EQ(kept->images.shape(), (Shape{4, kH, kW, kC}));
  kept.reset();
  EXPECT_EQ(alloc.live, 0);
}

}  // namespace
}  // namespace ddpv

namespace ddpv {
namespace {

// A checksum failure in the loader thread reaches the consumer as an exception from next().
TEST(DataLoader, ReadErrorInTheThreadIsRethrownByNext) {
  test::TempDir dir;
  const std::string path = dir.file("s.h5");
  {
    std::vector<uint8_t> images(64 * kH * kW * kC, 0xab);
    std::vector<int32_t> labels(64, 1);
    StoreWriterOptions wo;
    wo.chunk_images = 8;
    wo.checksum = true;
    StoreWriter w(path, kH, kW, kC, {"a", "b"}, "test", wo);
    w.begin_split("train");
    w.append(images.data(), labels.data(), 64);
    w.commit();
  }
  {  // flip one byte inside the first run of image bytes: that chunk's fletcher32 no longer holds
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), {});
    const std::string run(kH * kW * kC, static_cast<char>(0xab));
    const size_t at = std::string(bytes.begin(), bytes.end()).find(run);
    ASSERT_NE(at, std::string::npos);
    f.seekp(static_cast<std::streamoff>(at + 5));
    f.put(0x00);
  }
  ImageStore store(path);
  LoaderOptions o;
  o.batch_size = 64;
  o.cache_mb = 0;
  o.shuffle = false;
  Loader loader(store, o);
  loader.start_epoch(0);
  try {
    loader.next();
    FAIL() << "a corrupt chunk was read without error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("cannot read"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find(path), std::string::npos) << e.message();
  }
  // A cached loader reads the whole split up front, so the same fault surfaces at construction.
  o.cache_mb = 2048;
  EXPECT_THROW(Loader(store, o), Error);
}

}  // namespace
}  // namespace ddpv
