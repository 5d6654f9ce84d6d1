// The inner loops of Winograd convolution (Note [Winograd convolution] in
// kernels/winograd/conv2d.cpp), as templates over the tile size. Included once by each of
// kernels/winograd/isa_avx512.cpp, kernels/winograd/isa_avx2.cpp and
// kernels/winograd/isa_generic.cpp, inside the namespace DDPV_WINOGRAD_ISA, which each compiles
// with its own instruction set; each then exposes its instances through winograd_kernels_<isa>().
//
// Every transform works on a vector of channels at once: 8 (a v8 of kernels/simd/vec8.hpp: one AVX
// register, or two SSE ones), contiguous in NHWC and in blocks of 8 or 16, so one loop serves
// every layout; in the AVX-512 build, 16 where they lie in runs of 16 (Note [Wide Winograd
// transforms]). The transform matrices are broadcast into vectors once per call.
#ifndef DDPV_WINOGRAD_ISA
#error "define DDPV_WINOGRAD_ISA (the namespace of this instruction set) before including"
#endif

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/cpu/kernels/simd/vec8.hpp"
#include "backend/cpu/kernels/winograd/per_isa_filter_gemm.hpp"
#include "backend/cpu/kernels/winograd/per_isa_prefetch.hpp"
#include "backend/cpu/kernels/winograd/per_isa_transforms_1d.hpp"
#include "backend/cpu/kernels/winograd/winograd.hpp"
#include "backend/cpu/team.hpp"

