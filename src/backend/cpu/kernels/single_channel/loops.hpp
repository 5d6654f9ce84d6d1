// The loops of the single-channel convolution (kernels/single_channel/conv2d.cpp), over one (image,
// channel group) item and over one channel group: written once and compiled twice by
// DDPV_SINGLE_CHANNEL_LOOPS, for AVX2 + FMA and for the baseline instruction set. Included by
// kernels/single_channel/conv2d.cpp alone: everything here has internal linkage.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <vector>

#include "backend/cpu/kernels/simd/vec8.hpp"
#include "backend/cpu/team.hpp"

namespace ddpv::cpu {
namespace {  // NOLINT(google-build-namespaces): see above

// Note [Single-channel convolution]: oneDNN 2.6 has no good kernel for a convolution from one
// channel: lenet's conv1 (1 -> 32 channels, 5x5 on 28x28) ran its backward-weights far below
// the FMA peak, and its NHWC output needed a reorder into the blocked layout both ways (Note
// [Mixed activation layouts]).
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
// compiled twice below: for AVX2 + FMA and for the baseline instruction set. A lambda does not
// take its enclosing function's target: those below carry the `attributes` themselves.
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

// Outputs [ox, ox + B) of row oy, channels [8 grp, 8 grp + 8 G): G x B accumulators in
// registers; each step loads G weight vectors (group j's at wg + j * k * k * 8) and broadcasts
// B inputs (Note [Two channel groups per run]).
template <int B, int G>
DDPV_INLINE void forward_run(const Geometry& g, const float* xp, const float* wg, const v8* b,
                             int oy, int ox, float* const* yrow, int64_t stride) {
  const int pw = g.w + 2 * g.p, kk = g.k * g.k;
  v8 acc[G][B];
  for (int j = 0; j < G; ++j)
    for (int o = 0; o < B; ++o) acc[j][o] = b[j];
  for (int ky = 0; ky < g.k; ++ky) {
    const float* xr = xp + int64_t{oy * g.s + ky} * pw + ox * g.s;
    for (int kx = 0; kx < g.k; ++kx) {
      v8 wv[G];
      for (int j = 0; j < G; ++j) wv[j] = load8(wg + (j * kk + ky * g.k + kx) * 8);
      for (int o = 0; o < B; ++o) {
        const float xv = xr[o * g.s + kx];
        for (int j = 0; j < G; ++j) acc[j][o] += xv * wv[j];
      }
    }
  }
  for (int j = 0; j < G; ++j)
    for (int o = 0; o < B; ++o) {
      if (g.relu) acc[j][o] = acc[j][o] <= 0.0f ? v8{} : acc[j][o];
      store8(yrow[j] + int64_t{ox + o} * stride, acc[j][o]);
    }
}

// Note [Two channel groups per run]: with one group of 8 channels a step of the run loads a
// weight vector and broadcasts 8 inputs for 8 FMAs, so the loads, not the FMAs, bound it
// (lenet's conv1 forward ran well below the FMA peak). Two groups share each broadcast input:
// 4 outputs x 2 groups load 2 weight vectors and broadcast 4 inputs for 8 FMAs, and 28
// outputs make 7 runs of 4 with no remainder. A lone last group keeps runs of 8 outputs.

// Row oy of channels [8 grp, 8 grp + 8 G), group j's output x at yrow[j] + x * stride.
template <int G>
DDPV_INLINE void forward_row(const Geometry& g, const float* xp, const float* wg, const v8* b,
                             int oy, float* const* yrow, int64_t stride) {
  int ox = 0;
  if constexpr (G == 1) {
    for (; ox + 8 <= g.ow; ox += 8) forward_run<8, 1>(g, xp, wg, b, oy, ox, yrow, stride);
  }
  for (; ox + 4 <= g.ow; ox += 4) forward_run<4, G>(g, xp, wg, b, oy, ox, yrow, stride);
  for (; ox < g.ow; ++ox) forward_run<1, G>(g, xp, wg, b, oy, ox, yrow, stride);
}

// Groups [grp, grp + G) of output channels (8 each) of image i, from the padded image xp;
// wv: [cout/8][k][k][8]
template <int G>
DDPV_INLINE void forward_item(const Geometry& g, int i, int grp, const float* xp, const float* wv,
                              const float* bias, float* y) {
  const int kk = g.k * g.k;
  const float* wg = wv + int64_t{grp} * kk * 8;
  v8 b[G];
  float* yi[G];
  for (int j = 0; j < G; ++j) {
    b[j] = bias != nullptr ? load8(bias + (grp + j) * 8) : v8{};
    yi[j] = y + g.base(i, (grp + j) * 8);
  }
  for (int oy = 0; oy < g.oh; ++oy) {
    float* yrow[G];
    for (int j = 0; j < G; ++j) yrow[j] = yi[j] + int64_t{oy} * g.ow * g.block;
    forward_row<G>(g, xp, wg, b, oy, yrow, g.block);
  }
}

// Note [Max pooling fused into the convolution]: lenet's conv1 -> ReLU -> 2x2 max pooling
// wrote a 64x28x28x32 activation (6.4 MB) that only the pooling read, and the pooling's
// forward was bound by reading it back from memory. When the pooling tiles
// its input (kernel = stride, no padding) and applies the ReLU's backward (Note [ReLU folded
// into max pooling]), nothing else reads the convolution's output, so the convolution can pool
// its own rectified rows while they are in L1: K rows at a time into a small buffer, then the
// maximum of each window with its position (first largest, a NaN wins, -1 where the maximum is
// not positive), written where the pooling's own forward would write them. The pooling's
// backward then runs as after its own forward. The convolution's output is left unwritten.
constexpr int64_t kPooledRowsMax = 3 * 256 * 8;  // floats of the K-row buffer

// The fused pooling, recorded by fuse_max_pool: its geometry, where its output goes, and for
// the pooled weight gradient (Note [Pooled weight gradient], below) where each cell's patch is.
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

template <int G>
DDPV_INLINE void forward_pooled_item(const Geometry& g, const PooledGeometry& pg, int i, int grp,
                                     const float* xp, const float* wv, const float* bias,
                                     float* pooled, int32_t* positions) {
  const int kk = g.k * g.k, pk = pg.pk, ph = pg.ph, pw = pg.pw;
  const float* wg = wv + int64_t{grp} * kk * 8;
  v8 b[G];
  for (int j = 0; j < G; ++j) b[j] = bias != nullptr ? load8(bias + (grp + j) * 8) : v8{};
  alignas(32) float rows[G][kPooledRowsMax];
  for (int py = 0; py < ph; ++py) {
    for (int r = 0; r < pk; ++r) {
      float* yrow[G];
      for (int j = 0; j < G; ++j) yrow[j] = rows[j] + r * g.ow * 8;
      forward_row<G>(g, xp, wg, b, py * pk + r, yrow, 8);
    }
    for (int j = 0; j < G; ++j) {
      const int64_t base = pg.base(g, i, (grp + j) * 8);
      for (int px = 0; px < pw; ++px) {
        const float* win = rows[j] + px * pk * 8;
        const int64_t o = base + (int64_t{py} * pw + px) * g.block;
        store_window_max(
            pk * pk, [&](int q) { return load8(win + ((q / pk) * g.ow + q % pk) * 8); }, pooled + o,
            positions + o);
      }
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
// four) and the weight gradient read it back, 2 x 25 FMAs per output: together a sizeable share of
// lenet's step. Each pooled cell holds one gradient value v and the position q of its window's
// maximum (-1 where the ReLU let nothing through), so channel c's weight gradient gains v times the
// K x K input patch under that one output: K FMAs on rows of K taps (8 lanes, those past K unused),
// a quarter of the dense loop's work, reading only the pooled gradient. The bias gradient sums v
// over the live cells. Batches split by image into one slice per thread, each with its own sums,
// added in slice order (the same result for the same thread count).
// PooledGeometry, above, gives each cell's patch (cell_at) and each window position's offset
// (window_at). Where the CPU has AVX-512 and the runs hold 16 channels, a loop over channel
// vectors replaces these (Note [Pooled weight gradient by channel vectors]).

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

// One forward item: groups grp and grp + 1 of image i (Note [Two channel groups per run]), or
// grp alone when it is the last; pooled (with its positions) when pg is not null, else into y.
DDPV_INLINE void forward_groups(const Geometry& g, const PooledGeometry* pg, int i, int grp,
                                const float* xp, const float* wv, const float* bias, float* y,
                                int32_t* positions) {
  const float* xi = xp + i * image_of(g);
  const bool pair = grp + 1 < g.cout / 8;
  if (pg != nullptr) {
    if (pair) return forward_pooled_item<2>(g, *pg, i, grp, xi, wv, bias, y, positions);
    return forward_pooled_item<1>(g, *pg, i, grp, xi, wv, bias, y, positions);
  }
  if (pair) return forward_item<2>(g, i, grp, xi, wv, bias, y);
  forward_item<1>(g, i, grp, xi, wv, bias, y);
}

// The kernel sizes the pooled loops take (rows of K taps in one vector of 8).
bool pooled_loops_apply(int k) { return k == 3 || k == 5 || k == 7; }

// clang-format off
#define DDPV_SINGLE_CHANNEL_LOOPS(suffix, attributes)                                             \
  attributes void forward_##suffix(const Geometry& g, int n, const float* xp, const float* wv,   \
                                   const float* bias, float* y) {                                \
    const bool big = int64_t{n} * g.oh * g.ow * g.cout >= (1 << 16);                             \
    in_team(big, [&]() attributes { /* Note [No team of one] */                                  \
      _Pragma("omp for collapse(2) schedule(static)")                                            \
      for (int i = 0; i < n; ++i)                                                                \
        for (int grp = 0; grp < g.cout / 8; grp += 2)                                            \
          forward_groups(g, nullptr, i, grp, xp, wv, bias, y, nullptr);                          \
    });                                                                                          \
  }                                                                                              \
  attributes void forward_pooled_##suffix(const Geometry& g, const PooledGeometry& pg, int n,    \
                                          const float* xp, const float* wv, const float* bias,   \
                                          float* pooled, int32_t* positions) {                   \
    const bool big = int64_t{n} * g.oh * g.ow * g.cout >= (1 << 16);                             \
    in_team(big, [&]() attributes { /* Note [No team of one] */                                  \
      _Pragma("omp for collapse(2) schedule(static)")                                            \
      for (int i = 0; i < n; ++i)                                                                \
        for (int grp = 0; grp < g.cout / 8; grp += 2)                                            \
          forward_groups(g, &pg, i, grp, xp, wv, bias, pooled, positions);                       \
    });                                                                                          \
  }                                                                                              \
  attributes void weight_grad_##suffix(const Geometry& g, int n, const float* xp, const float* dy, \
                                       float* dwv, float* db) {                                  \
    const bool big = int64_t{n} * g.oh * g.ow * g.cout >= (1 << 16);                             \
    in_team(big, [&]() attributes { /* Note [No team of one] */                                  \
      _Pragma("omp for schedule(static)")                                                        \
      for (int grp = 0; grp < g.cout / 8; ++grp) weight_grad_group(g, n, grp, xp, dy, dwv, db);  \
    });                                                                                          \
  }                                                                                              \
  attributes void pooled_weight_grad_##suffix(const Geometry& g, const PooledGeometry& pg, int n, \
                                              const float* xp, const float* dpooled,             \
                                              const int32_t* positions, float* sums,             \
                                              int slices) {                                      \
    in_team(slices > 1, [&]() attributes { /* Note [No team of one] */                           \
      _Pragma("omp for schedule(static)")                                                        \
      for (int sl = 0; sl < slices; ++sl) {                                                      \
        const int i0 = static_cast<int>(int64_t{n} * sl / slices);                               \
        const int i1 = static_cast<int>(int64_t{n} * (sl + 1) / slices);                         \
        float* s = sums + sl * pg.slice(g);                                                      \
        switch (g.k) {                                                                           \
          case 3:                                                                                \
            pooled_weight_grad_images<3>(g, pg, i0, i1, xp, dpooled, positions, s);              \
            break;                                                                               \
          case 5:                                                                                \
            pooled_weight_grad_images<5>(g, pg, i0, i1, xp, dpooled, positions, s);              \
            break;                                                                               \
          default:                                                                               \
            pooled_weight_grad_images<7>(g, pg, i0, i1, xp, dpooled, positions, s);              \
        }                                                                                        \
      }                                                                                          \
    });                                                                                          \
  }

DDPV_SINGLE_CHANNEL_LOOPS(avx2, __attribute__((target("avx2,fma"))))
DDPV_SINGLE_CHANNEL_LOOPS(baseline, )
// clang-format on

}  // namespace
}  // namespace ddpv::cpu
