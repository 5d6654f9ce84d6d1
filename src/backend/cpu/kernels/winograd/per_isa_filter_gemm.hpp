// The Winograd loops other than the per-tile transforms: the filter transforms and the
// per-point GEMMs (Note [Winograd convolution] in kernels/winograd/conv2d.cpp). Included by
// kernels/winograd/per_isa_kernels.hpp, inside the namespace DDPV_WINOGRAD_ISA of its instruction
// set.
#ifndef DDPV_WINOGRAD_ISA
#error "define DDPV_WINOGRAD_ISA (the namespace of this instruction set) before including"
#endif

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cpu/kernels/simd/vec8.hpp"
#include "backend/cpu/kernels/winograd/winograd.hpp"
#include "backend/cpu/team.hpp"

namespace ddpv::cpu::DDPV_WINOGRAD_ISA {
namespace {

// Below kParallelMin (team.hpp) floats of work a loop runs on one thread, and so do the
// per-point products below kParallelGemmMin multiply-adds.
constexpr int64_t kParallelGemmMin = 1 << 20;

// Note [Filter transforms in registers]: u = g w g^T for each (input channel, 8 output
// channels) in vectors, the 5 x 5 filter gathered once from w's [cout][cin][r][r] and the
// 8 x 5 and 8 x 8 intermediates kept in registers and L1; and its adjoint dw = g^T du g. As
// generic loops over a runtime cout in kernels/winograd/conv2d.cpp (baseline instruction set, each
// intermediate row zeroed and accumulated in memory) they were a visible share of a lenet
// step.
// The transformed filters lie point after point, u[p][ci][co], so an input channel's values
// at one point are one run of cout floats: an input channel's output channels are done
// together, and each point's run written (or, in the adjoint, read) whole. With each
// (input channel, 8 output channels) on its own, the writes were 32 bytes per point, 8 KiB
// apart for lenet's conv2; whole runs measured a smaller share of both lenet's and resnet20's
// profiles (docs/performance.md, "CPU engine").

// u[p][ci][co] = (g w[co][ci] g^T)[p], p = i a + j.
template <int A, int M>
void filter(const WinogradGeometry& geo, const float* gm, const float* w, float* u) {
  constexpr int R = A - M + 1;
  const int cin = geo.cin, cout = geo.cout, groups = cout / 8;
  in_team(int64_t{cin} * cout * A * A >= kParallelMin, [&] {  // Note [No team of one]
    std::vector<v8> gw(size_t(groups) * A * R);               // (g w) per group: [group][i][l]
#pragma omp for schedule(static)
    for (int ci = 0; ci < cin; ++ci) {
      for (int grp = 0; grp < groups; ++grp) {
        alignas(32) float f[R * R][8];
        for (int lane = 0; lane < 8; ++lane) {
          const float* src = w + (int64_t{grp * 8 + lane} * cin + ci) * R * R;
          for (int kl = 0; kl < R * R; ++kl) f[kl][lane] = src[kl];
        }
        v8* t = gw.data() + size_t(grp) * A * R;
        for (int i = 0; i < A; ++i)
          for (int l = 0; l < R; ++l) {
            v8 acc{};
            for (int k = 0; k < R; ++k) acc += splat(gm[i * R + k]) * load8(f[k * R + l]);
            t[i * R + l] = acc;
          }
      }
      for (int i = 0; i < A; ++i)
        for (int j = 0; j < A; ++j) {
          float* dst = u + (int64_t{i * A + j} * cin + ci) * cout;
          for (int grp = 0; grp < groups; ++grp) {
            const v8* t = gw.data() + (size_t(grp) * A + i) * R;
            v8 acc{};
            for (int l = 0; l < R; ++l) acc += splat(gm[j * R + l]) * t[l];
            store8(dst + grp * 8, acc);
          }
        }
    }
  });
}

// dw = g^T du[.][ci][co] g, stored or added (Note [Filter transforms in registers]).
template <int A, int M>
void filter_adjoint(const WinogradGeometry& geo, const float* gm, const float* du, float* dw,
                    bool accumulate) {
  constexpr int R = A - M + 1;
  const int cin = geo.cin, cout = geo.cout, groups = cout / 8;
  in_team(int64_t{cin} * cout * A * A >= kParallelMin, [&] {  // Note [No team of one]
    std::vector<v8> gtdu(size_t(groups) * R * A);             // g^T du per group: [group][k][j]
#pragma omp for schedule(static)
    for (int ci = 0; ci < cin; ++ci) {
      std::fill(gtdu.begin(), gtdu.end(), v8{});
      for (int i = 0; i < A; ++i)
        for (int j = 0; j < A; ++j) {
          const float* src = du + (int64_t{i * A + j} * cin + ci) * cout;
          for (int grp = 0; grp < groups; ++grp) {
            const v8 d = load8(src + grp * 8);
            v8* t = gtdu.data() + size_t(grp) * R * A;
            for (int k = 0; k < R; ++k) t[k * A + j] += splat(gm[i * R + k]) * d;
          }
        }
      for (int grp = 0; grp < groups; ++grp) {
        const v8* t = gtdu.data() + size_t(grp) * R * A;
        alignas(32) float f[R * R][8];
        for (int k = 0; k < R; ++k)
          for (int l = 0; l < R; ++l) {
            v8 acc{};
            for (int j = 0; j < A; ++j) acc += splat(gm[j * R + l]) * t[k * A + j];
            store8(f[k * R + l], acc);
          }
        for (int lane = 0; lane < 8; ++lane) {
          float* dst = dw + (int64_t{grp * 8 + lane} * cin + ci) * R * R;
          for (int kl = 0; kl < R * R; ++kl)
            dst[kl] = accumulate ? dst[kl] + f[kl][lane] : f[kl][lane];
        }
      }
    }
  });
}

// Note [Accumulators in registers]: GCC splits an array of vectors into registers (SRA)
// before it unrolls loops of a compile-time count, so the R x V accumulators of the blocks
// below stayed an array on the stack: each block zeroed or loaded it there, and after the k
// loop stored the registers back to it and copied it out to C, about 70 extra vector moves
// around a loop of 32-64 steps of 12 FMAs (objdump: 35 stack accesses in the AVX-512 6 x 2
// block, 46 in the AVX2 one). `#pragma GCC unroll` unrolls the loops over R and V early
// enough that the accumulators become registers (1 stack access left), and the wide blocks
// take `accumulate` as a template argument. Sums run in the same order. Alternated with the
// build before on AVX-512, the resnet20 step was shorter in model_bench and every Winograd
// layer faster against oneDNN's direct kernels in conv_bench (docs/performance.md, "CPU
// engine").

// Rows [i0, i0 + R) and columns [j0, j0 + 8 V) of one point's C: R x V vectors of
// accumulators in registers (6 x 2 leaves 3 of AVX2's 16 for B and A); each step of k loads V
// vectors of B and broadcasts R values of A.
template <int R, int V>
inline void gemm_block(const WinogradGemm& g, const float* a, const float* b, float* c) {
  v8 acc[R][V];  // Note [Accumulators in registers]
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) acc[r][v] = g.accumulate ? load8(c + r * g.ldc + 8 * v) : v8{};
  for (int64_t kk = 0; kk < g.k; ++kk) {
    const float* bk = b + kk * g.ldb;
    v8 bv[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) bv[v] = load8(bk + 8 * v);
    const float* ak = a + kk * g.a_col;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const v8 av = splat(ak[r * g.a_row]);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] += av * bv[v];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) store8(c + r * g.ldc + 8 * v, acc[r][v]);
}

