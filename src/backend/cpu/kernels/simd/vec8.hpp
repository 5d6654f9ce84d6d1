// Vectors of 8 floats (a GCC vector extension) for the CPU backend's own loops: one AVX
// register where the including file is compiled for AVX2, two SSE ones otherwise; and of 16
// floats where it is compiled for AVX-512. Internal linkage on purpose: each file gets copies
// built with its own instruction set, so an AVX2 copy can never stand in for the baseline one
// at link time.
#pragma once

#include <cstdint>

namespace ddpv::cpu {
namespace {  // NOLINT(google-build-namespaces): see above

using v8 = float __attribute__((vector_size(32)));

// Note [Vector loads and stores]: unaligned loads and stores through a vector of floats
// aligned to 4 bytes. A vector type shares its element type's alias set, so a store here can
// only change floats. std::memcpy, which this replaced, may change any object: after each
// store the compiler reloaded every loop bound and stride it read through a reference (a
// WinogradGeometry's channels, a lambda's captures), which cost three of the four Winograd
// transforms a large part of their time (docs/performance.md, "CPU engine").
using v8u = float __attribute__((vector_size(32), aligned(4)));
inline v8 load8(const float* p) { return *reinterpret_cast<const v8u*>(p); }
inline void store8(float* p, v8 v) { *reinterpret_cast<v8u*>(p) = v; }
inline v8 splat(float s) { return v8{s, s, s, s, s, s, s, s}; }

// 8 int32 lanes: a max pooling's window positions (Note [Max pooling fused into the
// convolution]); a comparison of v8 gives one too, for v8 selects (mask ? a : b).
using v8i = int32_t __attribute__((vector_size(32)));
using v8iu = int32_t __attribute__((vector_size(32), aligned(4)));
inline v8i load8i(const int32_t* p) { return *reinterpret_cast<const v8iu*>(p); }
inline void store8i(int32_t* p, v8i v) { *reinterpret_cast<v8iu*>(p) = v; }

// Loops written once for vectors of 8 and of 16 floats (Note [Wide Winograd transforms]) reach
// their loads, stores and broadcasts through Lanes<V>.
template <class V>
struct Lanes;
template <>
struct Lanes<v8> {
  static constexpr int n = 8;
  using Int = v8i;
  static v8 load(const float* p) { return load8(p); }
  static void store(float* p, v8 v) { store8(p, v); }
  static Int load_int(const int32_t* p) { return load8i(p); }
  static void store_int(int32_t* p, Int v) { store8i(p, v); }
  static v8 splat(float s) { return ddpv::cpu::splat(s); }
};

#if defined(__AVX512F__)
// 16 floats: one AVX-512 register. Only where the including file is compiled for AVX-512
// (kernels/winograd/isa_avx512.cpp): elsewhere a function taking one would change its calling
// convention.
using v16 = float __attribute__((vector_size(64)));
using v16u = float __attribute__((vector_size(64), aligned(4)));
using v16i = int32_t __attribute__((vector_size(64)));
using v16iu = int32_t __attribute__((vector_size(64), aligned(4)));
inline v16 load16(const float* p) { return *reinterpret_cast<const v16u*>(p); }
inline void store16(float* p, v16 v) { *reinterpret_cast<v16u*>(p) = v; }

template <>
struct Lanes<v16> {
  static constexpr int n = 16;
  using Int = v16i;
  static v16 load(const float* p) { return load16(p); }
  static void store(float* p, v16 v) { store16(p, v); }
  static Int load_int(const int32_t* p) { return *reinterpret_cast<const v16iu*>(p); }
  static void store_int(int32_t* p, Int v) { *reinterpret_cast<v16iu*>(p) = v; }
  static v16 splat(float s) { return v16{s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s}; }
};
#endif

// Note [Max pooling fused into the convolution]: the lanewise maximum of a window's `count`
// rectified values value(0), ..., value(count - 1) (vectors of either width), and the position
// of the first largest (a NaN wins, as in the pooling's own loops), -1 where that maximum is
// not positive; stored as Pool2dOp::positions_for says.
template <class Value>
inline __attribute__((always_inline)) void store_window_max(int count, Value value, float* max,
                                                            int32_t* position) {
  using V = decltype(value(0));
  using I = typename Lanes<V>::Int;
  V m = value(0);
  I at{};
  for (int q = 1; q < count; ++q) {
    const V v = value(q);
    const I take = v > m || v != v;
    m = take ? v : m;
    at = take ? I{} + q : at;
  }
  at = m > 0.0f ? at : I{} - 1;
  Lanes<V>::store(max, m);
  Lanes<V>::store_int(position, at);
}

}  // namespace
}  // namespace ddpv::cpu
