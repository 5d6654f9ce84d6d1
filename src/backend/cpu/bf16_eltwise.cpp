// Note [bf16 elementwise loops]: ReLU, its backward, the residual add and add + ReLU where every
// view is bf16 (the activations of --precision bf16 on oneDNN's path, Note [bf16 on oneDNN]).
// They compute what the generic loops of cpu_backend.cpp compute, element by element: widen to
// f32, apply the op, round to nearest even once (f32_to_bf16, NaN kept and quieted). Written
// on the bits and without branches, so that GCC vectorises them for the widest instruction set
// the CPU has (each loop is compiled three times below and picked at run time): the generic
// loops, which read and write through per-element functors, went through SSE2 and made these
// four passes cost more than the BatchNorms they sit between (docs/performance.md).
// ReLU and its backward need no arithmetic at all: their outputs are inputs or zero, so they
// select bits, and a value's rounding is itself (a NaN's, itself quieted).
#include <algorithm>
#include <cstdint>

#include "backend/cpu/cpu_ops.hpp"
#include "backend/cpu/team.hpp"
#include "ddpv/core/dtype.hpp"

namespace ddpv::cpu {
namespace {

constexpr uint16_t kAbs = 0x7fff, kInf = 0x7f80, kQuiet = 0x40;

// A bf16 value's own rounding: itself, or a NaN quieted.
[[gnu::always_inline]] inline uint16_t kept(uint16_t v) {
  return static_cast<uint16_t>((v & kAbs) > kInf ? v | kQuiet : v);
}

[[gnu::always_inline]] inline void relu_loop(int64_t n, const uint16_t* x, uint16_t* y) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t v = x[i];
    // x <= 0 (-0 included) gives +0; NaN is not <= 0 and is kept.
    const bool zero = static_cast<int16_t>(v) <= 0 && (v & kAbs) <= kInf;
    y[i] = zero ? uint16_t{0} : kept(v);
  }
}
[[gnu::always_inline]] inline void relu_backward_loop(int64_t n, const uint16_t* y,
                                                      const uint16_t* dy, uint16_t* dx) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t v = y[i], g = dy[i];
    const bool positive = static_cast<int16_t>(v) > 0 && v <= kInf;  // NaN is not > 0
    dx[i] = positive ? kept(g) : uint16_t{0};
  }
}
template <bool kRelu>
[[gnu::always_inline]] inline void add_loop(int64_t n, const uint16_t* a, const uint16_t* b,
                                            uint16_t* y) {
  for (int64_t i = 0; i < n; ++i) {
    float s = bf16_to_f32(a[i]) + bf16_to_f32(b[i]);
    if constexpr (kRelu) s = s <= 0.0f ? 0.0f : s;
    y[i] = f32_to_bf16(s);
  }
}

struct Loops {
  void (*relu)(int64_t, const uint16_t*, uint16_t*);
  void (*relu_backward)(int64_t, const uint16_t*, const uint16_t*, uint16_t*);
  void (*add)(int64_t, const uint16_t*, const uint16_t*, uint16_t*);
  void (*add_relu)(int64_t, const uint16_t*, const uint16_t*, uint16_t*);
};

#define DDPV_BF16_LOOPS(isa, attr)                                                                \
  attr void relu_##isa(int64_t n, const uint16_t* x, uint16_t* y) { relu_loop(n, x, y); }         \
  attr void relu_backward_##isa(int64_t n, const uint16_t* y, const uint16_t* dy, uint16_t* dx) { \
    relu_backward_loop(n, y, dy, dx);                                                             \
  }                                                                                               \
  attr void add_##isa(int64_t n, const uint16_t* a, const uint16_t* b, uint16_t* y) {             \
    add_loop<false>(n, a, b, y);                                                                  \
  }                                                                                               \
  attr void add_relu_##isa(int64_t n, const uint16_t* a, const uint16_t* b, uint16_t* y) {        \
    add_loop<true>(n, a, b, y);                                                                   \
  }                                                                                               \
  constexpr Loops k##isa{relu_##isa, relu_backward_##isa, add_##isa, add_relu_##isa};

DDPV_BF16_LOOPS(Avx512, [[gnu::target("avx512f,avx512bw,avx512vl,avx2,fma")]])
DDPV_BF16_LOOPS(Avx2, [[gnu::target("avx2,fma")]])
DDPV_BF16_LOOPS(Baseline, )
#undef DDPV_BF16_LOOPS

const Loops& loops() {
  static const Loops& l = __builtin_cpu_supports("avx512bw") ? kAvx512
                          : __builtin_cpu_supports("avx2")   ? kAvx2
                                                             : kBaseline;
  return l;
}

// f(begin, count) over [0, count) on the team where the count is worth it, one contiguous
// range a thread, the ranges' starts 64-element aligned.
template <class F>
void split(int64_t count, const F& f) {
  const bool worth_it = count >= kParallelMin;
  in_team(worth_it, [&] {  // Note [No team of one]
    const int64_t threads = t_alone ? 1 : omp_get_num_threads(), rank = team_rank();
    const int64_t per = ((count + threads - 1) / threads + 63) / 64 * 64;  // covers count
    const int64_t begin = std::min(count, rank * per), end = std::min(count, begin + per);
    if (end > begin) f(begin, end - begin);
  });
}

}  // namespace

void bf16_relu(int64_t count, const uint16_t* x, uint16_t* y) {
  split(count, [&](int64_t b, int64_t n) { loops().relu(n, x + b, y + b); });
}
void bf16_relu_backward(int64_t count, const uint16_t* y, const uint16_t* dy, uint16_t* dx) {
  split(count, [&](int64_t b, int64_t n) { loops().relu_backward(n, y + b, dy + b, dx + b); });
}
void bf16_add(int64_t count, const uint16_t* a, const uint16_t* b, uint16_t* y, bool relu) {
  const auto loop = relu ? loops().add_relu : loops().add;
  split(count, [&](int64_t s, int64_t n) { loop(n, a + s, b + s, y + s); });
}

}  // namespace ddpv::cpu
