// The single-channel Winograd forward (Note [Single-channel Winograd forward]). Included by
// kernels/winograd/per_isa_kernels.hpp after its 1-D transforms and tile endings, which it uses,
// for each instruction set's namespace DDPV_WINOGRAD_ISA.
#ifndef DDPV_WINOGRAD_ISA
#error "define DDPV_WINOGRAD_ISA (the namespace of this instruction set) before including"
#endif

#include <cstdint>

#include "backend/cpu/kernels/simd/vec8.hpp"
#include "backend/cpu/kernels/winograd/winograd.hpp"
#include "backend/cpu/team.hpp"

namespace ddpv::cpu::DDPV_WINOGRAD_ISA {
namespace {

// Note [Single-channel Winograd forward]: lenet's conv1 (1 -> 32 channels, 5x5 on 28x28) ran
// on the direct single-channel loops (Note [Single-channel convolution]) near the FMA peak:
// 25 multiply-adds per output and group of 8 channels, a noticeable share of a training step
// and more of an evaluation's forward. With F(4x4, 5x5) a tile of 16 outputs takes 64 products
// and the output transform, about half the instructions. With one input channel there is no
// GEMM: a tile's transform V (64 values) is computed once for all output channels, and each
// group of 8 channels multiplies it by its transformed filters U and transforms the product
// back in registers. The input transform works on the tile's 8 rows as vectors (lanes are
// columns), transposes them, and transforms again (lanes are the rows' points). A row of
// tiles is transformed first and then run group by group, so that each group's output rows
// are written in order. Against the direct loops, forward_pooled of lenet's conv1 took about
// 40% less time, and lenet's best step was shorter in alternated model_bench --sgd 1 runs
// (docs/performance.md, "CPU engine").

// The 8 x 8 transpose of r (r[i] lane j -> r[j] lane i).
inline void transpose8(v8 (&r)[8]) {
  v8 t[8], u[8];
  for (int k = 0; k < 8; k += 2) {
    t[k] = __builtin_shufflevector(r[k], r[k + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[k + 1] = __builtin_shufflevector(r[k], r[k + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int k = 0; k < 8; k += 4)
    for (int h = 0; h < 2; ++h) {
      u[k + 2 * h] = __builtin_shufflevector(t[k + h], t[k + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
      u[k + 2 * h + 1] =
          __builtin_shufflevector(t[k + h], t[k + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  for (int k = 0; k < 4; ++k) {
    r[k] = __builtin_shufflevector(u[k], u[k + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    r[k + 4] = __builtin_shufflevector(u[k], u[k + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
}

// y (with g.pool: its pooling and positions) = the convolution of the one-channel images
// [n0, n1) of xp, zero-padded by g.pad ((in_h + 2 pad) x (in_w + 2 pad) each, read in rows of
// 8 floats: 8 floats of slack after the last image), with the transformed filters u[p][co]
// (filter with cin = 1), plus bias. out_h and out_w are multiples of M (whole tiles).
// V: the output channels' vector (Note [Wide Winograd transforms]); the input transform works
// on the tile's rows as v8 whatever V is.
template <int A, int M, class V>
void single_forward_v(const WinogradGeometry& g, const float* bt_in, const float* at_in,
                      const float* u, const float* xp, const float* bias, int n0, int n1, float* y,
                      int32_t* positions) {
  static_assert(A <= 8, "a tile's row is one vector");
  using L = Lanes<V>;
  constexpr int W = L::n;
  const Splat<A> bt(bt_in, A * A);
  const Splat<A, V> at(at_in, M * A);
  const int ph = g.in_h + 2 * g.pad, pw = g.in_w + 2 * g.pad, groups = g.cout / W;
  const int64_t work = int64_t{n1 - n0} * g.tiles() * A * A * g.cout;
  in_team(work >= kParallelMin, [&] {  // Note [No team of one]
#pragma omp for schedule(static)
    for (int n = n0; n < n1; ++n)
      for (int ty = 0; ty < g.tiles_h; ++ty) {
        // The row's tiles transformed first, then each group of channels along the row, so that
        // each group's output rows are written in order.
        alignas(32) float v[kSingleForwardRowTiles][8][8];
        const int tw = g.tiles_w;
        for (int tx = 0; tx < tw; ++tx) {
          const float* src = xp + (int64_t{n} * ph + ty * M) * pw + tx * M;
          v8 d[8], s[8];
          for (int i = 0; i < A; ++i) d[i] = load8(src + int64_t{i} * pw);
          bt_1d<A>(bt.v, d, 1, s, 1);  // s[p] lane j: column j's point p
          for (int p = A; p < 8; ++p) s[p] = v8{};
          transpose8(s);               // s[j] lane p
          bt_1d<A>(bt.v, s, 1, d, 1);  // d[q] lane p: V at point (p, q)
          for (int q = 0; q < A; ++q) store8(v[tx][q], d[q]);
        }
        for (int grp = 0; grp < groups; ++grp) {
          const float* ug = u + grp * W;
          const V b = bias != nullptr ? L::load(bias + grp * W) : V{};
          for (int tx = 0; tx < tw; ++tx) {
            V sm[M][A], t[M][M];
            for (int q = 0; q < A; ++q) {  // column q of the product, then of at (it) at^T
              V col[A];
              for (int p = 0; p < A; ++p) col[p] = v[tx][q][p] * L::load(ug + (p * A + q) * g.cout);
              at_1d<A, M>(at.v, col, 1, &sm[0][q], A);
            }
            for (int i = 0; i < M; ++i) at_1d<A, M>(at.v, &sm[i][0], 1, &t[i][0], 1);
            finish_tile<M>(g, t, b, n, ty, tx, grp, y, positions);
          }
        }
      }
  });
}

template <int A, int M>
void single_forward(const WinogradGeometry& g, const float* bt, const float* at, const float* u,
                    const float* xp, const float* bias, int n0, int n1, float* y,
                    int32_t* positions) {
  if (wide(g.cout, g.out_block))
    return single_forward_v<A, M, Wide>(g, bt, at, u, xp, bias, n0, n1, y, positions);
  single_forward_v<A, M, v8>(g, bt, at, u, xp, bias, n0, n1, y, positions);
}

}  // namespace
}  // namespace ddpv::cpu::DDPV_WINOGRAD_ISA