namespace ddpv::cpu::DDPV_WINOGRAD_ISA {
namespace {

// Where the channels from c (a multiple of 8) of image n start in an activation of `channels`
// channels, h x w, in blocks of `block`; consecutive positions are `block` floats apart.
inline int64_t group_base(int64_t n, int c, int channels, int block, int h, int w) {
  return ((n * (channels / block) + c / block) * h * w) * block + c % block;
}

// Runs f(n, ty, tx, grp) for every tile (ty, tx) of images [n0, n1) and every group of 8 of
// `channels`, tile by tile (each tile's groups together: their values share cache lines in
// the transformed buffers), images split between threads (input_adjoint's tiles overlap
// within an image, never across images).
template <int W, class F>
inline void for_each_tile(const WinogradGeometry& g, int channels, int n0, int n1, int64_t work,
                          const F& f) {
  in_team(work >= kParallelMin, [&] {  // Note [No team of one]
    team_for(n0, n1, [&](int n) {
      for (int ty = 0; ty < g.tiles_h; ++ty)
        for (int tx = 0; tx < g.tiles_w; ++tx)
          for (int grp = 0; grp < channels / W; ++grp) f(n, ty, tx, grp);
    });
  });
}

// Runs f(n, ty, grp) for every row of tiles ty of images [n0, n1) and every group of 8 of
// `channels`, images split between threads as for_each_tile does; f walks the row's tiles.
template <int W, class F>
inline void for_each_tile_row(const WinogradGeometry& g, int channels, int n0, int n1, int64_t work,
                              const F& f) {
  in_team(work >= kParallelMin, [&] {  // Note [No team of one]
    team_for(n0, n1, [&](int n) {
      for (int ty = 0; ty < g.tiles_h; ++ty)
        for (int grp = 0; grp < channels / W; ++grp) f(n, ty, grp);
    });
  });
}

// Note [Shared columns]: neighbouring tiles of a row overlap by A - M columns of the input, and
// the first pass of the input transform runs down the columns (s = bt d, column by column), so
// a column's transform is the same for both tiles. input walks a row of tiles and transforms
// only the M columns each tile adds, carrying the other A - M over from the tile before: for
// F(4x4, 5x5), 12 one-dimensional transforms per tile instead of 16, and each input column
// loaded by one tile of a row instead of two. The results are those of the tile by tile loop,
// bit for bit; under perf (model_bench --sgd 1 lenet) the input transform took a smaller share
// of the step (docs/performance.md, "CPU engine"). The adjoint (input_adjoint summing the
// tiles' row passes column by column, then one column pass per column of dx) did not pay: no
// gain for lenet in one form, slower in another, and slower for resnet20's F(4x4, 3x3), whose
// tiles share only 2 of 6 columns.
template <int A, int M, class V>
void input_v(const WinogradGeometry& g, const float* bt_in, const float* x, int n0, int n1,
             float* v) {
  using L = Lanes<V>;
  constexpr int W = L::n;
  const Splat<A, V> bt(bt_in, A * A);
  const int tw = g.tiles_w, h = g.in_h, w = g.in_w, groups = g.cin / W;
  const int64_t rows = int64_t{n1 - n0} * g.tiles(), ts = winograd_tile_stride(A, g.cin);
  const int64_t image = int64_t{h} * w * g.cin;
  const int items = g.tiles() * groups;
  for_each_tile_row<W>(g, g.cin, n0, n1, rows * ts, [&](int n, int ty, int grp) {
    const float* src = x + group_base(n, grp * W, g.cin, g.in_block, h, w);
    float* dst = v + int64_t{n - n0} * g.tiles() * ts + grp * W;
    const int64_t step = g.in_block;
    const int y0 = ty * M - g.pad;
    V s[A][A];  // s[p][j]: point p of the transform of the tile's column j
    for (int tx = 0; tx < tw; ++tx) {
      if (n + 1 < n1)  // Note [Prefetching the next region]
        prefetch_slice(x + (n + 1) * image, image * 4, (ty * groups + grp) * tw + tx, items);
      const int shared = tx > 0 ? A - M : 0;  // columns the tile before transformed
      if (tx > 0) {  // a count known at compile time: register moves, not a call to memcpy
        for (int p = 0; p < A; ++p)
          for (int j = 0; j < A - M; ++j) s[p][j] = s[p][j + M];
      }
      const int x0 = tx * M - g.pad;
      for (int j = shared; j < A; ++j) {
        const int xx = x0 + j;
        prefetch_block<0>(src, h, w, step, y0 + A, y0 + A + M, xx, xx + 1);  // the next row
        V d[A];
        for (int i = 0; i < A; ++i) {
          const int yy = y0 + i;
          const bool inside = yy >= 0 && yy < h && xx >= 0 && xx < w;
          d[i] = inside ? L::load(src + (int64_t{yy} * w + xx) * step) : V{};
        }
        bt_1d<A>(bt.v, d, 1, &s[0][j], A);  // down the column
      }
      V t[A][A];
      for (int p = 0; p < A; ++p) bt_1d<A>(bt.v, &s[p][0], 1, &t[p][0], 1);  // along the rows
      float* out = dst + (int64_t{ty} * tw + tx) * ts;
      for (int i = 0; i < A; ++i)
        for (int j = 0; j < A; ++j) L::store(out + (i * A + j) * g.cin, t[i][j]);
    }
  });
}

// Note [Max pooling fused into the convolution]: f(wy, wx, at) for each 2 x 2 window (wy, wx)
// of output tile (ty, tx) of image n, channels [8 grp, 8 grp + 8), with `at` its place in the
// pooling's output; windows past the pooled extent (an odd last row or column) are skipped.
template <int M, int W, class F>
inline void for_each_window(const WinogradGeometry& g, int n, int ty, int tx, int grp, const F& f) {
  const int ph = g.out_h / 2, pw = g.out_w / 2;
  const int64_t base = group_base(n, grp * W, g.cout, g.out_block, ph, pw);
  for (int wy = 0; wy < M / 2 && ty * (M / 2) + wy < ph; ++wy)
    for (int wx = 0; wx < M / 2 && tx * (M / 2) + wx < pw; ++wx)
      f(wy, wx, base + (int64_t{ty * (M / 2) + wy} * pw + tx * (M / 2) + wx) * g.out_block);
}

// The windows of a rectified output tile t: their maxima and positions.
template <int M, class V>
inline void pool_tile(const WinogradGeometry& g, const V (&t)[M][M], int n, int ty, int tx, int grp,
                      float* pooled, int32_t* positions) {
  static_assert(M % 2 == 0);
  for_each_window<M, Lanes<V>::n>(g, n, ty, tx, grp, [&](int wy, int wx, int64_t at) {
    store_window_max(
        4, [&](int q) { return t[2 * wy + q / 2][2 * wx + q % 2]; }, pooled + at, positions + at);
  });
}

// The adjoint of pool_tile: d = the pooled gradient at each window's recorded position, zero
// elsewhere (and where the ReLU closed the window).
template <int M, class V>
inline void unpool_tile(const WinogradGeometry& g, const float* dpooled, const int32_t* positions,
                        int n, int ty, int tx, int grp, V (&d)[M][M]) {
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < M; ++j) d[i][j] = V{};
  for_each_window<M, Lanes<V>::n>(g, n, ty, tx, grp, [&](int wy, int wx, int64_t at) {
    const V dv = Lanes<V>::load(dpooled + at);
    const auto q = Lanes<V>::load_int(positions + at);
    for (int k = 0; k < 4; ++k) d[2 * wy + k / 2][2 * wx + k % 2] = q == k ? dv : V{};
  });
}

// The end of output tile (ty, tx) t of image n, channels [8 grp, 8 grp + 8): plus the bias,
// rectified as g says, then pooled (g.pool) or stored into y, cut to the output's size.
template <int M, class V>
inline void finish_tile(const WinogradGeometry& g, V (&t)[M][M], V bias, int n, int ty, int tx,
                        int grp, float* y, int32_t* positions) {
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < M; ++j) {
      t[i][j] += bias;
      if (g.relu) t[i][j] = t[i][j] <= 0.0f ? V{} : t[i][j];
    }
  if constexpr (M % 2 == 0) {
    if (g.pool == 2) return pool_tile<M, V>(g, t, n, ty, tx, grp, y, positions);
  }
  const int h = g.out_h, w = g.out_w;
  float* dst = y + group_base(n, grp * Lanes<V>::n, g.cout, g.out_block, h, w);
  for (int i = 0; i < M && ty * M + i < h; ++i)
    for (int j = 0; j < M && tx * M + j < w; ++j)
      Lanes<V>::store(dst + (int64_t{ty * M + i} * w + tx * M + j) * g.out_block, t[i][j]);
}