template <int V>
inline void gemm_rows(const WinogradGemm& g, int64_t rows, const float* a, const float* b,
                      float* c) {
  switch (rows) {
    case 1:
      return gemm_block<1, V>(g, a, b, c);
    case 2:
      return gemm_block<2, V>(g, a, b, c);
    case 3:
      return gemm_block<3, V>(g, a, b, c);
    case 4:
      return gemm_block<4, V>(g, a, b, c);
    case 5:
      return gemm_block<5, V>(g, a, b, c);
    default:
      return gemm_block<6, V>(g, a, b, c);
  }
}

// Rows of the block at i0 of m rows: blocks of 6; a remainder of 1 to 5 shares the last 6 (32
// rows: 6 6 6 6 4 4, not 6 6 6 6 6 2, whose block of 2 holds too few accumulators to hide the
// FMA latency).
inline int64_t block_rows(int64_t m, int64_t i0) {
  const int64_t left = m - i0;
  return left > 6 && left < 12 ? (left + 1) / 2 : std::min<int64_t>(6, left);
}

#if defined(__AVX512F__)
// Note [Wide Winograd GEMMs]: where the CPU has AVX-512 (kernels/winograd/isa_avx512.cpp), the
// products run on 16-float vectors: blocks of 32 columns (two registers a row) and up to 6 rows,
// then one of 16 columns and up to 12 rows, each keeping 12 accumulators in flight (of 32
// registers); a 32-column step of k loads 2 vectors of B and broadcasts 6 values of A for 12
// multiply-adds. The 8-float blocks above do half the work per instruction, so an AVX-512 core
// with full-width units (whose sgemm peak is well over twice an AVX2 core's) ran them at about
// half its speed. The last 8 columns of an n that is not a multiple of 16 still take the
// 8-float blocks. Each entry is summed in the same order as there. AVX2 and AVX-512 loops
// alternated on an AVX-512 machine (model_bench --batch 64 --threads 1 --sgd 1): both models'
// steps shorter, resnet20 much nearer the sgemm peak (docs/performance.md, "CPU engine").
constexpr int64_t kWideRows = 12;

