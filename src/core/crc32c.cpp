// CRC32C: the SSE4.2 instruction, eight bytes at a time, with a byte table as the fallback.
#include "ddpv/core/crc32c.hpp"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace ddpv {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // Castagnoli, reflected

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kTable = make_table();

// Both implementations work on the inverted register; the public functions invert in and out.
uint32_t table_update(uint32_t c, const unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) c = kTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c;
}

#if defined(__x86_64__)
// Note [CRC32C speed]: one crc32 instruction per 8 bytes, a 3-cycle latency chain: about
// 8 GB/s at 3 GHz, so checking a 200 MB ResNet-50 checkpoint costs some 25 ms, far below the
// time to read it. Interleaving three streams would triple that at the price of a combine
// step; a checkpoint's reading and writing do not need it.
__attribute__((target("sse4.2"))) uint32_t hw_update(uint32_t c, const unsigned char* p, size_t n) {
  uint64_t c64 = c;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
  }
  c = static_cast<uint32_t>(c64);
  for (; n > 0; --n, ++p) c = _mm_crc32_u8(c, *p);
  return c;
}
bool detect_hardware() { return __builtin_cpu_supports("sse4.2"); }
#else
uint32_t hw_update(uint32_t c, const unsigned char* p, size_t n) { return table_update(c, p, n); }
bool detect_hardware() { return false; }
#endif

const bool kHardware = detect_hardware();

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  return ~(kHardware ? hw_update(~crc, p, size) : table_update(~crc, p, size));
}

uint32_t crc32c_portable(const void* data, size_t size, uint32_t crc) {
  return ~table_update(~crc, static_cast<const unsigned char*>(data), size);
}

bool crc32c_hardware() { return kHardware; }

}  // namespace ddpv
