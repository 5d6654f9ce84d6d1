// Conv2dOp for a single input channel (a grayscale stem such as lenet's conv1) on our own
// loops (Note [Single-channel convolution]).
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_ops.hpp"
#include "backend/cpu/vec8.hpp"
#include "backend/cpu/winograd.hpp"

namespace ddpv::cpu {
namespace {

// Note [Single-channel convolution]: oneDNN 2.6 has no good kernel for a convolution from one
// channel. On an AVX2 machine lenet's conv1 (1 -> 32 channels, 5x5 on 28x28, batch 64) took
// 2.0 ms forward and 4.5 ms backward-weights (18 GFLOP/s), and its NHWC output needed a
// reorder into the blocked layout both ways (1.5 ms each; Note [Mixed activation layouts]).
// These loops produce 8 output channels at a time, straight into the caller's layout: each
// output vector is the sum over the window of an input scalar times a vector of 8 weights, and
// the weight gradient sums dy vectors times input scalars, one row of dy (in L1) at a time.
// Backward-data, which a first layer never needs, is a plain loop.

struct Geometry {
  int h, w, oh, ow, k, s, p, cout, block;  // block: the output layout's (cout for NHWC)
  bool relu;                               // forward writes max(0, y) (Note [Fused ReLU])
  int64_t base(int64_t n, int c) const {   // channel c (a multiple of 8) of image n in y
    return ((n * (cout / block) + c / block) * oh * ow) * block + c % block;
  }
};

// The loops over one (image, channel group) item and over one channel group, written once and
// compiled twice below: for AVX2 + FMA and for the baseline instruction set.
#define DDPV_INLINE inline __attribute__((always_inline))

// The images with `p` zeros around each: n x (h + 2p) x (w + 2p), so that no window needs a
// bounds check.
void pad_images(const Geometry& g, int n, const float* x, float* xp) {
  const int pw = g.w + 2 * g.p, ph = g.h + 2 * g.p;
  std::fill(xp, xp + int64_t{n} * ph * pw, 0.0f);
  for (int i = 0; i < n; ++i)
    for (int y = 0; y < g.h; ++y)
      std::copy_n(x + (int64_t{i} * g.h + y) * g.w, g.w,
                  xp + (int64_t{i} * ph + y + g.p) * pw + g.p);
}

// Outputs [ox, ox + B) of row oy, channels [8 grp, 8 grp + 8): B accumulators in registers,
// each weight vector loaded once for all B.
template <int B>
DDPV_INLINE void forward_run(const Geometry& g, const float* xp, const float* wg, v8 b, int oy,
                             int ox, float* yrow) {
  const int pw = g.w + 2 * g.p;
  v8 acc[B];
  for (int j = 0; j < B; ++j) acc[j] = b;
  for (int ky = 0; ky < g.k; ++ky) {
    const float* xr = xp + int64_t{oy * g.s + ky} * pw + ox * g.s;
    for (int kx = 0; kx < g.k; ++kx) {
      const v8 wv = load8(wg + (ky * g.k + kx) * 8);
      for (int j = 0; j < B; ++j) acc[j] += xr[j * g.s + kx] * wv;
    }
  }
  for (int j = 0; j < B; ++j) {
    if (g.relu) acc[j] = acc[j] <= 0.0f ? v8{} : acc[j];
    store8(yrow + int64_t{ox + j} * g.block, acc[j]);
  }
}

// y for channels [8 grp, 8 grp + 8) of image i, from the padded image xp; wv: [cout/8][k][k][8]
DDPV_INLINE void forward_item(const Geometry& g, int i, int grp, const float* xp, const float* wv,
                              const float* bias, float* y) {
  const int kk = g.k * g.k;
  const float* wg = wv + int64_t{grp} * kk * 8;
  v8 b{};
  if (bias != nullptr) b = load8(bias + grp * 8);
  float* yi = y + g.base(i, grp * 8);
  for (int oy = 0; oy < g.oh; ++oy) {
    float* yrow = yi + int64_t{oy} * g.ow * g.block;
    int ox = 0;
    for (; ox + 4 <= g.ow; ox += 4) forward_run<4>(g, xp, wg, b, oy, ox, yrow);
    for (; ox < g.ow; ++ox) forward_run<1>(g, xp, wg, b, oy, ox, yrow);
  }
}

// d[kx] += sum over ox of the padded input row xr at ox * s + kx times dy at ox, kx < K: K
// independent accumulators (one would chain every FMA on the last).
template <int K>
DDPV_INLINE void weight_grad_row(const Geometry& g, const float* xr, const float* row, float* d) {
  v8 acc[K];
  for (int kx = 0; kx < K; ++kx) acc[kx] = v8{};
  for (int ox = 0; ox < g.ow; ++ox) {
    const v8 dv = load8(row + int64_t{ox} * g.block);
    const float* xo = xr + ox * g.s;
    for (int kx = 0; kx < K; ++kx) acc[kx] += xo[kx] * dv;
  }
  for (int kx = 0; kx < K; ++kx) store8(d + kx * 8, load8(d + kx * 8) + acc[kx]);
}

DDPV_INLINE void weight_grad_row_any(const Geometry& g, const float* xr, const float* row,
                                     float* d) {
  for (int kx = 0; kx < g.k; ++kx) {
    v8 acc{};
    for (int ox = 0; ox < g.ow; ++ox) acc += xr[ox * g.s + kx] * load8(row + int64_t{ox} * g.block);
    store8(d + kx * 8, load8(d + kx * 8) + acc);
  }
}

// The weight gradient of channel group grp (dwv: [cout / 8][k][k][8]) and its bias gradient,
// from the padded images xp.
DDPV_INLINE void weight_grad_group(const Geometry& g, int n, int grp, const float* xp,
                                   const float* dy, float* dwv, float* db) {
  const int kk = g.k * g.k, pw = g.w + 2 * g.p;
  const int64_t image = int64_t{g.h + 2 * g.p} * pw;
  float* dwg = dwv + int64_t{grp} * kk * 8;
  std::fill(dwg, dwg + kk * 8, 0.0f);
  v8 bacc{};
  for (int i = 0; i < n; ++i) {
    const float* dyi = dy + g.base(i, grp * 8);
    for (int oy = 0; oy < g.oh; ++oy) {
      const float* row = dyi + int64_t{oy} * g.ow * g.block;
      v8 racc{};  // by rows: a long running sum in float would lose digits
      for (int ox = 0; ox < g.ow; ++ox) racc += load8(row + int64_t{ox} * g.block);
      bacc += racc;
      for (int ky = 0; ky < g.k; ++ky) {
        const float* xr = xp + i * image + int64_t{oy * g.s + ky} * pw;
        float* d = dwg + ky * g.k * 8;
        switch (g.k) {
          case 3:
            weight_grad_row<3>(g, xr, row, d);
            break;
          case 5:
            weight_grad_row<5>(g, xr, row, d);
            break;
          case 7:
            weight_grad_row<7>(g, xr, row, d);
            break;
          default:
            weight_grad_row_any(g, xr, row, d);
        }
      }
    }
  }
  if (db != nullptr) store8(db + grp * 8, bacc);
}

// clang-format off
#define DDPV_SINGLE_CHANNEL_LOOPS(suffix, attributes)                                             \
  attributes void forward_##suffix(const Geometry& g, int n, const float* xp, const float* wv,   \
                                   const float* bias, float* y) {                               \
    const int64_t image = int64_t{g.h + 2 * g.p} * (g.w + 2 * g.p);                              \
    const bool big = int64_t{n} * g.oh * g.ow * g.cout >= (1 << 16);                            \
    _Pragma("omp parallel for collapse(2) schedule(static) if (big)")                            \
    for (int i = 0; i < n; ++i)                                                                  \
      for (int grp = 0; grp < g.cout / 8; ++grp)                                                 \
        forward_item(g, i, grp, xp + i * image, wv, bias, y);                                    \
  }                                                                                              \
  attributes void weight_grad_##suffix(const Geometry& g, int n, const float* xp, const float* dy, \
                                       float* dwv, float* db) {                                   \
    const bool big = int64_t{n} * g.oh * g.ow * g.cout >= (1 << 16);                            \
    _Pragma("omp parallel for schedule(static) if (big)")                                        \
    for (int grp = 0; grp < g.cout / 8; ++grp) weight_grad_group(g, n, grp, xp, dy, dwv, db);     \
  }