// Note [Batch statistics from the convolution]: doubles, 8 lanes a vector, for the sums of a
// tile's outputs and of their squares; a tile's (at most 16 values a channel) are summed in
// floats first.
using d8 = double __attribute__((vector_size(64)));

inline void add_tile_stats(v8 sum, v8 squares, d8* acc) {
  acc[0] += __builtin_convertvector(sum, d8);
  acc[1] += __builtin_convertvector(squares, d8);
}

#if defined(__AVX512F__)
inline void add_tile_stats(v16 sum, v16 squares, d8* acc) {
  add_tile_stats(__builtin_shufflevector(sum, sum, 0, 1, 2, 3, 4, 5, 6, 7),
                 __builtin_shufflevector(squares, squares, 0, 1, 2, 3, 4, 5, 6, 7), acc);
  add_tile_stats(__builtin_shufflevector(sum, sum, 8, 9, 10, 11, 12, 13, 14, 15),
                 __builtin_shufflevector(squares, squares, 8, 9, 10, 11, 12, 13, 14, 15), acc + 2);
}
#endif

template <int A, int M, class V>
void output_v(const WinogradGeometry& g, const float* at_in, const float* mm, const float* bias,
              int n0, int n1, float* y, int32_t* positions, double* stats) {
  using L = Lanes<V>;
  constexpr int W = L::n, D = 2 * W / 8;  // d8 accumulators a group: sums, then squares
  const Splat<A, V> at(at_in, M * A);
  const int tw = g.tiles_w, groups = g.cout / W;
  const int64_t rows = int64_t{n1 - n0} * g.tiles(), ts = winograd_tile_stride(A, g.cout);
  const bool parallel = rows * ts >= kParallelMin;
  const int team = team_size(parallel);
  // Note [Batch statistics from the convolution]: each thread's sums, added in thread order.
  std::vector<d8> acc(stats != nullptr ? size_t(team) * groups * D : 0, d8{});
  in_team(parallel, [&] {  // Note [No team of one]
    d8* mine = acc.empty() ? nullptr : acc.data() + size_t(team_rank()) * groups * D;
    team_for(n0, n1, [&](int n) {
      for (int ty = 0; ty < g.tiles_h; ++ty)
        for (int tx = 0; tx < tw; ++tx)
          for (int grp = 0; grp < groups; ++grp) {
            const float* in =
                mm + (int64_t{n - n0} * g.tiles() + int64_t{ty} * tw + tx) * ts + grp * W;
            V d[A][A];
            for (int i = 0; i < A; ++i)
              for (int j = 0; j < A; ++j) d[i][j] = L::load(in + (i * A + j) * g.cout);
            V s[M][A], t[M][M];
            for (int j = 0; j < A; ++j) at_1d<A, M>(at.v, &d[0][j], A, &s[0][j], A);  // columns
            for (int i = 0; i < M; ++i) at_1d<A, M>(at.v, &s[i][0], 1, &t[i][0], 1);  // rows
            if (g.pool == 0)  // Note [Prefetching the next row of tiles]
              prefetch_block<1>(y + group_base(n, grp * W, g.cout, g.out_block, g.out_h, g.out_w),
                                g.out_h, g.out_w, g.out_block, (ty + 1) * M, (ty + 2) * M, tx * M,
                                (tx + 1) * M);
            finish_tile<M>(g, t, bias != nullptr ? L::load(bias + grp * W) : V{}, n, ty, tx, grp, y,
                           positions);
            if (mine == nullptr) continue;
            // Of what finish_tile stored: the part of the tile inside the output.
            const int hi = std::min(M, g.out_h - ty * M), wi = std::min(M, g.out_w - tx * M);
            V sum{}, squares{};
            for (int i = 0; i < M; ++i)
              for (int j = 0; j < M; ++j) {
                const V v = i < hi && j < wi ? t[i][j] : V{};
                sum += v;
                squares += v * v;
              }
            add_tile_stats(sum, squares, mine + grp * D);
          }
    });
  });
  for (int th = 0; th < team && stats != nullptr; ++th)
    for (int grp = 0; grp < groups; ++grp) {
      const d8* a = acc.data() + (size_t(th) * groups + grp) * D;
      for (int k = 0; k < W; ++k) {
        stats[grp * W + k] += a[2 * (k / 8)][k % 8];
        stats[g.cout + grp * W + k] += a[2 * (k / 8) + 1][k % 8];
      }
    }
}