// Rows [0, R) and columns [0, 16 V) of C (row stride ldc) (+)= A B over k steps: A's entry
// (r, step) at a[r * a_row + step * a_col], B's row `step` at b + step * ldb.
template <int R, int V, bool Accumulate>
inline void gemm_block_wide(int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b,
                            int64_t ldb, float* c, int64_t ldc) {
  v16 acc[R][V];  // Note [Accumulators in registers]
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) acc[r][v] = Accumulate ? load16(c + r * ldc + 16 * v) : v16{};
  for (int64_t kk = 0; kk < k; ++kk) {
    v16 bv[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) bv[v] = load16(b + kk * ldb + 16 * v);
    const float* ak = a + kk * a_col;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] += ak[r * a_row] * bv[v];
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) store16(c + r * ldc + 16 * v, acc[r][v]);
}

// Blocks of up to kWideRows / V rows.
template <int V, int R = 1>
inline void gemm_rows_wide(int64_t rows, int64_t k, const float* a, int64_t a_row, int64_t a_col,
                           const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if constexpr (R < kWideRows / V) {
    if (rows > R)
      return gemm_rows_wide<V, R + 1>(rows, k, a, a_row, a_col, b, ldb, c, ldc, accumulate);
  }
  if (accumulate) return gemm_block_wide<R, V, true>(k, a, a_row, a_col, b, ldb, c, ldc);
  gemm_block_wide<R, V, false>(k, a, a_row, a_col, b, ldb, c, ldc);
}

// As block_rows, for blocks of up to `most` rows.
inline int64_t block_rows_wide(int64_t m, int64_t i0, int64_t most) {
  const int64_t left = m - i0;
  return left > most && left < 2 * most ? (left + 1) / 2 : std::min(most, left);
}

// Columns [0, n / 16 * 16) of one product: 32-column blocks of up to 6 rows (each step of k:
// 2 vectors of B, 6 broadcasts, 12 multiply-adds), then a 16-column one of up to 12 rows.
// B's rows are ldb floats apart.
inline void gemm_wide(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row, int64_t a_col,
                      const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  const int64_t n32 = n / 32 * 32, n16 = n / 16 * 16;
  for (int64_t i0 = 0, rows = 0; i0 < m && n32 > 0; i0 += rows) {
    rows = block_rows_wide(m, i0, kWideRows / 2);
    for (int64_t j0 = 0; j0 < n32; j0 += 32)
      gemm_rows_wide<2>(rows, k, a + i0 * a_row, a_row, a_col, b + j0, ldb, c + i0 * ldc + j0, ldc,
                        accumulate);
  }
  for (int64_t i0 = 0, rows = 0; i0 < m && n16 > n32; i0 += rows) {
    rows = block_rows_wide(m, i0, kWideRows);
    gemm_rows_wide<1>(rows, k, a + i0 * a_row, a_row, a_col, b + n32, ldb, c + i0 * ldc + n32, ldc,
                      accumulate);
  }
}
#endif

