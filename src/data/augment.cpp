// Random crop + flip + normalise, one image at a time, from uint8 HWC to float HWC.
#include "ddpv/data/augment.hpp"

#include <algorithm>
#include <cmath>

#include "ddpv/core/error.hpp"
#include "ddpv/core/rng.hpp"

namespace ddpv {
namespace {
constexpr uint64_t kAugmentStream =
    0x6175676d656e74ull;  // "augment": apart from the sampler's keys
}

AugmentDraw identity_draw(const AugmentOptions& options) {
  return AugmentDraw{options.pad, options.pad, false};
}

AugmentDraw draw_augmentation(const AugmentOptions& options, uint64_t seed, int64_t epoch,
                              int64_t sample_index) {
  Rng rng(derive_key(seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(sample_index),
                     kAugmentStream));
  AugmentDraw d = identity_draw(options);
  if (options.crop && options.pad > 0) {
    d.dy = static_cast<int>(rng.uniform_int(static_cast<uint32_t>(2 * options.pad + 1)));
    d.dx = static_cast<int>(rng.uniform_int(static_cast<uint32_t>(2 * options.pad + 1)));
  }
  if (options.flip) d.flip = (rng.next_u64() >> 63) != 0;
  return d;
}

NormalizeTable::NormalizeTable(int channels, const float* mean, const float* inv_std)
    : channels(channels) {
  DDPV_CHECK(channels >= 1 && channels <= 4, "augment: unsupported channel count ", channels);
  // Per channel, a byte maps to one of 256 floats: a lookup table replaces the arithmetic, and
  // the padding value (byte 0) comes from the same table.
  for (int c = 0; c < channels; ++c)
    for (int v = 0; v < 256; ++v)
      table[c][v] = (static_cast<float>(v) / 255.0f - mean[c]) * inv_std[c];
}

void augment_normalize(const uint8_t* src, int height, int width, int channels, int pad,
                       const AugmentDraw& draw, const float* mean, const float* inv_std,
                       float* dst) {
  augment_normalize(src, height, width, pad, draw, NormalizeTable(channels, mean, inv_std), dst);
}

void augment_normalize(const uint8_t* src, int height, int width, int pad, const AugmentDraw& draw,
                       const NormalizeTable& t, float* dst) {
  const int channels = t.channels;
  const auto& table = t.table;
  const int sy = draw.dy - pad, sx = draw.dx - pad;         // source offset of the crop
  if (channels == 1 && sy == 0 && sx == 0 && !draw.flip) {  // the identity draw, one channel
    for (int64_t i = 0; i < int64_t{height} * width; ++i) dst[i] = table[0][src[i]];
    return;
  }
  for (int y = 0; y < height; ++y) {
    float* out_row = dst + static_cast<size_t>(y) * width * channels;
    const int yy = y + sy;
    if (yy < 0 || yy >= height) {
      for (int x = 0; x < width; ++x)
        for (int c = 0; c < channels; ++c) out_row[x * channels + c] = table[c][0];
      continue;
    }
    const uint8_t* in_row = src + static_cast<size_t>(yy) * width * channels;
    for (int x = 0; x < width; ++x) {
      const int xc = draw.flip ? width - 1 - x : x;  // flip after crop, as PyTorch's order
      const int xx = xc + sx;
      float* o = out_row + x * channels;
      if (xx < 0 || xx >= width) {
        for (int c = 0; c < channels; ++c) o[c] = table[c][0];
      } else {
        const uint8_t* p = in_row + xx * channels;
        for (int c = 0; c < channels; ++c) o[c] = table[c][p[c]];
      }
    }
  }
}

namespace {
constexpr uint64_t kResizedCropStream = 0x7272632d63726f70ull;  // "rrc-crop"
// A uniform double in [0, 1) from 53 random bits (float's 24 would quantise small areas).
double uniform01(Rng& rng) { return static_cast<double>(rng.next_u64() >> 11) * 0x1p-53; }
}  // namespace

CropRegion draw_resized_crop(const ResizedCropOptions& o, int height, int width, uint64_t seed,
                             int64_t epoch, int64_t sample_index) {
  DDPV_CHECK(height > 0 && width > 0, "resized crop of an empty image");
  Rng rng(derive_key(seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(sample_index),
                     kResizedCropStream));
  CropRegion r;
  const double area = static_cast<double>(height) * width;
  const double log_lo = std::log(o.ratio_lo), log_hi = std::log(o.ratio_hi);
  bool found = false;
  for (int attempt = 0; attempt < 10 && !found; ++attempt) {
    const double target = area * (o.scale_lo + (o.scale_hi - o.scale_lo) * uniform01(rng));
    const double ratio = std::exp(log_lo + (log_hi - log_lo) * uniform01(rng));
    const int w = static_cast<int>(std::lround(std::sqrt(target * ratio)));
    const int h = static_cast<int>(std::lround(std::sqrt(target / ratio)));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      r.y = rng.uniform_int(static_cast<uint32_t>(height - h + 1));
      r.x = rng.uniform_int(static_cast<uint32_t>(width - w + 1));
      r.h = h, r.w = w;
      found = true;
    }
  }
  if (!found) {
    const double in_ratio = static_cast<double>(width) / height;
    int w = width, h = height;
    if (in_ratio < o.ratio_lo)
      h = std::clamp(static_cast<int>(std::lround(w / o.ratio_lo)), 1, height);
    else if (in_ratio > o.ratio_hi)
      w = std::clamp(static_cast<int>(std::lround(h * o.ratio_hi)), 1, width);
    r.y = (height - h) / 2, r.x = (width - w) / 2, r.h = h, r.w = w;
  }
  r.flip = o.flip && (rng.next_u64() >> 63) != 0;
  return r;
}

CropRegion center_crop_region(const ResizedCropOptions& o, int height, int width, int crop_h,
                              int crop_w) {
  DDPV_CHECK(height > 0 && width > 0 && crop_h > 0 && crop_w > 0, "centre crop of an empty image");
  const double resize_to = std::round(std::min(crop_h, crop_w) / o.eval_fraction);
  const double s = resize_to / std::min(height, width);  // the shorter side becomes resize_to
  CropRegion r;
  r.h = std::min<double>(height, crop_h / s);
  r.w = std::min<double>(width, crop_w / s);
  r.y = (height - r.h) / 2, r.x = (width - r.w) / 2;
  return r;
}

}  // namespace ddpv