// Note [Bias gradient in output_adjoint]: the bias gradient is the sum of the output gradient,
// which output_adjoint holds tile by tile in registers (with the pooling: routed by the
// positions, zero where the ReLU closed a window), so it adds each tile to its thread's sums
// instead of a separate pass over dy and the positions after the chunks (which read them back
// from L3). Threads' sums are added in thread order: the same result for
// the same thread count.
template <int A, int M, class V>
void output_adjoint_v(const WinogradGeometry& g, const float* at_in, const float* dy,
                      const int32_t* positions, int n0, int n1, float* dm, float* db) {
  using L = Lanes<V>;
  constexpr int W = L::n;
  const Splat<A, V> at(at_in, M * A);
  const int tw = g.tiles_w, h = g.out_h, w = g.out_w, groups = g.cout / W;
  const int64_t rows = int64_t{n1 - n0} * g.tiles(), ts = winograd_tile_stride(A, g.cout);
  // dy is the pooling's gradient with g.pool (its positions beside it), else the output's.
  const int64_t image = g.pool ? int64_t{h / 2} * (w / 2) * g.cout : int64_t{h} * w * g.cout;
  const int items = g.tiles() * groups;
  const bool parallel = rows * ts >= kParallelMin;
  const int team = team_size(parallel);
  std::vector<V> sums(db != nullptr ? size_t(team) * groups : 0);
  in_team(parallel, [&] {  // Note [No team of one]
    V* mine = sums.empty() ? nullptr : sums.data() + size_t(team_rank()) * groups;
    team_for(n0, n1, [&](int n) {
      for (int ty = 0; ty < g.tiles_h; ++ty)
        for (int tx = 0; tx < tw; ++tx)
          for (int grp = 0; grp < groups; ++grp) {
            if (n + 1 < n1) {  // Note [Prefetching the next region]
              const int item = (ty * tw + tx) * groups + grp;
              prefetch_slice(dy + (n + 1) * image, image * 4, item, items);
              if (g.pool) prefetch_slice(positions + (n + 1) * image, image * 4, item, items);
            }
            const float* src = dy + group_base(n, grp * W, g.cout, g.out_block, h, w);
            float* dst = dm + int64_t{n - n0} * g.tiles() * ts + grp * W;
            const int64_t step = g.out_block;
            V d[M][M];
            if (M % 2 == 0 && g.pool == 2) {
              unpool_tile<M, V>(g, dy, positions, n, ty, tx, grp, d);
            } else {
              for (int i = 0; i < M; ++i)
                for (int j = 0; j < M; ++j) {
                  const int yy = ty * M + i, xx = tx * M + j;
                  d[i][j] = yy < h && xx < w ? L::load(src + (int64_t{yy} * w + xx) * step) : V{};
                }
              // Note [Prefetching the next row of tiles]
              prefetch_block<0>(src, h, w, step, (ty + 1) * M, (ty + 2) * M, tx * M, (tx + 1) * M);
            }
            if (mine != nullptr) {  // Note [Bias gradient in output_adjoint]
              V sum{};
              for (int i = 0; i < M; ++i)
                for (int j = 0; j < M; ++j) sum += d[i][j];
              mine[grp] += sum;
            }
            V s[A][M], t[A][A];  // at^T d, then (at^T d) at
            for (int j = 0; j < M; ++j) at_adjoint_1d<A, M>(at.v, &d[0][j], M, &s[0][j], M);
            for (int k = 0; k < A; ++k) at_adjoint_1d<A, M>(at.v, &s[k][0], 1, &t[k][0], 1);
            float* out = dst + (int64_t{ty} * tw + tx) * ts;
            for (int k = 0; k < A; ++k)
              for (int l = 0; l < A; ++l) L::store(out + (k * A + l) * g.cout, t[k][l]);
          }
    });
  });
  if (db != nullptr)
    for (int t = 0; t < team; ++t)
      for (int grp = 0; grp < groups; ++grp)
        L::store(db + grp * W, L::load(db + grp * W) + sums[size_t(t) * groups + grp]);
}

