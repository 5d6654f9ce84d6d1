// The one-dimensional Winograd transforms (Note [Paired points], Note [Known entries]) on
// vectors of channels, v8 or v16 (Note [Wide Winograd transforms]): the building blocks of the
// tile loops in kernels/winograd/per_isa_kernels.hpp and kernels/winograd/per_isa_single.hpp, which
// include this inside the namespace DDPV_WINOGRAD_ISA of their instruction set.
#ifndef DDPV_WINOGRAD_ISA
#error "define DDPV_WINOGRAD_ISA (the namespace of this instruction set) before including"
#endif

#include "backend/cpu/kernels/simd/vec8.hpp"

namespace ddpv::cpu::DDPV_WINOGRAD_ISA {
namespace {

template <int A, class V = v8>
struct Splat {
  V v[A * A];
  explicit Splat(const float* mat, int count) {
    for (int i = 0; i < count; ++i) v[i] = Lanes<V>::splat(mat[i]);
  }
};

// Note [Paired points]: the points come in pairs +x, -x after 0 and before infinity, so each
// transform splits into even and odd parts, as an FFT does: a row of at for the pair weights
// m(+x) and m(-x) by x^i and (-x)^i, i.e. their sum for even i and their difference for odd i;
// the rows of bt for +x and -x agree on even columns and are opposite on odd ones (and the row
// of 0 has even columns only, the row of infinity odd ones). The 1-D transforms below compute
// the shared parts once: 20 instead of 32 multiply-adds for at with alpha = 8, 38 instead of 64
// for bt, and likewise for the adjoints. Vectors are read and written with strides, so one
// helper serves the columns and the rows of a tile.

// Note [Paired points]: the sums and differences of the entries at the paired points +x and
// -x, positions 1 + 2q and 2 + 2q, q < P.
template <int P, class V>
inline void paired(const V* in, int is, V* sum, V* dif) {
  for (int q = 0; q < P; ++q) {
    sum[q] = in[(1 + 2 * q) * is] + in[(2 + 2 * q) * is];
    dif[q] = in[(1 + 2 * q) * is] - in[(2 + 2 * q) * is];
  }
}

// Note [Known entries]: beyond the pairing, some entries of the matrices are the same for
// every F(m, r) on these points, and the loops below use them instead of reading them:
//  - at: column 1 (the point 1, whose powers are all 1) is ones, and so is row 0 (x^0) but
//    for infinity's column, which is 1 in the last row only;
//  - bt: the rows of the paired points are 0 in columns 0 and A - 1; every row but
//    infinity's has a 1 in column A - 2, and infinity's row has its 1 in column A - 1.
// A 1 is an add where a multiply-add read a broadcast entry from the stack, a 0 is nothing:
// the transforms were bound by those reads (measured faster without them; docs/performance.md,
// "CPU engine"). winograd_known_entries checks the matrices once per convolution, so a change
// of points cannot silently break this.

// out[i] = sum over k < A of at[i][k] in[k], i < M
template <int A, int M, class V>
inline void at_1d(const V* at, const V* in, int is, V* out, int os) {
  constexpr int P = (A - 2) / 2;
  V sum[P], dif[P];
  paired<P>(in, is, sum, dif);
  for (int i = 0; i < M; ++i) {
    V acc = i % 2 == 0 ? sum[0] : dif[0];  // column 1: ones
    if (i == 0) {
      acc += in[0];
      for (int q = 1; q < P; ++q) acc += sum[q];  // row 0: ones
    } else {
      for (int q = 1; q < P; ++q) acc += at[i * A + 1 + 2 * q] * (i % 2 == 0 ? sum[q] : dif[q]);
    }
    if (i == M - 1) acc += in[(A - 1) * is];
    out[i * os] = acc;
  }
}

// out[k] = sum over i < M of at[i][k] in[i], k < A (the adjoint of at_1d)
template <int A, int M, class V>
inline void at_adjoint_1d(const V* at, const V* in, int is, V* out, int os) {
  constexpr int P = (A - 2) / 2;
  out[0] = in[0];
  for (int q = 0; q < P; ++q) {
    V even = in[0], odd{};  // row 0: ones
    for (int i = 1; i < M; ++i) {
      const V term = q == 0 ? in[i * is] : at[i * A + 1 + 2 * q] * in[i * is];  // column 1: ones
      if (i % 2 == 0) {
        even += term;
      } else {
        odd += term;
      }
    }
    out[(1 + 2 * q) * os] = even + odd;
    out[(2 + 2 * q) * os] = even - odd;
  }
  out[(A - 1) * os] = in[(M - 1) * is];
}

// out[p] = sum over j < A of bt[p][j] in[j], p < A
template <int A, class V>
inline void bt_1d(const V* bt, const V* in, int is, V* out, int os) {
  constexpr int P = (A - 2) / 2;
  V first = in[(A - 2) * is], last = in[(A - 1) * is];  // their ones
  for (int j = 0; j < A - 2; j += 2) first += bt[j] * in[j * is];
  for (int j = 1; j < A - 1; j += 2) last += bt[(A - 1) * A + j] * in[j * is];
  out[0] = first;
  out[(A - 1) * os] = last;
  for (int q = 0; q < P; ++q) {
    const V* row = bt + (1 + 2 * q) * A;
    V even = in[(A - 2) * is], odd = row[1] * in[is];  // columns 0 and A - 1: zeros
    for (int j = 2; j < A - 2; j += 2) even += row[j] * in[j * is];
    for (int j = 3; j < A - 1; j += 2) odd += row[j] * in[j * is];
    out[(1 + 2 * q) * os] = even + odd;
    out[(2 + 2 * q) * os] = even - odd;
  }
}

// out[j] = sum over p < A of bt[p][j] in[p], j < A (the adjoint of bt_1d)
template <int A, class V>
inline void bt_adjoint_1d(const V* bt, const V* in, int is, V* out, int os) {
  constexpr int P = (A - 2) / 2;
  V sum[P], dif[P];
  paired<P>(in, is, sum, dif);
  out[0] = bt[0] * in[0];  // column 0: row 0 alone
  V ones = in[0];          // column A - 2: ones but for infinity's row
  for (int q = 0; q < P; ++q) ones += sum[q];
  out[(A - 2) * os] = ones;
  out[(A - 1) * os] = in[(A - 1) * is];  // column A - 1: infinity's one alone
  for (int j = 1; j < A - 2; ++j) {
    V acc{};
    if (j % 2 == 0) {
      acc = bt[j] * in[0];
      for (int q = 0; q < P; ++q) acc += bt[(1 + 2 * q) * A + j] * sum[q];
    } else {
      acc = bt[(A - 1) * A + j] * in[(A - 1) * is];
      for (int q = 0; q < P; ++q) acc += bt[(1 + 2 * q) * A + j] * dif[q];
    }
    out[j * os] = acc;
  }
}

}  // namespace
}  // namespace ddpv::cpu::DDPV_WINOGRAD_ISA
