// Element types of tensors and the bf16/f16 <-> f32 conversions used on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace ddpv {

enum class DType : uint8_t { kF32, kBF16, kF16, kU8, kI32 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "f32", "bf16", "f16", "u8", "i32"
DType parse_dtype(const std::string& name);  // throws Error on an unknown name

template <typename T>
constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::kF32; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::kU8; }
template <> constexpr DType dtype_of<int32_t>() { return DType::kI32; }

// bf16: the upper half of an f32, rounded to nearest even (NaN stays NaN, quieted). A select,
// not a branch, so that loops over it vectorise (Note [bf16 elementwise loops]).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t nearest = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet : nearest);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

}  // namespace ddpv
