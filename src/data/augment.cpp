// Random crop + flip + normalise, one image at a time, from uint8 HWC to float HWC.
#include "ddpv/data/augment.hpp"

#include <algorithm>

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

}  // namespace ddpv