DDPV_SINGLE_CHANNEL_LOOPS(avx2, __attribute__((target("avx2,fma"))))
DDPV_SINGLE_CHANNEL_LOOPS(baseline, )
// clang-format on

const bool kAvx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");

class SingleChannelConv2d final : public Conv2dOp {
 public:
  SingleChannelConv2d(const CpuContext& ctx, const Conv2dConfig& cfg) : ctx_(ctx), cfg_(cfg) {
    g_ = {cfg.in_h,    cfg.in_w,         cfg.out_h(),
          cfg.out_w(), cfg.kernel,       cfg.stride,
          cfg.padding, cfg.out_channels, cfg.out_block > 0 ? cfg.out_block : cfg.out_channels,
          false};
    const size_t kk = size_t(cfg.kernel) * cfg.kernel;
    wv_.resize(kk * cfg.out_channels);
    db_.resize(size_t(cfg.out_channels));
  }

  std::string algorithm() const override { return "single-channel direct"; }
  bool fuse_relu() override {
    g_.relu = true;
    return true;
  }

  void forward(int n, const float* x, const float* w, const float* b, float* y) override {
    check_conv_forward(cfg_, n, b);
    ctx_.bind_threads();
    // w (Cout, 1, K, K) -> [Cout / 8][K][K][8]
    const int kk = g_.k * g_.k;
    for (int co = 0; co < g_.cout; ++co)
      for (int t = 0; t < kk; ++t) wv_[(size_t(co / 8) * kk + t) * 8 + co % 8] = w[co * kk + t];
    pad(n, x);
    (kAvx2 ? forward_avx2 : forward_baseline)(g_, n, xp_.data(), wv_.data(),
                                              cfg_.bias ? b : nullptr, y);
  }

