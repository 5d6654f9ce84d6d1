// Antialiased bilinear resampling and center crop for the image-folder converter.
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cmath>

#include "data/image_codec.hpp"
#include "ddpv/core/error.hpp"

namespace ddpv::codec {
namespace {

// For each output coordinate: the first source index and the normalised weights of a triangle
// kernel stretched by the downscale factor (Note [Resize]).
struct Taps {
  std::vector<int> first;
  std::vector<int> count;
  std::vector<float> weights;  // count[o] weights from o * max_taps
  int max_taps = 0;
};

// The taps mapping [start, start + extent) of a source of `in` pixels onto `out` pixels; with
// clip the kernel is cut at the window's (integer-rounded) edges, else at the image's.
Taps make_taps(int in, double start, double extent, int out, bool clip) {
  const double scale = static_cast<double>(out) / extent;
  const double stretch = std::max(1.0, 1.0 / scale);  // kernel width in source pixels
  const double support = stretch;                     // triangle has radius 1 before stretching
  const int min_i = clip ? std::max(0, static_cast<int>(std::floor(start))) : 0;
  const int max_i = clip ? std::min(in, static_cast<int>(std::ceil(start + extent))) : in;
  Taps t;
  t.max_taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.first.resize(static_cast<size_t>(out));
  t.count.resize(static_cast<size_t>(out));
  t.weights.assign(static_cast<size_t>(out) * t.max_taps, 0.0f);
  std::vector<double> w;
  for (int o = 0; o < out; ++o) {
    const double center = start + (o + 0.5) / scale;  // in source pixel units, edges at integers
    int lo = std::max(min_i, static_cast<int>(std::floor(center - support)));
    int hi = std::min(max_i, static_cast<int>(std::ceil(center + support)));
    hi = std::min(hi, lo + t.max_taps);
    if (hi <= lo) {  // a window thinner than a pixel at the image's edge
      lo = std::min(lo, in - 1);
      hi = lo + 1;
    }
    double total = 0.0;
    w.clear();
    for (int i = lo; i < hi; ++i) {
      const double d = std::abs((i + 0.5 - center) / stretch);
      w.push_back(std::max(0.0, 1.0 - d));
      total += w.back();
    }
    if (total <= 0.0) {  // cannot happen for in, out >= 1, but keep the weights well defined
      w.assign(w.size(), 0.0);
      w[0] = total = 1.0;
    }
    // Zero weights at the ends (upscaling's triangle spans 2 pixels of the 3 it touches) add
    // nothing to a sum but its work: dropped.
    while (w.size() > 1 && w.back() == 0.0) w.pop_back(), --hi;
    size_t lead = 0;
    while (lead + 1 < w.size() && w[lead] == 0.0) ++lead;
    w.erase(w.begin(), w.begin() + static_cast<std::ptrdiff_t>(lead));
    lo += static_cast<int>(lead);
    t.first[static_cast<size_t>(o)] = lo;
    t.count[static_cast<size_t>(o)] = hi - lo;
    for (size_t k = 0; k < w.size(); ++k)
      t.weights[static_cast<size_t>(o) * t.max_taps + k] = static_cast<float>(w[k] / total);
  }
  return t;
}

// The weights are positive and sum to 1, so a sum is in [0, 255] up to rounding: adding 0.5 and
// truncating rounds (lround's ties-away-from-zero, at a fraction of its cost).
inline uint8_t to_byte(float sum) {
  return static_cast<uint8_t>(std::min(static_cast<int>(sum + 0.5f), 255));
}

// Columns first: each output row is a weighted sum of whole source rows (over the columns the
// taps read), contiguous bytes that vectorise; then each of the dh rows is resampled to dw,
// which so runs on dh rows and not on all the source rows of the window, a pixel's three
// channels in one SSE register. Built for AVX2 too (not FMA: the sums round the same on every
// machine, so a store converted on one is the store converted on another).
__attribute__((target_clones("avx2", "default"))) void resample(const uint8_t* src, int sw, int c,
                                                                const Taps& tx, const Taps& ty,
                                                                uint8_t* dst, int dh, int dw,
                                                                std::vector<float>& mid) {
  const int col0 = tx.first[0] * c;
  const int col1 =
      (tx.first[static_cast<size_t>(dw - 1)] + tx.count[static_cast<size_t>(dw - 1)]) * c;
  const size_t mid_row = static_cast<size_t>(col1 - col0);
  // Every output sums the same number of taps, the most any has (the others' extra weights
  // are 0): a tap count that changes from pixel to pixel costs a mispredicted branch each time,
  // more than the sums themselves. Adding 0 * v leaves a sum as it was, so this rounds as the
  // exact count would. mid is padded with zeros for the taps past the row's end, and one
  // more float for the fourth lane of the last pixel's load.
  int taps = 1;
  for (int x = 0; x < dw; ++x) taps = std::max(taps, tx.count[static_cast<size_t>(x)]);
  mid.assign(mid_row + static_cast<size_t>(taps * c) + 1, 0.0f);
  float* __restrict m = mid.data();  // apart from src: bytes may alias anything otherwise
  for (int y = 0; y < dh; ++y) {
    const float* wy = ty.weights.data() + static_cast<size_t>(y) * ty.max_taps;
    const int first = ty.first[static_cast<size_t>(y)];
    std::fill(mid.begin(), mid.begin() + static_cast<std::ptrdiff_t>(mid_row), 0.0f);
    for (int k = 0; k < ty.count[static_cast<size_t>(y)]; ++k) {
      const uint8_t* __restrict in = src + static_cast<size_t>(first + k) * sw * c + col0;
      const float wk = wy[k];
      for (size_t i = 0; i < mid_row; ++i) m[i] += wk * static_cast<float>(in[i]);
    }
    uint8_t* out = dst + static_cast<size_t>(y) * dw * c;
    for (int x = 0; x < dw; ++x) {
      const float* w = tx.weights.data() + static_cast<size_t>(x) * tx.max_taps;
      const float* p = m + static_cast<size_t>(tx.first[static_cast<size_t>(x)]) * c - col0;
      const int n = taps;
      if (c == 3) {
        // One pixel's three channels in the lanes of one SSE register (the fourth lane reads the
        // next pixel, or the padding after the row, and is dropped): a multiply and an add per
        // tap, each lane summed in tap order as the scalar loop would.
#if defined(__SSE2__)
        __m128 acc = _mm_setzero_ps();
        for (int k = 0; k < n; ++k)
          acc = _mm_add_ps(acc, _mm_mul_ps(_mm_set1_ps(w[k]), _mm_loadu_ps(p + 3 * k)));
        alignas(16) int32_t r[4];
        _mm_store_si128(reinterpret_cast<__m128i*>(r),
                        _mm_cvttps_epi32(_mm_add_ps(acc, _mm_set1_ps(0.5f))));
        for (int ch = 0; ch < 3; ++ch) out[3 * x + ch] = static_cast<uint8_t>(std::min(r[ch], 255));
#else
        float a[3] = {0.0f, 0.0f, 0.0f};
        for (int k = 0; k < n; ++k)
          for (int ch = 0; ch < 3; ++ch) a[ch] += w[k] * p[3 * k + ch];
        for (int ch = 0; ch < 3; ++ch) out[3 * x + ch] = to_byte(a[ch]);
#endif
      } else {
        for (int ch = 0; ch < c; ++ch) {
          float acc = 0.0f;
          for (int k = 0; k < n; ++k) acc += w[k] * p[k * c + ch];
          out[x * c + ch] = to_byte(acc);
        }
      }
    }
  }
}

}  // namespace

void resize_bilinear_aa(const uint8_t* src, int sh, int sw, int c, uint8_t* dst, int dh, int dw) {
  std::vector<float> mid;
  resize_region(src, sh, sw, c, Region{0, 0, static_cast<double>(sh), static_cast<double>(sw)},
                true, dst, dh, dw, &mid);
}

void resize_region(const uint8_t* src, int sh, int sw, int c, const Region& region, bool clip,
                   uint8_t* dst, int dh, int dw, std::vector<float>* scratch) {
  DDPV_CHECK(sh > 0 && sw > 0 && dh > 0 && dw > 0 && c > 0, "resize: empty image");
  DDPV_CHECK(region.within(sh, sw), "resize: region outside the image");
  resample(src, sw, c, make_taps(sw, region.x, region.w, dw, clip),
           make_taps(sh, region.y, region.h, dh, clip), dst, dh, dw, *scratch);
}

Image resize_center_crop(const Image& src, int height, int width) {
  DDPV_CHECK(height > 0 && width > 0, "resize: bad target size ", height, "x", width);
  DDPV_CHECK(src.height > 0 && src.width > 0 && src.channels > 0, "resize: empty image");
  const double scale =
      std::max(static_cast<double>(height) / src.height, static_cast<double>(width) / src.width);
  // Note [Extreme aspect ratios]: resizing the whole image before cropping needs an image as
  // long as the source's aspect ratio makes it: a 1,000,000 x 1 PNG covering 32 x 32 would be
  // resized to 32 x 32,000,000 (3 GB) for a 32 x 32 crop. Where the resized image would hold
  // more than 4 crops, the source's centre of the crop's aspect ratio is cut first and resized
  // to the crop alone. Up to that ratio the result is what it always was (the antialiasing
  // kernel near the crop's edges then sees the pixels beyond them too).
  const double lh = src.height * scale, lw = src.width * scale;
  if (lh * lw > 4.0 * height * width) {
    const int ch = std::clamp(static_cast<int>(std::lround(height / scale)), 1, src.height);
    const int cw = std::clamp(static_cast<int>(std::lround(width / scale)), 1, src.width);
    const int sy = (src.height - ch) / 2, sx = (src.width - cw) / 2;
    std::vector<uint8_t> cut(static_cast<size_t>(ch) * cw * src.channels);
    const size_t cut_row = static_cast<size_t>(cw) * src.channels;
    for (int y = 0; y < ch; ++y)
      std::copy_n(src.pixels.data() + (static_cast<size_t>(y + sy) * src.width + sx) * src.channels,
                  cut_row, cut.data() + static_cast<size_t>(y) * cut_row);
    Image out;
    out.height = height;
    out.width = width;
    out.channels = src.channels;
    out.pixels.resize(static_cast<size_t>(height) * width * src.channels);
    resize_bilinear_aa(cut.data(), ch, cw, src.channels, out.pixels.data(), height, width);
    return out;
  }
  const int rh = std::max(height, static_cast<int>(std::lround(lh)));
  const int rw = std::max(width, static_cast<int>(std::lround(lw)));
  std::vector<uint8_t> resized(static_cast<size_t>(rh) * rw * src.channels);
  resize_bilinear_aa(src.pixels.data(), src.height, src.width, src.channels, resized.data(), rh,
                     rw);
  Image out;
  out.height = height;
  out.width = width;
  out.channels = src.channels;
  out.pixels.resize(static_cast<size_t>(height) * width * src.channels);
  const int y0 = (rh - height) / 2, x0 = (rw - width) / 2;
  const size_t row_bytes = static_cast<size_t>(width) * src.channels;
  for (int y = 0; y < height; ++y)
    std::copy_n(resized.data() + (static_cast<size_t>(y + y0) * rw + x0) * src.channels, row_bytes,
                out.pixels.data() + static_cast<size_t>(y) * row_bytes);
  return out;
}

}  // namespace ddpv::codec
