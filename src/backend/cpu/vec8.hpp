// Vectors of 8 floats (a GCC vector extension) for the CPU backend's own loops: one AVX
// register where the including file is compiled for AVX2, two SSE ones otherwise. Internal
// linkage on purpose: each file gets copies built with its own instruction set, so an AVX2
// copy can never stand in for the baseline one at link time.
#pragma once

#include <cstring>

namespace ddpv::cpu {
namespace {  // NOLINT(google-build-namespaces): see above

using v8 = float __attribute__((vector_size(32)));

inline v8 load8(const float* p) {
  v8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, v8 v) { std::memcpy(p, &v, sizeof v); }
inline v8 splat(float s) { return v8{s, s, s, s, s, s, s, s}; }

}  // namespace
}  // namespace ddpv::cpu
