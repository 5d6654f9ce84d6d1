// xoshiro256** seeded through SplitMix64.
#include "ddpv/core/rng.hpp"

#include <cmath>

namespace ddpv {
namespace {
constexpr uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Rng::Rng(uint64_t key) {
  uint64_t x = key;
  for (auto& s : s_) {
    x += 0x9e3779b97f4a7c15ull;
    s = mix64(x);
  }
}

uint64_t Rng::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

uint32_t Rng::uniform_int(uint32_t bound) {
  // Lemire's multiply-shift with rejection: unbiased for every bound.
  uint64_t m = static_cast<uint64_t>(static_cast<uint32_t>(next_u64() >> 32)) * bound;
  uint32_t low = static_cast<uint32_t>(m);
  if (low < bound) {
    const uint32_t threshold = -bound % bound;
    while (low < threshold) {
      m = static_cast<uint64_t>(static_cast<uint32_t>(next_u64() >> 32)) * bound;
      low = static_cast<uint32_t>(m);
    }
  }
  return static_cast<uint32_t>(m >> 32);
}

float Rng::uniform() { return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f); }

float Rng::normal() {
  float u1 = uniform();
  while (u1 <= 0.0f) u1 = uniform();
  const float u2 = uniform();
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.28318530717958647692f * u2);
}

}  // namespace ddpv
