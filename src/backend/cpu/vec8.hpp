// Vectors of 8 floats (a GCC vector extension) for the CPU backend's own loops: one AVX
// register where the including file is compiled for AVX2, two SSE ones otherwise. Internal
// linkage on purpose: each file gets copies built with its own instruction set, so an AVX2
// copy can never stand in for the baseline one at link time.
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
// transforms 18-34% of their time (docs/performance-log.md, "conv2 + pool2 in the Winograd
// transforms; vector stores").
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

// Note [Max pooling fused into the convolution]: the lanewise maximum of a window's `count`
// rectified values value(0), ..., value(count - 1), and the position of the first largest (a
// NaN wins, as in the pooling's own loops), -1 where that maximum is not positive; stored as
// Pool2dOp::positions_for says.
template <class Value>
inline __attribute__((always_inline)) void store_window_max(int count, Value value, float* max,
                                                            int32_t* position) {
  v8 m = value(0);
  v8i at{};
  for (int q = 1; q < count; ++q) {
    const v8 v = value(q);
    const v8i take = v > m || v != v;
    m = take ? v : m;
    at = take ? v8i{} + q : at;
  }
  at = m > 0.0f ? at : v8i{} - 1;
  store8(max, m);
  store8i(position, at);
}

}  // namespace
}  // namespace ddpv::cpu
