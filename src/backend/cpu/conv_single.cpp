// Conv2dOp for a single input channel (a grayscale stem such as lenet's conv1) on our own
// loops (Note [Single-channel convolution]).
#include <omp.h>

#include <algorithm>
#include <bit>
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
                             int ox, float* yrow, int64_t stride) {
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
    store8(yrow + int64_t{ox + j} * stride, acc[j]);
  }
}

// Row oy of channels [8 grp, 8 grp + 8), output x at yrow + x * stride.
DDPV_INLINE void forward_row(const Geometry& g, const float* xp, const float* wg, v8 b, int oy,
                             float* yrow, int64_t stride) {
  int ox = 0;
  for (; ox + 8 <= g.ow; ox += 8) forward_run<8>(g, xp, wg, b, oy, ox, yrow, stride);
  for (; ox + 4 <= g.ow; ox += 4) forward_run<4>(g, xp, wg, b, oy, ox, yrow, stride);
  for (; ox < g.ow; ++ox) forward_run<1>(g, xp, wg, b, oy, ox, yrow, stride);
}

// y for channels [8 grp, 8 grp + 8) of image i, from the padded image xp; wv: [cout/8][k][k][8]
DDPV_INLINE void forward_item(const Geometry& g, int i, int grp, const float* xp, const float* wv,
                              const float* bias, float* y) {
  const int kk = g.k * g.k;
  const float* wg = wv + int64_t{grp} * kk * 8;
  v8 b{};
  if (bias != nullptr) b = load8(bias + grp * 8);
  float* yi = y + g.base(i, grp * 8);
  for (int oy = 0; oy < g.oh; ++oy)
    forward_row(g, xp, wg, b, oy, yi + int64_t{oy} * g.ow * g.block, g.block);
}

// Note [Max pooling fused into the convolution]: lenet's conv1 -> ReLU -> 2x2 max pooling
// wrote a 64x28x28x32 activation (6.4 MB) that only the pooling read, and the pooling's
// forward (5% of the step) was bound by reading it back from memory. When the pooling tiles
// its input (kernel = stride, no padding) and applies the ReLU's backward (Note [ReLU folded
// into max pooling]), nothing else reads the convolution's output, so the convolution can pool
// its own rectified rows while they are in L1: K rows at a time into a small buffer, then the
// maximum of each window with its position (first largest, a NaN wins, -1 where the maximum is
// not positive), written where the pooling's own forward would write them. The pooling's
// backward then runs as after its own forward. The convolution's output is left unwritten.
constexpr int64_t kPooledRowsMax = 3 * 256 * 8;  // floats of the K-row buffer

