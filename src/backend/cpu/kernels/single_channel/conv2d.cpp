// Conv2dOp for a single input channel (a grayscale stem such as lenet's conv1) on our own
// loops (Note [Single-channel convolution] in kernels/single_channel/loops.hpp).
#include <omp.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.hpp"
#include "backend/cpu/kernels/pooled_grad/pooled_grad.hpp"
#include "backend/cpu/kernels/simd/vec8.hpp"
#include "backend/cpu/kernels/single_channel/loops.hpp"
#include "backend/cpu/kernels/winograd/winograd.hpp"

namespace ddpv::cpu {
namespace {

const bool kAvx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");

class SingleChannelConv2d final : public FusableConv {
 public:
  SingleChannelConv2d(const CpuContext& ctx, const Conv2dConfig& cfg, bool baseline)
      : ctx_(ctx), cfg_(cfg), avx2_(kAvx2 && !baseline) {
    g_ = {cfg.in_h,    cfg.in_w,         cfg.out_h(),
          cfg.out_w(), cfg.kernel,       cfg.stride,
          cfg.padding, cfg.out_channels, cfg.out_block > 0 ? cfg.out_block : cfg.out_channels,
          false};
    const size_t kk = size_t(cfg.kernel) * cfg.kernel;
    wv_.resize(kk * cfg.out_channels);
    db_.resize(size_t(cfg.out_channels));
    init_winograd();
  }

  std::string algorithm() const override {
    if (wk_ == nullptr) return "single-channel direct";
    const std::string m = std::to_string(wg_.m), r = std::to_string(wg_.r);
    return "single-channel winograd F(" + m + "x" + m + "," + r + "x" + r + ")";
  }
  bool fuse_relu() override {
    g_.relu = wg_.relu = true;
    return true;
  }

  void forward_f32(int n, const float* x, const float* w, const float* b, float* y) override {
    check_conv_forward(cfg_, n, b);
    ctx_.bind_threads();
    pad(n, x);
    if (wk_ != nullptr) return winograd_forward(n, w, b, y, nullptr);
    pack_weights(w);
    (avx2_ ? forward_avx2 : forward_baseline)(g_, n, xp_.data(), wv_.data(),
                                              cfg_.bias ? b : nullptr, y);
  }

  bool fuse_max_pool(int kernel) override {
    if (!g_.relu || (kernel != 2 && kernel != 3) || g_.oh < kernel || g_.ow < kernel ||
        int64_t{kernel} * g_.ow * 8 > kPooledRowsMax) {
      return false;
    }
    // Note [Pooled weight gradient]
    const int pwid = g_.w + 2 * g_.p;
    pg_.pk = kernel;
    pg_.ph = g_.oh / kernel;
    pg_.pw = g_.ow / kernel;
    pg_.cell_at.clear();
    for (int py = 0; py < pg_.ph; ++py)
      for (int px = 0; px < pg_.pw; ++px)
        pg_.cell_at.push_back(py * kernel * g_.s * pwid + px * kernel * g_.s);
    pg_.window_at.clear();
    for (int q = 0; q < kernel * kernel; ++q)
      pg_.window_at.push_back(q / kernel * g_.s * pwid + q % kernel * g_.s);
    if (kernel != 2) wk_ = nullptr;  // the tiles pool 2 x 2 windows only
    return true;
  }

  void forward_pooled(int n, const float* x, const float* w, const float* b, float* pooled,
                      int32_t* positions) override {
    check_conv_forward(cfg_, n, b);
    DDPV_CHECK(pg_.pk > 0, "single-channel conv: forward_pooled without fuse_max_pool");
    ctx_.bind_threads();
    pad(n, x);
    if (wk_ != nullptr) return winograd_forward(n, w, b, pooled, positions);
    pack_weights(w);
    (avx2_ ? forward_pooled_avx2 : forward_pooled_baseline)(
        g_, pg_, n, xp_.data(), wv_.data(), cfg_.bias ? b : nullptr, pooled, positions);
  }

