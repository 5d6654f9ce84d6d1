// The single-channel convolution's pooled weight gradient compiled for AVX-512 (src/CMakeLists.txt
// adds the flags to this file alone); kernels/single_channel/conv2d.cpp calls it only where the CPU
// has it.
#include "backend/cpu/kernels/pooled_grad/pooled_grad.hpp"

#if defined(__AVX512F__)
#include <algorithm>

#include "backend/cpu/kernels/simd/vec8.hpp"

namespace ddpv::cpu {
namespace {

// Note [Pooled weight gradient by channel vectors]: the loops of Note [Pooled weight gradient]
// take one (image, channel, cell) at a time: its value v times the K x K patch under the
// window's maximum, K FMAs on rows of 8 lanes of which K are taps, after 5 loads of the patch's
// rows, the gradient, the position and two offset tables. They are bound by those loads, a
// visible share of lenet's step on AVX-512. Here a vector holds 16 channels of
// one cell instead: their values v and positions q, split into four vectors g_w = (q == w ? v :
// 0), one per window position w = (wy, wx) of the 2 x 2 pooling. Channel c's weight gradient at
// tap (ky, kx) gains sum_w g_w[c] x[cell + (ky + wy, kx + wx)]: each of the (K + 1)^2 inputs
// under the cell's four windows is broadcast once and multiplies the g_w of every (tap, window)
// pair it serves, into K x K accumulators of 16 channels that stay in registers over a slice's
// images. Four times the multiply-adds of the sparse loops (three of the four g_w lanes are
// zero), all of them full-width, and one load per input instead of one per tap and cell.
// Kernels 3 and 5 (9 and 25 accumulators of the 32 registers; 7 would need 49). Alternated
// with the build before (`ddpv-train --synthetic --profile-layers`, lenet, one thread), conv1's
// backward took about a third less time (docs/performance.md, "CPU engine").
template <int K>
void slice_sums(const PooledGradArgs& a, int i0, int i1, float* sums) {
  constexpr int S = K + 1;  // the inputs under a 2 x 2 window of outputs: S x S
  const int blocks = a.cout / a.block;
  const int64_t pwid = a.pwid;
  for (int c0 = 0; c0 < a.cout; c0 += 16) {
    v16 acc[K][K];
#pragma GCC unroll 8
    for (int ky = 0; ky < K; ++ky)
#pragma GCC unroll 8
      for (int kx = 0; kx < K; ++kx) acc[ky][kx] = v16{};
    v16 bias{};
    for (int i = i0; i < i1; ++i) {
      const float* xi = a.xp + i * a.image;
      const int64_t base = (int64_t{i} * blocks + c0 / a.block) * a.cells * a.block + c0 % a.block;
      const float* dp = a.dpooled + base;
      const int32_t* pos = a.positions + base;
      for (int e = 0; e < a.cells; ++e, dp += a.block, pos += a.block) {
        const v16 v = load16(dp);
        const v16i q = *reinterpret_cast<const v16iu*>(pos);
        const v16 zero{};
        bias += q >= 0 ? v : zero;
        v16 gw[2][2];
#pragma GCC unroll 2
        for (int wy = 0; wy < 2; ++wy)
#pragma GCC unroll 2
          for (int wx = 0; wx < 2; ++wx) gw[wy][wx] = q == 2 * wy + wx ? v : zero;
        // Rows 0-2 from x, 3-5 from x + 3 pwid: row r one index of pwid scaled 1 or 2 from
        // one of them, so no row needs a register of its own.
        const float* x = xi + a.cell_at[e];
        const float* x3 = x + 3 * pwid;
#pragma GCC unroll 8
        for (int r = 0; r < S; ++r) {
          const float* row = (r < 3 ? x : x3) + (r % 3) * pwid;
#pragma GCC unroll 8
          for (int s = 0; s < S; ++s) {
            const float xs = row[s];
#pragma GCC unroll 2
            for (int wy = 0; wy < 2; ++wy)
#pragma GCC unroll 2
              for (int wx = 0; wx < 2; ++wx) {
                const int ky = r - wy, kx = s - wx;
                if (ky >= 0 && ky < K && kx >= 0 && kx < K) acc[ky][kx] += gw[wy][wx] * xs;
              }
          }
        }
      }
    }
    for (int l = 0; l < 16; ++l) {
      float* d = sums + int64_t{c0 + l} * K * 8;
      for (int ky = 0; ky < K; ++ky)
        for (int kx = 0; kx < K; ++kx) d[ky * 8 + kx] = acc[ky][kx][l];
      sums[int64_t{a.cout} * K * 8 + c0 + l] = bias[l];
    }
  }
}

}  // namespace

bool pooled_weight_grad_avx512_takes(const PooledGradArgs& a) {
  static const bool cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
  return cpu && (a.k == 3 || a.k == 5) && a.block % 16 == 0 && a.cout % a.block == 0;
}

void pooled_weight_grad_avx512(const PooledGradArgs& a, int i0, int i1, float* sums) {
  std::fill(sums, sums + int64_t{a.cout} * (a.k * 8 + 1), 0.0f);
  if (a.k == 3) return slice_sums<3>(a, i0, i1, sums);
  slice_sums<5>(a, i0, i1, sums);
}

}  // namespace ddpv::cpu
#else
#include "ddpv/core/error.hpp"

namespace ddpv::cpu {
bool pooled_weight_grad_avx512_takes(const PooledGradArgs&) { return false; }
void pooled_weight_grad_avx512(const PooledGradArgs&, int, int, float*) {
  DDPV_FAIL("internal: pooled_weight_grad_avx512 called where it is not built");
}
}  // namespace ddpv::cpu
#endif