template <int A, int M, class V>
void input_adjoint_v(const WinogradGeometry& g, const float* bt_in, const float* dv, int n0, int n1,
                     float* dx) {
  using L = Lanes<V>;
  constexpr int W = L::n;
  const Splat<A, V> bt(bt_in, A * A);
  const int tw = g.tiles_w, h = g.in_h, w = g.in_w;
  const int64_t rows = int64_t{n1 - n0} * g.tiles(), ts = winograd_tile_stride(A, g.cin);
  for_each_tile<W>(g, g.cin, n0, n1, rows * ts, [&](int n, int ty, int tx, int grp) {
    float* dst = dx + group_base(n, grp * W, g.cin, g.in_block, h, w);
    const float* src = dv + int64_t{n - n0} * g.tiles() * ts + grp * W;
    const int64_t step = g.in_block;
    const float* in = src + (int64_t{ty} * tw + tx) * ts;
    V d[A][A];
    for (int i = 0; i < A; ++i)
      for (int j = 0; j < A; ++j) d[i][j] = L::load(in + (i * A + j) * g.cin);
    V s[A][A], t[A][A];  // bt^T d, then (bt^T d) bt
    for (int j = 0; j < A; ++j) bt_adjoint_1d<A>(bt.v, &d[0][j], A, &s[0][j], A);
    for (int k = 0; k < A; ++k) bt_adjoint_1d<A>(bt.v, &s[k][0], 1, &t[k][0], 1);
    const int y0 = ty * M - g.pad, x0 = tx * M - g.pad;
    for (int k = 0; k < A; ++k) {
      const int yy = y0 + k;
      if (yy < 0 || yy >= h) continue;
      for (int l = 0; l < A; ++l) {
        const int xx = x0 + l;
        if (xx < 0 || xx >= w) continue;
        float* p = dst + (int64_t{yy} * w + xx) * step;
        L::store(p, L::load(p) + t[k][l]);
      }
    }
  });
}