  void backward(int n, const float* x, const float* w, const float* dy, float* dx, float* dw,
                float* db, bool accumulate) override {
    check_conv_backward(cfg_, n, dw, db);
    ctx_.bind_threads();
    const int kk = g_.k * g_.k;
    pad(n, x);
    (kAvx2 ? weight_grad_avx2 : weight_grad_baseline)(g_, n, xp_.data(), dy, wv_.data(),
                                                      cfg_.bias ? db_.data() : nullptr);
    for (int co = 0; co < g_.cout; ++co)
      for (int t = 0; t < kk; ++t) {
        const float v = wv_[(size_t(co / 8) * kk + t) * 8 + co % 8];
        dw[co * kk + t] = accumulate ? dw[co * kk + t] + v : v;
      }
    if (cfg_.bias)
      for (int co = 0; co < g_.cout; ++co) db[co] = accumulate ? db[co] + db_[co] : db_[co];
    if (dx != nullptr) data_grad(n, w, dy, dx);
  }

 private:
  void pad(int n, const float* x) {
    const size_t size = size_t(n) * (g_.h + 2 * g_.p) * (g_.w + 2 * g_.p);
    if (xp_.size() < size) xp_.resize(size);
    pad_images(g_, n, x, xp_.data());
  }

  // dx (N, H, W) = sum over the outputs each input feeds of dy times the weight between them.
  void data_grad(int n, const float* w, const float* dy, float* dx) const {
    const int kk = g_.k * g_.k;
    std::fill(dx, dx + int64_t{n} * g_.h * g_.w, 0.0f);
    for (int i = 0; i < n; ++i)
      for (int co = 0; co < g_.cout; ++co) {
        const float* d = dy + g_.base(i, co - co % 8) + co % 8;
        for (int oy = 0; oy < g_.oh; ++oy)
          for (int ox = 0; ox < g_.ow; ++ox) {
            const float v = d[(int64_t{oy} * g_.ow + ox) * g_.block];
            for (int ky = 0; ky < g_.k; ++ky) {
              const int iy = oy * g_.s - g_.p + ky;
              if (iy < 0 || iy >= g_.h) continue;
              for (int kx = 0; kx < g_.k; ++kx) {
                const int ix = ox * g_.s - g_.p + kx;
                if (ix < 0 || ix >= g_.w) continue;
                dx[(int64_t{i} * g_.h + iy) * g_.w + ix] += v * w[co * kk + ky * g_.k + kx];
              }
            }
          }
      }
  }

  CpuContext ctx_;
  Conv2dConfig cfg_;
  Geometry g_;
  std::vector<float> wv_, db_;  // weights (and their gradient) by 8 channels; bias gradient
  std::vector<float> xp_;       // the padded input (grow-only)
};

}  // namespace

bool single_channel_conv_applies(ConvAlgorithm algorithm, const Conv2dConfig& c) {
  return algorithm != ConvAlgorithm::kDirect && c.in_channels == 1 && c.out_channels % 8 == 0;
}

std::unique_ptr<Conv2dOp> make_single_channel_conv2d(const CpuContext& ctx,
                                                     const Conv2dConfig& cfg) {
  return std::make_unique<SingleChannelConv2d>(ctx, cfg);
}

}  // namespace ddpv::cpu