// One point's C (+)= A B in blocks of 6 rows x 16 columns, A, B and C as g says (Note [Wide
// Winograd GEMMs] where the CPU has AVX-512).
inline void gemm_point(const WinogradGemm& g, const float* a, const float* b, float* c) {
#if defined(__AVX512F__)
  const int64_t wide_n = g.n / 16 * 16;
  gemm_wide(g.m, g.n, g.k, a, g.a_row, g.a_col, b, g.ldb, c, g.ldc, g.accumulate);
  if (wide_n == g.n) return;
  for (int64_t i0 = 0, rows = 0; i0 < g.m; i0 += rows) {
    rows = block_rows(g.m, i0);
    gemm_rows<1>(g, rows, a + i0 * g.a_row, b + wide_n, c + i0 * g.ldc + wide_n);
  }
#else
  for (int64_t i0 = 0, rows = 0; i0 < g.m; i0 += rows) {
    rows = block_rows(g.m, i0);
    const float* ai = a + i0 * g.a_row;
    float* ci = c + i0 * g.ldc;
    int64_t j0 = 0;
    for (; j0 + 16 <= g.n; j0 += 16) gemm_rows<2>(g, rows, ai, b + j0, ci + j0);
    if (j0 < g.n) gemm_rows<1>(g, rows, ai, b + j0, ci + j0);
  }
#endif
}

// Note [Packed weight-gradient panels]: the weight gradient's products sum over tiles, which
// lie a whole tile's points apart in the transformed buffers (8-16 KiB for lenet's conv2), so
// each step of k read A and B from two new, far-apart cache lines, through strides the
// compiler knew nothing about. Run as they lie, they ran well below the forward products of
// the same size (one thread, hot caches, lenet's conv2 shapes, on AVX2). They now copy A^T and
// B first, up to 64 tiles at a time, into a buffer that stays in L1: A^T's rows one after
// another, B in micro-panels of 16 columns (8 for a last narrow one), step after step of k, so
// that a block reads B with a compile-time stride and both in order; that closed most of the
// gap, the copy included. Sums run in the same order as before.
// The AVX-512 loops no longer pack: with their accumulators in registers (Note [Accumulators
// in registers]) the copy cost more than the strided reads it saved (`model_bench --sgd 1`
// flipping between the two before every step: in place a few percent faster for lenet and
// resnet20). The AVX2 loops showed no consistent gain in place, so they keep the panels they
// were measured faster with (docs/performance.md, "CPU engine").
#if !defined(__AVX512F__)
constexpr int64_t kPanelRows = 64;

// C (R x 8V at c, row stride ldc) (+)= the packed panels: a: k steps of R values, b: k steps
// of 8V values.
template <int R, int V>
inline void gemm_block_packed(int64_t k, const float* a, int64_t lda, const float* b, float* c,
                              int64_t ldc, bool accumulate) {
  v8 acc[R][V];  // Note [Accumulators in registers]
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) acc[r][v] = accumulate ? load8(c + r * ldc + 8 * v) : v8{};
  for (int64_t kk = 0; kk < k; ++kk) {
    v8 bv[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) bv[v] = load8(b + kk * 8 * V + 8 * v);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const v8 av = splat(a[kk * lda + r]);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] += av * bv[v];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) store8(c + r * ldc + 8 * v, acc[r][v]);
}

