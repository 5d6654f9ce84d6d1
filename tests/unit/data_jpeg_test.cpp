// The JPEG input pipeline: store v2 (encoded splits) round trips and validation, region decoding
// and resizing against naive resamplers, RandomResizedCrop statistics, and Loader batches that
// do not depend on the thread count, the world size or the byte cache.
#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <random>

#include "data/image_codec.hpp"
#include "ddpv/data/augment.hpp"
#include "ddpv/data/loader.hpp"
#include "ddpv/data/store_writer.hpp"
#include "ddpv/h5/h5.hpp"
#include "support/test_support.hpp"

namespace ddpv {
namespace {

using test::TempDir;

// A textured RGB image (smooth waves plus noise), so JPEG has real AC data to code.
codec::Image textured(int h, int w, uint64_t seed) {
  std::mt19937 gen(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const double fx = 0.05 + 0.2 * u(gen), fy = 0.05 + 0.2 * u(gen), ph = 6 * u(gen);
  codec::Image im{h, w, 3, std::vector<uint8_t>(static_cast<size_t>(h) * w * 3)};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) {
        const double v =
            128 + 70 * std::sin(fx * x + ph + c) * std::cos(fy * y - c) + 20 * (u(gen) - 0.5);
        im.pixels[(static_cast<size_t>(y) * w + x) * 3 + c] =
            static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
      }
  return im;
}

struct Jpegs {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<std::array<int32_t, 3>> shapes;
};

Jpegs make_jpegs(int n, uint64_t seed) {
  Jpegs j;
  std::mt19937 gen(static_cast<uint32_t>(seed));
  for (int i = 0; i < n; ++i) {
    const int h = 40 + static_cast<int>(gen() % 50), w = 40 + static_cast<int>(gen() % 50);
    j.bytes.push_back(codec::encode_jpeg(textured(h, w, seed * 1000 + i), 90));
    j.shapes.push_back({h, w, 3});
  }
  return j;
}

// Writes `train` (and `val`) as encoded splits; label i = i % classes.
void write_store(const std::string& path, const Jpegs& train, const Jpegs* val, int crop,
                 int classes) {
  std::vector<std::string> names;
  for (int c = 0; c < classes; ++c)
    names.push_back(std::to_string(c));  // (GCC 12 warns on "c" + s)
  StoreWriter w(path, crop, crop, 3, names, "test");
  for (const auto& [name, j] : {std::pair{"train", &train}, std::pair{"val", val}}) {
    if (!j) continue;
    w.begin_split(name, SplitEncoding::kJpeg);
    std::vector<uint8_t> all;
    std::vector<int64_t> sizes;
    std::vector<int32_t> shapes, labels;
    for (size_t i = 0; i < j->bytes.size(); ++i) {
      all.insert(all.end(), j->bytes[i].begin(), j->bytes[i].end());
      sizes.push_back(static_cast<int64_t>(j->bytes[i].size()));
      shapes.insert(shapes.end(), j->shapes[i].begin(), j->shapes[i].end());
      labels.push_back(static_cast<int32_t>(i % static_cast<size_t>(classes)));
    }
    // In two appends, so the offsets continue across them.
    const int64_t half = static_cast<int64_t>(sizes.size() / 2);
    const int64_t half_bytes = std::accumulate(sizes.begin(), sizes.begin() + half, int64_t{0});
    w.append_encoded(all.data(), sizes.data(), shapes.data(), labels.data(), half);
    w.append_encoded(all.data() + half_bytes, sizes.data() + half, shapes.data() + 3 * half,
                     labels.data() + half, static_cast<int64_t>(sizes.size()) - half);
    if (std::string(name) == "train") {
      codec::Image im;
      std::string error;
      ASSERT_TRUE(
          codec::decode_image(j->bytes[0].data(), j->bytes[0].size(), 3, 1 << 20, &im, &error));
      w.add_train_pixels(im.pixels.data(), int64_t{im.height} * im.width);
    }
  }
  w.commit();
}

TEST(DataJpegStore, EncodedSplitRoundTripsTheBytes) {
  TempDir dir;
  const Jpegs train = make_jpegs(9, 1), val = make_jpegs(4, 2);
  write_store(dir.file("s.h5"), train, &val, 32, 3);
  const ImageStore store(dir.file("s.h5"));
  EXPECT_EQ(store.format_version(), 2);
  EXPECT_EQ(store.encoding("train"), SplitEncoding::kJpeg);
  ASSERT_EQ(store.split_size("train"), 9);
  ASSERT_EQ(store.split_size("val"), 4);
  EXPECT_EQ(store.height(), 32);
  for (size_t i = 0; i < 9; ++i) {
    EXPECT_EQ(store.shapes("train")[3 * i], train.shapes[i][0]);
    EXPECT_EQ(store.shapes("train")[3 * i + 1], train.shapes[i][1]);
    EXPECT_EQ(store.labels("train")[i], static_cast<int32_t>(i % 3));
  }
  // Any order, duplicates, runs and gaps: each position gets exactly its source bytes.
  const std::vector<int64_t> idx{7, 2, 3, 4, 2, 0, 8};
  EncodedBatch b;
  store.read_encoded("train", idx.data(), idx.size(), &b);
  for (size_t i = 0; i < idx.size(); ++i) {
    const auto& want = train.bytes[static_cast<size_t>(idx[i])];
    ASSERT_EQ(b.size[i], static_cast<int64_t>(want.size()));
    EXPECT_TRUE(std::equal(want.begin(), want.end(), b.bytes.begin() + b.begin[i])) << i;
  }
  EXPECT_NE(
      test::error_of([&] { store.read_encoded("train", std::vector<int64_t>{9}.data(), 1, &b); }),
      "");
  EXPECT_NE(test::error_of([&] {
              std::vector<uint8_t> row(32 * 32 * 3);
              store.read_rows("train", std::vector<int64_t>{0}, row.data());
            }),
            "");
}

TEST(DataJpegStore, RawStoresStayVersionOne) {
  TempDir dir;
  {
    StoreWriter w(dir.file("raw.h5"), 2, 2, 1, {"a"}, "test");
    w.begin_split("train");
    const std::vector<uint8_t> px{1, 2, 3, 4};
    const int32_t label = 0;
    w.append(px.data(), &label, 1);
    w.commit();
  }
  EXPECT_EQ(ImageStore(dir.file("raw.h5")).format_version(), 1);
}

// Rewrites one dataset of an encoded split (same type) and returns the error opening gives.
std::string error_after(const std::string& path, const std::string& dataset,
                        const std::function<void(std::vector<int64_t>&)>& change) {
  {
    h5::Handle f = h5::open_file(path, true);
    std::vector<int64_t> dims;
    std::vector<int64_t> v = h5::read_i64(f.get(), dataset, &dims);
    change(v);
    H5Ldelete(f.get(), dataset.c_str(), H5P_DEFAULT);
    h5::write_i64(f.get(), dataset, {static_cast<int64_t>(v.size())}, v.data());
  }
  return test::error_of([&] { ImageStore s(path); });
}

TEST(DataJpegStore, BadOffsetsAreRefusedAtOpen) {
  TempDir dir;
  const Jpegs train = make_jpegs(5, 3);
  const std::string good = dir.file("good.h5");
  write_store(good, train, nullptr, 16, 2);
  auto fresh = [&](const std::string& name) {
    std::filesystem::copy_file(good, dir.file(name));
    return dir.file(name);
  };
  EXPECT_NE(error_after(fresh("a.h5"), "train/offsets", [](auto& v) { std::swap(v[2], v[3]); })
                .find("offsets must rise"),
            std::string::npos);
  EXPECT_NE(error_after(fresh("b.h5"), "train/offsets", [](auto& v) { v.back() -= 1; })
                .find("but /train/data holds"),
            std::string::npos);
  EXPECT_NE(error_after(fresh("c.h5"), "train/offsets", [](auto& v) { v.push_back(v.back() + 1); })
                .find("/shapes must be (N, 3)"),
            std::string::npos);
  EXPECT_NE(error_after(fresh("d.h5"), "train/offsets", [](auto& v) { v[0] = 1; })
                .find("offsets[0] is 1"),
            std::string::npos);
}

// ---- decoding and resizing against naive resamplers -----------------------------------------

// The triangle filter of Note [Resize] in double, straight from its definition: output pixel
// (oy, ox) averages the source pixels inside [lo, hi) (rows and columns) with the product of
// the two kernels, normalised per axis.
std::vector<double> naive_weights(int in, double start, double extent, int out, int o, int lo,
                                  int hi, int* first) {
  const double scale = out / extent, stretch = std::max(1.0, 1.0 / scale);
  const double center = start + (o + 0.5) / scale;
  std::vector<double> w;
  double total = 0;
  *first = std::max(lo, static_cast<int>(std::floor(center - stretch)));
  const int last = std::min(hi, static_cast<int>(std::ceil(center + stretch)));
  for (int i = *first; i < last && i < in; ++i) {
    w.push_back(std::max(0.0, 1.0 - std::abs((i + 0.5 - center) / stretch)));
    total += w.back();
  }
  for (double& v : w) v /= total;
  return w;
}

std::vector<uint8_t> naive_resize(const codec::Image& src, const codec::Region& r, bool clip,
                                  int dh, int dw) {
  const int ylo = clip ? static_cast<int>(std::floor(r.y)) : 0;
  const int yhi = clip ? static_cast<int>(std::ceil(r.y + r.h)) : src.height;
  const int xlo = clip ? static_cast<int>(std::floor(r.x)) : 0;
  const int xhi = clip ? static_cast<int>(std::ceil(r.x + r.w)) : src.width;
  std::vector<uint8_t> out(static_cast<size_t>(dh) * dw * src.channels);
  for (int oy = 0; oy < dh; ++oy) {
    int fy = 0;
    const auto wy = naive_weights(src.height, r.y, r.h, dh, oy, ylo, yhi, &fy);
    for (int ox = 0; ox < dw; ++ox) {
      int fx = 0;
      const auto wx = naive_weights(src.width, r.x, r.w, dw, ox, xlo, xhi, &fx);
      for (int c = 0; c < src.channels; ++c) {
        double acc = 0;
        for (size_t a = 0; a < wy.size(); ++a)
          for (size_t b = 0; b < wx.size(); ++b)
            acc +=
                wy[a] * wx[b] *
                src.pixels[((static_cast<size_t>(fy) + a) * src.width + fx + b) * src.channels + c];
        out[(static_cast<size_t>(oy) * dw + ox) * src.channels + c] =
            static_cast<uint8_t>(std::lround(acc));
      }
    }
  }
  return out;
}

int max_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  int d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

TEST(DataJpegTransform, FullScaleCropMatchesANaiveResamplerExactly) {
  const auto bytes = codec::encode_jpeg(textured(90, 120, 5), 90);
  codec::Image full;
  std::string error;
  ASSERT_TRUE(codec::decode_image(bytes.data(), bytes.size(), 3, 1 << 20, &full, &error));
  // A 70 x 50 crop to 48 x 40: half scale would leave 35 x 25 rows, under the output, so the
  // decode is at full size, and only the crop's rows and (iMCU-widened) columns are decoded.
  for (const codec::Region r : {codec::Region{13, 37, 70, 50}, codec::Region{0, 0, 90, 120},
                                codec::Region{20, 70, 55, 50}}) {
    for (bool clip : {true, false}) {
      std::vector<uint8_t> got(48 * 40 * 3);
      codec::TransformScratch scratch;
      ASSERT_TRUE(codec::crop_resize_jpeg(bytes.data(), bytes.size(), 3, 90, 120, r, clip, 48, 40,
                                          got.data(), &scratch, &error))
          << error;
      EXPECT_LT(scratch.decoded.width * scratch.decoded.height, 90 * 120 + 1);
      // The float sums of the library round to the other side of .5 at most rarely.
      EXPECT_LE(max_diff(got, naive_resize(full, r, clip, 48, 40)), 1)
          << r.y << "," << r.x << " clip " << clip;
    }
  }
}

TEST(DataJpegTransform, ReducedScaleDecodeIsCloseToTheFullDecode) {
  const auto bytes = codec::encode_jpeg(textured(400, 360, 6), 92);
  codec::Image full;
  std::string error;
  ASSERT_TRUE(codec::decode_image(bytes.data(), bytes.size(), 3, 1 << 20, &full, &error));
  const codec::Region r{40, 20, 320, 300};  // to 64 x 64: decoded at 2/8 (80 x 75 rows)
  std::vector<uint8_t> got(64 * 64 * 3);
  codec::TransformScratch scratch;
  ASSERT_TRUE(codec::crop_resize_jpeg(bytes.data(), bytes.size(), 3, 400, 360, r, true, 64, 64,
                                      got.data(), &scratch, &error));
  EXPECT_LE(scratch.decoded.height, 400 / 4 + 1);  // the reduced scale was taken
  const std::vector<uint8_t> want = naive_resize(full, r, true, 64, 64);
  double mean = 0;
  for (size_t i = 0; i < got.size(); ++i) mean += std::abs(got[i] - want[i]);
  mean /= static_cast<double>(got.size());
  // The DCT's own downscale is a different low-pass filter than the triangle: close, not equal.
  EXPECT_LT(mean, 3.0);
  EXPECT_LT(max_diff(got, want), 40);
}

TEST(DataJpegTransform, HeaderShapeMismatchAndCorruptBytesAreErrors) {
  auto bytes = codec::encode_jpeg(textured(50, 60, 7), 90);
  std::vector<uint8_t> out(48 * 48 * 3);
  codec::TransformScratch scratch;
  std::string error;
  EXPECT_FALSE(codec::crop_resize_jpeg(bytes.data(), bytes.size(), 3, 60, 50, {0, 0, 50, 50}, true,
                                       16, 16, out.data(), &scratch, &error));
  EXPECT_NE(error.find("store's shape is 60x50"), std::string::npos) << error;
  bytes.resize(bytes.size() / 2);  // libjpeg cannot tell every flipped bit; a cut it can
  error.clear();
  EXPECT_FALSE(codec::crop_resize_jpeg(bytes.data(), bytes.size(), 3, 50, 60, {0, 0, 50, 60}, true,
                                       48, 48, out.data(), &scratch, &error));
  EXPECT_NE(error.find("corrupt JPEG"), std::string::npos) << error;
}

// ---- RandomResizedCrop --------------------------------------------------------------------

TEST(DataResizedCrop, AreasAndRatiosFollowTheirDistributions) {
  const ResizedCropOptions o;
  const int h = 375, w = 500, n = 40000;
  std::vector<int> area_bins(10, 0), ratio_bins(10, 0);
  int flips = 0, fallback = 0, in_area_range = 0;
  for (int i = 0; i < n; ++i) {
    const CropRegion r = draw_resized_crop(o, h, w, 7, 0, i);
    ASSERT_GE(r.y, 0);
    ASSERT_GE(r.x, 0);
    ASSERT_LE(r.y + r.h, h);
    ASSERT_LE(r.x + r.w, w);
    ASSERT_EQ(r.h, std::round(r.h));  // whole pixels, as torchvision
    flips += r.flip;
    const double area = r.h * r.w / (static_cast<double>(h) * w);
    if (r.h == h && r.w == w) ++fallback;
    // Up to an area share of 0.5625 every ratio of the range fits, so accepted draws are
    // uniform in area there, and log-uniform in ratio.
    if (area >= 0.1 && area < 0.5) {
      ++in_area_range;
      ++area_bins[static_cast<size_t>((area - 0.1) / 0.04)];
      const double lr = std::log(r.w / r.h), lo = std::log(3.0 / 4), hi = std::log(4.0 / 3);
      const int b = static_cast<int>((lr - lo) / (hi - lo) * 10);
      ++ratio_bins[static_cast<size_t>(std::clamp(b, 0, 9))];
    }
  }
  EXPECT_NEAR(flips / static_cast<double>(n), 0.5, 0.015);
  // A try fits when s * r <= 4/3 and s / r <= 3/4 (a 500 x 375 image, s the area share, r the
  // ratio); below s = 0.5625 every ratio fits. The accepted draw is a try conditioned on
  // fitting, so P(s in [0.1, 0.5)) = (0.4 / 0.92) / P(fit), P(fit) integrated on a grid.
  double fit = 0;
  const int grid = 2000;
  for (int i = 0; i < grid; ++i)
    for (int j = 0; j < grid; ++j) {
      const double sv = 0.08 + 0.92 * (i + 0.5) / grid;
      const double rv =
          std::exp(std::log(0.75) + (std::log(4.0 / 3) - std::log(0.75)) * (j + 0.5) / grid);
      fit += (sv * rv <= 4.0 / 3 && sv / rv <= 0.75) ? 1.0 : 0.0;
    }
  fit /= static_cast<double>(grid) * grid;
  EXPECT_NEAR(in_area_range / static_cast<double>(n), 0.4 / 0.92 / fit, 0.015) << "P(fit) " << fit;
  const double per_bin = in_area_range / 10.0;
  for (int b = 0; b < 10; ++b) {
    EXPECT_NEAR(area_bins[static_cast<size_t>(b)], per_bin, 5 * std::sqrt(per_bin)) << "area " << b;
    // Rounding to whole pixels blurs the ratio's edges; the inner bins are uniform.
    if (b > 0 && b < 9) {
      EXPECT_NEAR(ratio_bins[static_cast<size_t>(b)], per_bin, 5 * std::sqrt(per_bin))
          << "ratio " << b;
    }
  }
  EXPECT_LT(fallback, n / 100);
  // Keyed by (seed, epoch, sample) alone.
  const CropRegion a = draw_resized_crop(o, h, w, 7, 3, 11),
                   b = draw_resized_crop(o, h, w, 7, 3, 11);
  const CropRegion c = draw_resized_crop(o, h, w, 7, 4, 11);
  EXPECT_TRUE(a.y == b.y && a.x == b.x && a.h == b.h && a.w == b.w && a.flip == b.flip);
  EXPECT_FALSE(a.y == c.y && a.x == c.x && a.h == c.h && a.w == c.w);
}

TEST(DataResizedCrop, ExtremeImagesFallBackToTheClampedCentre) {
  ResizedCropOptions o;
  o.scale_lo = o.scale_hi = 1.0;  // the whole area of a 10:1 image never fits a 4:3 box
  const CropRegion r = draw_resized_crop(o, 20, 200, 1, 0, 0);
  EXPECT_EQ(r.h, 20);
  EXPECT_EQ(r.w, std::round(20 * 4.0 / 3));
  EXPECT_EQ(r.x, std::floor((200 - r.w) / 2));  // torchvision's (width - w) // 2
}

TEST(DataResizedCrop, EvalRegionIsResizeThenCentreCrop) {
  const ResizedCropOptions o;  // 224 / 0.875 = 256
  const CropRegion r = center_crop_region(o, 375, 500, 224, 224);
  // The shorter side 375 becomes 256; a 224 crop of it is 224 * 375 / 256 source pixels.
  EXPECT_NEAR(r.h, 224 * 375 / 256.0, 1e-9);
  EXPECT_NEAR(r.w, 224 * 375 / 256.0, 1e-9);
  EXPECT_NEAR(r.y, (375 - r.h) / 2, 1e-9);
  EXPECT_NEAR(r.x, (500 - r.w) / 2, 1e-9);
  EXPECT_FALSE(r.flip);
}

// ---- Loader over an encoded split ----------------------------------------------------------

// Every batch of `epochs` epochs, concatenated in order, with labels.
struct Drained {
  std::vector<float> images;
  std::vector<int32_t> labels;
};
Drained drain(const ImageStore& store, LoaderOptions o, int epochs) {
  Loader loader(store, o);
  Drained d;
  for (int e = 0; e < epochs; ++e) {
    loader.start_epoch(e);
    while (auto b = loader.next()) {
      const float* x = b->images.data<float>();
      d.images.insert(d.images.end(), x, x + b->images.numel());
      const int32_t* y = b->labels.data<int32_t>();
      d.labels.insert(d.labels.end(), y, y + b->size);
    }
  }
  return d;
}

LoaderOptions jpeg_options(const std::string& split, int threads) {
  LoaderOptions o;
  o.split = split;
  o.batch_size = 6;
  o.seed = 5;
  o.threads = threads;
  o.crop_h = o.crop_w = 24;
  o.augment = split == "train";
  o.shuffle = split == "train";
  o.unpadded = split != "train";
  return o;
}

TEST(DataJpegLoader, BatchesDoNotDependOnThreadsOrTheCache) {
  TempDir dir;
  const Jpegs train = make_jpegs(20, 8), val = make_jpegs(7, 9);
  write_store(dir.file("s.h5"), train, &val, 24, 20);  // 20 classes: label i = sample i
  const ImageStore store(dir.file("s.h5"));
  for (const std::string split : {"train", "val"}) {
    const Drained one = drain(store, jpeg_options(split, 1), 2);
    LoaderOptions three = jpeg_options(split, 3);
    three.cache_mb = 0;  // and every batch read from the file
    const Drained other = drain(store, three, 2);
    EXPECT_EQ(one.labels, other.labels) << split;
    EXPECT_EQ(one.images, other.images) << split;  // bit for bit
    ASSERT_EQ(one.images.size(), one.labels.size() * 24 * 24 * 3);
  }
  // Train batches are augmented: the two epochs differ, and differ from evaluation's crop.
  const Drained t = drain(store, jpeg_options("train", 2), 2);
  const size_t half = t.images.size() / 2;
  EXPECT_FALSE(std::equal(t.images.begin(), t.images.begin() + half, t.images.begin() + half));
}

TEST(DataJpegLoader, TwoRanksServeTheSameSamplesAsOne) {
  TempDir dir;
  const Jpegs train = make_jpegs(24, 10);
  write_store(dir.file("s.h5"), train, nullptr, 24, 24);  // label = sample index
  const ImageStore store(dir.file("s.h5"));
  LoaderOptions o = jpeg_options("train", 2);
  o.batch_size = 8;
  const Drained one = drain(store, o, 1);
  o.batch_size = 4;
  o.world_size = 2;
  std::map<int32_t, std::vector<float>> by_sample;  // what 2 ranks made of each sample
  for (int rank = 0; rank < 2; ++rank) {
    o.rank = rank;
    const Drained d = drain(store, o, 1);
    const size_t image = 24 * 24 * 3;
    for (size_t i = 0; i < d.labels.size(); ++i)
      by_sample[d.labels[i]].assign(d.images.begin() + i * image,
                                    d.images.begin() + (i + 1) * image);
  }
  ASSERT_EQ(by_sample.size(), 24u);  // every sample once across the ranks
  const size_t image = 24 * 24 * 3;
  for (size_t i = 0; i < one.labels.size(); ++i) {
    const std::vector<float> mine(one.images.begin() + i * image,
                                  one.images.begin() + (i + 1) * image);
    EXPECT_EQ(by_sample[one.labels[i]], mine) << "sample " << one.labels[i];
  }
}

TEST(DataJpegLoader, ACorruptImageNamesTheSplitAndIndex) {
  TempDir dir;
  Jpegs train = make_jpegs(6, 11);
  auto& b = train.bytes[4];
  for (size_t i = b.size() / 3; i < b.size() - 2; ++i) b[i] = static_cast<uint8_t>(i * 7);
  write_store(dir.file("s.h5"), train, nullptr, 24, 2);
  const ImageStore store(dir.file("s.h5"));
  LoaderOptions o = jpeg_options("train", 2);
  o.shuffle = false;
  Loader loader(store, o);
  loader.start_epoch(0);
  const std::string error = test::error_of([&] {
    while (loader.next()) {
    }
  });
  EXPECT_NE(error.find("split 'train' image 4: corrupt JPEG"), std::string::npos) << error;
  EXPECT_NE(error.find("inspect --read-all"), std::string::npos) << error;
}

TEST(DataJpegLoader, ACropSizeOnARawSplitIsRefused) {
  TempDir dir;
  {
    StoreWriter w(dir.file("raw.h5"), 4, 4, 1, {"a"}, "test");
    w.begin_split("train");
    const std::vector<uint8_t> px(16, 9);
    const int32_t label = 0;
    w.append(px.data(), &label, 1);
    w.commit();
  }
  const ImageStore store(dir.file("raw.h5"));
  LoaderOptions o;
  o.crop_h = o.crop_w = 8;
  EXPECT_NE(test::error_of([&] { Loader l(store, o); }).find("applies to JPEG stores only"),
            std::string::npos);
}

}  // namespace
}  // namespace ddpv