DDPV_INLINE void forward_pooled_item(const Geometry& g, int pk, int i, int grp, const float* xp,
                                     const float* wv, const float* bias, float* pooled,
                                     int32_t* positions) {
  const int kk = g.k * g.k, ph = g.oh / pk, pw = g.ow / pk;
  const float* wg = wv + int64_t{grp} * kk * 8;
  v8 b{};
  if (bias != nullptr) b = load8(bias + grp * 8);
  alignas(32) float rows[kPooledRowsMax];
  const int64_t base = ((int64_t{i} * (g.cout / g.block) + grp * 8 / g.block) * ph * pw) * g.block +
                       grp * 8 % g.block;
  for (int py = 0; py < ph; ++py) {
    for (int r = 0; r < pk; ++r) forward_row(g, xp, wg, b, py * pk + r, rows + r * g.ow * 8, 8);
    for (int px = 0; px < pw; ++px) {
      const float* win = rows + px * pk * 8;
      const int64_t o = base + (int64_t{py} * pw + px) * g.block;
      store_window_max(
          pk * pk, [&](int q) { return load8(win + ((q / pk) * g.ow + q % pk) * 8); }, pooled + o,
          positions + o);
    }
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

inline int64_t image_of(const Geometry& g) { return int64_t{g.h + 2 * g.p} * (g.w + 2 * g.p); }

// Note [Pooled weight gradient]: after forward_pooled, the pooling's backward wrote the
// convolution's whole output gradient (lenet's conv1 at batch 64: 6.4 MB, three zeros in every
// four) and the weight gradient read it back, 2 x 25 FMAs per output: together 9% of lenet's
// step. Each pooled cell holds one gradient value v and the position q of its window's maximum
// (-1 where the ReLU let nothing through), so channel c's weight gradient gains v times the
// K x K input patch under that one output: K FMAs on rows of K taps (8 lanes, those past K
// unused), a quarter of the dense loop's work, reading only the pooled gradient. The bias
// gradient sums v over the live cells. Batches split by image into one slice per thread, each
// with its own sums, added in slice order (the same result for the same thread count).
struct PooledGeometry {
  int pk = 0;                      // the pooling's kernel (= stride)
  int ph = 0, pw = 0;              // pooled rows and columns
  std::vector<int32_t> cell_at;    // cell e: where its window's first output's patch starts in
                                   // the padded image
  std::vector<int32_t> window_at;  // position q of a window: where its output's patch starts,
                                   // from the window's first
  int64_t base(const Geometry& g, int64_t n, int c) const {  // channel c of image n, pooled
    return ((n * (g.cout / g.block) + c / g.block) * ph * pw) * g.block + c % g.block;
  }
  // Floats of one slice's sums: [cout][K][8] weights, then [cout] biases.
  int64_t slice(const Geometry& g) const { return int64_t{g.cout} * (g.k * 8 + 1); }
};

template <int K>
DDPV_INLINE void pooled_cell(const Geometry& g, const PooledGeometry& pg, const float* xpi,
                             const float* dp, const int32_t* pos, int e, v8* acc, float& b) {
  const int64_t o = int64_t{e} * g.block;
  // Without branches (which cells the ReLU closed is data): all ones where q >= 0, else zero.
  const int32_t q = pos[o], live = ~(q >> 31);
  const float v = std::bit_cast<float>(std::bit_cast<int32_t>(dp[o]) & live);
  const float* xr = xpi + pg.cell_at[e] + pg.window_at[q & live];
  const int pwid = g.w + 2 * g.p;
  b += v;
  for (int ky = 0; ky < K; ++ky) acc[ky] += v * load8(xr + ky * pwid);
}

// Adds channel c's sums over the cells of one image (padded: xpi; pooled gradient and
// positions from dp, pos, a cell every g.block) to d [K][8] and *db: two sets of accumulators,
// alternate cells.
template <int K>
DDPV_INLINE void pooled_weight_grad_channel(const Geometry& g, const PooledGeometry& pg,
                                            const float* xpi, const float* dp, const int32_t* pos,
                                            float* d, float* db) {
  v8 a0[K], a1[K];
  for (int ky = 0; ky < K; ++ky) a0[ky] = a1[ky] = v8{};
  float b0 = 0.0f, b1 = 0.0f;
  const int cells = pg.ph * pg.pw;
  int e = 0;
  for (; e + 2 <= cells; e += 2) {
    pooled_cell<K>(g, pg, xpi, dp, pos, e, a0, b0);
    pooled_cell<K>(g, pg, xpi, dp, pos, e + 1, a1, b1);
  }
  if (e < cells) pooled_cell<K>(g, pg, xpi, dp, pos, e, a0, b0);
  for (int ky = 0; ky < K; ++ky) store8(d + ky * 8, load8(d + ky * 8) + (a0[ky] + a1[ky]));
  *db += b0 + b1;
}

// One slice's sums (zeroed here) over images [i0, i1). (Taking every channel of a run of
// cells before the next run, to keep the run's cache lines in L1, measured slower: shorter
// loops.)
template <int K>
DDPV_INLINE void pooled_weight_grad_images(const Geometry& g, const PooledGeometry& pg, int i0,
                                           int i1, const float* xp, const float* dpooled,
                                           const int32_t* positions, float* sums) {
  float* bias_sums = sums + int64_t{g.cout} * K * 8;
  std::fill(sums, sums + pg.slice(g), 0.0f);
  for (int i = i0; i < i1; ++i)
    for (int c = 0; c < g.cout; ++c) {
      const int64_t o = pg.base(g, i, c);
      pooled_weight_grad_channel<K>(g, pg, xp + i * image_of(g), dpooled + o, positions + o,
                                    sums + int64_t{c} * K * 8, bias_sums + c);
    }
}

// The kernel sizes the pooled loops take (rows of K taps in one vector of 8).
bool pooled_loops_apply(int k) { return k == 3 || k == 5 || k == 7; }

// clang-format off
#define DDPV_SINGLE_CHANNEL_LOOPS(suffix, attributes)                                             \
  attributes void forward_##suffix(const Geometry& g, int n, const float* xp, const float* wv,   \
                                   const float* bias, float* y) {                               \
    const bool big = int64_t{n} * g.oh * g.ow * g.cout >= (1 << 16);                            \
    _Pragma("omp parallel for collapse(2) schedule(static) if (big)")                            \
    for (int i = 0; i < n; ++i)                                                                  \
      for (int grp = 0; grp < g.cout / 8; ++grp)                                                 \
        forward_item(g, i, grp, xp + i * image_of(g), wv, bias, y);                              \
  }                                                                                              \
  attributes void forward_pooled_##suffix(const Geometry& g, int pk, int n, const float* xp,     \
                                          const float* wv, const float* bias, float* pooled,    \
                                          int32_t* positions) {                                 \
    const bool big = int64_t{n} * g.oh * g.ow * g.cout >= (1 << 16);                            \
    _Pragma("omp parallel for collapse(2) schedule(static) if (big)")                            \
    for (int i = 0; i < n; ++i)                                                                  \
      for (int grp = 0; grp < g.cout / 8; ++grp)                                                 \
        forward_pooled_item(g, pk, i, grp, xp + i * image_of(g), wv, bias, pooled, positions);   \
  }                                                                                              \
  attributes void weight_grad_##suffix(const Geometry& g, int n, const float* xp, const float* dy, \
                                       float* dwv, float* db) {                                   \
    const bool big = int64_t{n} * g.oh * g.ow * g.cout >= (1 << 16);                            \
    _Pragma("omp parallel for schedule(static) if (big)")                                        \
    for (int grp = 0; grp < g.cout / 8; ++grp) weight_grad_group(g, n, grp, xp, dy, dwv, db);     \
  }                                                                                              \
  attributes void pooled_weight_grad_##suffix(const Geometry& g, const PooledGeometry& pg, int n, \
                                              const float* xp, const float* dpooled,             \
                                              const int32_t* positions, float* sums,             \
                                              int slices) {                                      \
    _Pragma("omp parallel for schedule(static) num_threads(slices) if (slices > 1)")             \
    for (int sl = 0; sl < slices; ++sl) {                                                        \
      const int i0 = static_cast<int>(int64_t{n} * sl / slices);                                 \
      const int i1 = static_cast<int>(int64_t{n} * (sl + 1) / slices);                           \
      float* s = sums + sl * pg.slice(g);                                                        \
      switch (g.k) {                                                                             \
        case 3:                                                                                  \
          pooled_weight_grad_images<3>(g, pg, i0, i1, xp, dpooled, positions, s);                \
          break;                                                                                 \
        case 5:                                                                                  \
          pooled_weight_grad_images<5>(g, pg, i0, i1, xp, dpooled, positions, s);                \
          break;                                                                                 \
        default:                                                                                 \
          pooled_weight_grad_images<7>(g, pg, i0, i1, xp, dpooled, positions, s);                \
      }                                                                                          \
    }                                                                                            \
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
    pack_weights(w);
    pad(n, x);
    (kAvx2 ? forward_avx2 : forward_baseline)(g_, n, xp_.data(), wv_.data(),
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
    return true;
  }

  void forward_pooled(int n, const float* x, const float* w, const float* b, float* pooled,
                      int32_t* positions) override {
    check_conv_forward(cfg_, n, b);
    DDPV_CHECK(pg_.pk > 0, "single-channel conv: forward_pooled without fuse_max_pool");
    ctx_.bind_threads();
    pack_weights(w);
    pad(n, x);
    (kAvx2 ? forward_pooled_avx2 : forward_pooled_baseline)(
        g_, pg_.pk, n, xp_.data(), wv_.data(), cfg_.bias ? b : nullptr, pooled, positions);
  }

  void backward_pooled(int n, const float* x, const float* w, const float* dpooled,
                       const int32_t* positions, float* dx, float* dw, float* db,
                       bool accumulate) override {
    check_conv_backward(cfg_, n, dw, db);
    DDPV_CHECK(pg_.pk > 0, "single-channel conv: backward_pooled without fuse_max_pool");
    if (dx != nullptr || !pooled_loops_apply(g_.k)) {  // rare: through the dense gradient
      unpool(n, dpooled, positions);
      backward(n, x, w, dense_.data(), dx, dw, db, accumulate);
      return;
    }
    ctx_.bind_threads();
    pad(n, x);
    const bool big = int64_t{n} * g_.oh * g_.ow * g_.cout >= (1 << 16);
    const int slices = big ? std::clamp(omp_get_max_threads(), 1, n) : 1;
    const int64_t slice = pg_.slice(g_), kk = int64_t{g_.k} * g_.k;
    sums_.resize(static_cast<size_t>(slices * slice));
    (kAvx2 ? pooled_weight_grad_avx2 : pooled_weight_grad_baseline)(
        g_, pg_, n, xp_.data(), dpooled, positions, sums_.data(), slices);
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
  Geometry g_;
  std::vector<float> wv_, db_;  // weights (and their gradient) by 8 channels; bias gradient
  std::vector<float> xp_;       // the padded input (grow-only)
  // The fused pooling (Note [Max pooling fused into the convolution]; pk 0: none) and the
  // offsets its backward uses (Note [Pooled weight gradient])
  PooledGeometry pg_;
  std::vector<float> sums_;   // its slices' sums
  std::vector<float> dense_;  // its dense gradient, where the pooled loops do not apply
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
