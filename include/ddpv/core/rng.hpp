// Deterministic random numbers: counter-based keys for data and xoshiro256** streams.
#pragma once

#include <array>
#include <cstdint>

namespace ddpv {

// SplitMix64 finaliser: a strong 64-bit mix, used to derive independent keys.
constexpr uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A key from several counters, e.g. (seed, epoch, sample index): the same inputs give the same
// key on every rank and thread, which is what makes augmentation independent of world size.
constexpr uint64_t derive_key(uint64_t a, uint64_t b = 0, uint64_t c = 0, uint64_t d = 0) {
  return mix64(mix64(mix64(mix64(a) ^ b) ^ c) ^ d);
}

// xoshiro256**: fast, small state that checkpoints save and restore exactly.
class Rng {
 public:
  explicit Rng(uint64_t key = 0);
  uint64_t next_u64();
  uint32_t uniform_int(uint32_t bound);  // in [0, bound), unbiased
  float uniform();                       // in [0, 1)
  float normal();                        // standard normal (Box-Muller)
  std::array<uint64_t, 4> state() const { return s_; }
  void set_state(const std::array<uint64_t, 4>& s) { s_ = s; }

 private:
  std::array<uint64_t, 4> s_;
};

}  // namespace ddpv