// Note [Wide Winograd transforms]: where the file is built for AVX-512
// (kernels/winograd/isa_avx512.cpp), the transforms run on 16 channels a vector wherever a tile's
// channels lie in runs of 16: a channel count and a block that 16 divides (NHWC, or oneDNN's
// nChw16c, which the CPU backend picks on such a CPU). Each vector lane is one channel, so every
// value is computed by the same operations in the same order as with 8; half the instructions do
// the work. Elsewhere (8-channel blocks, a count such as 24) they run on 8. Under perf (model_bench
// --sgd 1, against the products' 6 x 32 blocks as the clock, since the machine's speed swings
// between runs) the four transforms took a sixth to a quarter less time in both models, a
// few percent of either step (docs/performance.md, "CPU engine"). They wait on memory more
// than on arithmetic, so halving the instructions does not halve them.
inline bool wide(int channels, int block) {
#if defined(__AVX512F__)
  return channels % 16 == 0 && block % 16 == 0;
#else
  (void)channels, (void)block;
  return false;
#endif
}

#if defined(__AVX512F__)
using Wide = v16;
#else
using Wide = v8;  // never taken: wide() is false
#endif

template <int A, int M>
void input(const WinogradGeometry& g, const float* bt, const float* x, int n0, int n1, float* v) {
  if (wide(g.cin, g.in_block)) return input_v<A, M, Wide>(g, bt, x, n0, n1, v);
  input_v<A, M, v8>(g, bt, x, n0, n1, v);
}

template <int A, int M>
void output(const WinogradGeometry& g, const float* at, const float* mm, const float* bias, int n0,
            int n1, float* y, int32_t* positions, double* stats) {
  if (wide(g.cout, g.out_block))
    return output_v<A, M, Wide>(g, at, mm, bias, n0, n1, y, positions, stats);
  output_v<A, M, v8>(g, at, mm, bias, n0, n1, y, positions, stats);
}

template <int A, int M>
void output_adjoint(const WinogradGeometry& g, const float* at, const float* dy,
                    const int32_t* positions, int n0, int n1, float* dm, float* db) {
  if (wide(g.cout, g.out_block))
    return output_adjoint_v<A, M, Wide>(g, at, dy, positions, n0, n1, dm, db);
  output_adjoint_v<A, M, v8>(g, at, dy, positions, n0, n1, dm, db);
}

template <int A, int M>
void input_adjoint(const WinogradGeometry& g, const float* bt, const float* dv, int n0, int n1,
                   float* dx) {
  if (wide(g.cin, g.in_block)) return input_adjoint_v<A, M, Wide>(g, bt, dv, n0, n1, dx);
  input_adjoint_v<A, M, v8>(g, bt, dv, n0, n1, dx);
}

}  // namespace
}  // namespace ddpv::cpu::DDPV_WINOGRAD_ISA

#include "backend/cpu/kernels/winograd/per_isa_single.hpp"

namespace ddpv::cpu::DDPV_WINOGRAD_ISA {
namespace {

template <int A, int M>
constexpr WinogradKernels kInstance{
    &input<A, M>, &output<A, M>, &output_adjoint<A, M>, &input_adjoint<A, M>,
    &gemm,        &filter<A, M>, &filter_adjoint<A, M>, &single_forward<A, M>};

}  // namespace

// The instances this project uses: F(2x2,3x3), F(4x4,3x3), F(2x2,5x5), F(4x4,5x5).
inline const WinogradKernels* kernels_for(int m, int r) {
  if (r == 3 && m == 2) return &kInstance<4, 2>;
  if (r == 3 && m == 4) return &kInstance<6, 4>;
  if (r == 5 && m == 2) return &kInstance<6, 2>;
  if (r == 5 && m == 4) return &kInstance<8, 4>;
  return nullptr;
}

}  // namespace ddpv::cpu::DDPV_WINOGRAD_ISA