  void backward_pooled(int n, const float* x, const float* w, const float* dpooled,
                       const int32_t* positions, float* dx, float* dw, float* db,
                       bool accumulate) override {
    check_conv_backward(cfg_, n, dw, db);
    DDPV_CHECK(pg_.pk > 0, "single-channel conv: backward_pooled without fuse_max_pool");
    if (dx != nullptr || !pooled_loops_apply(g_.k)) {  // rare: through the dense gradient
      unpool(n, dpooled, positions);
      backward_f32(n, x, w, dense_.data(), dx, dw, db, accumulate);
      return;
    }
    ctx_.bind_threads();
    pad(n, x);
    const bool big = int64_t{n} * g_.oh * g_.ow * g_.cout >= (1 << 16);
    const int slices = big ? std::clamp(omp_get_max_threads(), 1, n) : 1;
    const int64_t slice = pg_.slice(g_), kk = int64_t{g_.k} * g_.k;
    sums_.resize(static_cast<size_t>(slices * slice));
    const PooledGradArgs args{.k = g_.k,
                              .cout = g_.cout,
                              .block = g_.block,
                              .cells = pg_.ph * pg_.pw,
                              .pwid = g_.w + 2 * g_.p,
                              .image = image_of(g_),
                              .cell_at = pg_.cell_at.data(),
                              .xp = xp_.data(),
                              .dpooled = dpooled,
                              .positions = positions};
    if (avx2_ && g_.s == 1 && pg_.pk == 2 && pooled_weight_grad_avx512_takes(args)) {
      in_team(slices > 1, [&] {  // Note [Pooled weight gradient by channel vectors]
#pragma omp for schedule(static)
        for (int sl = 0; sl < slices; ++sl)
          pooled_weight_grad_avx512(args, static_cast<int>(int64_t{n} * sl / slices),
                                    static_cast<int>(int64_t{n} * (sl + 1) / slices),
                                    sums_.data() + sl * slice);
      });
    } else {
      (avx2_ ? pooled_weight_grad_avx2 : pooled_weight_grad_baseline)(
          g_, pg_, n, xp_.data(), dpooled, positions, sums_.data(), slices);
    }
    const auto total = [&](int64_t at) {  // over the slices, in order
      float v = 0.0f;
      for (int sl = 0; sl < slices; ++sl) v += sums_[static_cast<size_t>(sl * slice + at)];
      return v;
    };
    for (int co = 0; co < g_.cout; ++co)
      for (int t = 0; t < kk; ++t) {
        const float v = total((int64_t{co} * g_.k + t / g_.k) * 8 + t % g_.k);
        dw[co * kk + t] = accumulate ? dw[co * kk + t] + v : v;
      }
    if (cfg_.bias)
      for (int co = 0; co < g_.cout; ++co) {
        const float v = total(int64_t{g_.cout} * g_.k * 8 + co);
        db[co] = accumulate ? db[co] + v : v;
      }
  }