template <int V>
inline void gemm_rows_packed(int64_t rows, int64_t k, const float* a, int64_t lda, const float* b,
                             float* c, int64_t ldc, bool accumulate) {
  switch (rows) {
    case 1:
      return gemm_block_packed<1, V>(k, a, lda, b, c, ldc, accumulate);
    case 2:
      return gemm_block_packed<2, V>(k, a, lda, b, c, ldc, accumulate);
    case 3:
      return gemm_block_packed<3, V>(k, a, lda, b, c, ldc, accumulate);
    case 4:
      return gemm_block_packed<4, V>(k, a, lda, b, c, ldc, accumulate);
    case 5:
      return gemm_block_packed<5, V>(k, a, lda, b, c, ldc, accumulate);
    default:
      return gemm_block_packed<6, V>(k, a, lda, b, c, ldc, accumulate);
  }
}

inline float* align64(float* p) {
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63});
}

// For products with a_row 1 (A^T stored row by row, k strided) and m and n multiples of 8.
void gemm_packed(const WinogradGemm& g) {
  in_team(g.points * g.m * g.n * g.k >= kParallelGemmMin, [&] {  // Note [No team of one]
    const int64_t kmax = std::min(g.k, kPanelRows);
    // Not zeroed (std::vector's value-initialisation was a memset of the panels per call).
    const std::unique_ptr<float[]> panel(new float[size_t(kmax * (g.m + g.n) + 16)]);
    float* const pa = align64(panel.get());
    float* const pb = pa + kmax * g.m;
    team_for(int64_t{0}, g.points, [&](int64_t p) {
      const float* a = g.a + p * g.a_point;
      const float* b = g.b + p * g.b_point;
      float* c = g.c + p * g.c_point;
      for (int64_t k0 = 0; k0 < g.k; k0 += kPanelRows) {
        const int64_t k = std::min(kPanelRows, g.k - k0);
        for (int64_t t = 0; t < k; ++t) {  // A^T: [k][m]
          const float* src = a + (k0 + t) * g.a_col;
          for (int64_t i = 0; i < g.m; i += 8) store8(pa + t * g.m + i, load8(src + i));
        }
        for (int64_t j0 = 0, w = 0; j0 < g.n; j0 += w) {  // B: [block][k][its width]
          w = std::min<int64_t>(16, g.n - j0);            // the width of the block that reads it
          float* dst = pb + j0 * k;
          for (int64_t t = 0; t < k; ++t) {
            const float* src = b + (k0 + t) * g.ldb + j0;
            for (int64_t v = 0; v < w; v += 8) store8(dst + t * w + v, load8(src + v));
          }
        }
        const bool accumulate = g.accumulate || k0 > 0;
        for (int64_t i0 = 0, rows = 0; i0 < g.m; i0 += rows) {
          rows = block_rows(g.m, i0);
          for (int64_t j0 = 0; j0 < g.n; j0 += 16) {
            float* ci = c + i0 * g.ldc + j0;
            if (j0 + 16 <= g.n) {
              gemm_rows_packed<2>(rows, k, pa + i0, g.m, pb + j0 * k, ci, g.ldc, accumulate);
            } else {
              gemm_rows_packed<1>(rows, k, pa + i0, g.m, pb + j0 * k, ci, g.ldc, accumulate);
            }
          }
        }
      }
    });
  });
}
#endif

// Note [Winograd GEMMs]: dnnl_sgemm ran the per-point products (64 rows, k and n of 32 to 64)
// well below its own peak, its packing and dispatch a large part of such small problems.
// Blocks of 6 rows x 16 columns with A and B read in place measured faster (docs/performance.md,
// "CPU engine"), and the points run in parallel. Without AVX-512, products whose k
// walks A's rows with a stride (the weight gradient's) go through packed panels first.
void gemm(const WinogradGemm& g) {
#if !defined(__AVX512F__)  // Note [Packed weight-gradient panels]
  if (g.a_row == 1 && g.a_col != 1 && g.m % 8 == 0 && g.n % 8 == 0) return gemm_packed(g);
#endif
  in_team(g.points * g.m * g.n * g.k >= kParallelGemmMin, [&] {  // Note [No team of one]
    team_for(int64_t{0}, g.points, [&](int64_t p) {
      gemm_point(g, g.a + p * g.a_point, g.b + p * g.b_point, g.c + p * g.c_point);
    });
  });
}

}  // namespace
}  // namespace ddpv::cpu::DDPV_WINOGRAD_ISA
