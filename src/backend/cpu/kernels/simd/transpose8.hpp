// Private to the CPU backend: 8 x 8 float transposes in AVX registers, for the layout changes
// that move channels between the innermost place and planes (Note [Relayout by transposes] in
// cpu_backend.cpp). Callers check __builtin_cpu_supports("avx2") first.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace ddpv::cpu {

__attribute__((target("avx2"))) inline void transpose8x8(__m256 (&r)[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// The 8 channels at src + s * stride + k (s < hw, k < 8) to planes[k * hw + s], and back.
__attribute__((target("avx2"))) inline void channels_to_planes_avx2(const float* src,
                                                                    int64_t stride, float* planes,
                                                                    int64_t hw) {
  int64_t s = 0;
  for (; s + 8 <= hw; s += 8) {
    __m256 r[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + (s + i) * stride);
    transpose8x8(r);
    for (int k = 0; k < 8; ++k) _mm256_storeu_ps(planes + k * hw + s, r[k]);
  }
  for (; s < hw; ++s)
    for (int k = 0; k < 8; ++k) planes[k * hw + s] = src[s * stride + k];
}

__attribute__((target("avx2"))) inline void planes_to_channels_avx2(const float* planes, int64_t hw,
                                                                    float* dst, int64_t stride) {
  int64_t s = 0;
  for (; s + 8 <= hw; s += 8) {
    __m256 r[8];
    for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(planes + k * hw + s);
    transpose8x8(r);
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(dst + (s + i) * stride, r[i]);
  }
  for (; s < hw; ++s)
    for (int k = 0; k < 8; ++k) dst[s * stride + k] = planes[k * hw + s];
}

// dst (cols x rows, row stride ld_dst) = the transpose of src (rows x cols, row stride
// ld_src), rows and cols multiples of 8.
__attribute__((target("avx2"))) inline void transpose_avx2(const float* src, int64_t ld_src,
                                                           int64_t rows, int64_t cols, float* dst,
                                                           int64_t ld_dst) {
  for (int64_t i0 = 0; i0 < rows; i0 += 8)
    for (int64_t j0 = 0; j0 < cols; j0 += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + (i0 + i) * ld_src + j0);
      transpose8x8(r);
      for (int j = 0; j < 8; ++j) _mm256_storeu_ps(dst + (j0 + j) * ld_dst + i0, r[j]);
    }
}

}  // namespace ddpv::cpu