  void backward_f32(int n, const float* x, const float* w, const float* dy, float* dx, float* dw,
                    float* db, bool accumulate) override {
    check_conv_backward(cfg_, n, dw, db);
    ctx_.bind_threads();
    const int kk = g_.k * g_.k;
    pad(n, x);
    (avx2_ ? weight_grad_avx2 : weight_grad_baseline)(g_, n, xp_.data(), dy, wv_.data(),
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
  // Note [Single-channel Winograd forward]: F(4x4, r x r) where the forward is stride 1, the
  // kernel 3 or 5 and the output whole tiles; the backward stays on the direct loops (the
  // gradients of the computed forward up to rounding, as for the Winograd convolution).
  // The backend never builds this op for the direct algorithm (single_channel_conv_applies);
  // a context that asks for it anyway gets the direct loops (the tests compare their copies).
  void init_winograd() {
    const int m = 4, r = g_.k;
    if (ctx_.conv == ConvAlgorithm::kDirect) return;
    if (g_.s != 1 || (r != 3 && r != 5) || g_.oh % m != 0 || g_.ow % m != 0) return;
    if (g_.ow / m > kSingleForwardRowTiles) return;
    wk_ = avx2_ ? winograd_kernels_fastest(m, r) : winograd_kernels_generic(m, r);
    if (wk_ == nullptr) return;
    wm_ = winograd_matrices(m, r);
    wg_ = winograd_geometry(cfg_, m);
    u_.resize(size_t(wm_.alpha) * wm_.alpha * g_.cout);
  }

  // y from the padded images in xp_; with positions, y is the 2 x 2 pooling of the output.
  void winograd_forward(int n, const float* w, const float* b, float* y, int32_t* positions) {
    if (weights_changed(u_of_, w, size_t(g_.cout) * g_.k * g_.k))
      wk_->filter(wg_, wm_.g.data(), w, u_.data());
    WinogradGeometry g = wg_;
    g.pool = positions != nullptr ? 2 : 0;
    wk_->single_forward(g, wm_.bt.data(), wm_.at.data(), u_.data(), xp_.data(),
                        cfg_.bias ? b : nullptr, 0, n, y, positions);
  }

  // w (Cout, 1, K, K) -> [Cout / 8][K][K][8]
  void pack_weights(const float* w) {
    const int kk = g_.k * g_.k;
    for (int co = 0; co < g_.cout; ++co)
      for (int t = 0; t < kk; ++t) wv_[(size_t(co / 8) * kk + t) * 8 + co % 8] = w[co * kk + t];
  }

  void pad(int n, const float* x) {
    // + 8: the pooled loops read rows of K taps as vectors of 8
    const size_t size = size_t(n) * (g_.h + 2 * g_.p) * (g_.w + 2 * g_.p) + 8;
    if (xp_.size() < size) xp_.resize(size);
    pad_images(g_, n, x, xp_.data());
  }

  // dense_ = the gradient of the convolution's output that the pooling's backward would give
  // (Note [Pooled weight gradient]).
  void unpool(int n, const float* dpooled, const int32_t* positions) {
    const int pk = pg_.pk;
    dense_.assign(size_t(n) * g_.oh * g_.ow * g_.cout, 0.0f);
    for (int i = 0; i < n; ++i)
      for (int c = 0; c < g_.cout; ++c)
        for (int py = 0; py < pg_.ph; ++py)
          for (int px = 0; px < pg_.pw; ++px) {
            const int64_t o = pg_.base(g_, i, c) + (int64_t{py} * pg_.pw + px) * g_.block;
            const int q = positions[o];
            if (q < 0) continue;
            const int oy = py * pk + q / pk, ox = px * pk + q % pk;
            dense_[g_.base(i, c) + (int64_t{oy} * g_.ow + ox) * g_.block] = dpooled[o];
          }
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
  bool avx2_;  // the AVX2 + FMA loops (else the baseline ones)
  Geometry g_;
  std::vector<float> wv_, db_;  // weights (and their gradient) by 8 channels; bias gradient
  std::vector<float> xp_;       // the padded input (grow-only)
  // The fused pooling (Note [Max pooling fused into the convolution]; pk 0: none) and the
  // offsets its backward uses (Note [Pooled weight gradient])
  PooledGeometry pg_;
  std::vector<float> sums_;   // its slices' sums
  std::vector<float> dense_;  // its dense gradient, where the pooled loops do not apply
  // The Winograd forward (null: the direct loops), its geometry and matrices, the transformed
  // filters and the weights they were transformed from.
  const WinogradKernels* wk_ = nullptr;
  WinogradGeometry wg_;
  WinogradMatrices wm_;
  std::vector<float> u_, u_of_;
};

}  // namespace

bool single_channel_conv_applies(ConvAlgorithm algorithm, const Conv2dConfig& c) {
  return algorithm != ConvAlgorithm::kDirect && c.in_channels == 1 && c.out_channels % 8 == 0;
}

std::unique_ptr<FusableConv> make_single_channel_conv2d(const CpuContext& ctx,
                                                        const Conv2dConfig& cfg, bool baseline) {
  return std::make_unique<SingleChannelConv2d>(ctx, cfg, baseline);
}

}  // namespace ddpv::cpu
