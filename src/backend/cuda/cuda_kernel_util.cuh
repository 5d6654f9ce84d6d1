// Launch helpers shared by the backend's .cu files: block size, grid size, grid-stride loop, and
// the element access that lets one kernel template read and write f32 or bf16 activations.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ddpv::cuda {

constexpr int kThreads = 256;

// Grid-stride loops cover what a capped grid leaves over, so any int64 count is fine.
inline unsigned blocks_for(int64_t count) {
  const int64_t b = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (1 << 20) ? (1 << 20) : b));
}

// Activations are f32 or bf16 (Note [Activation dtype]); kernels templated on the element type
// T read every element into f32, compute in f32, and round once on the store (to nearest even,
// as ddpv::f32_to_bf16 on the host).
using bf16 = __nv_bfloat16;
__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const bf16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(bf16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

}  // namespace ddpv::cuda

#define DDPV_GRID_STRIDE(i, count)                                                           \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (count); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Calls the host template `fn` (a launcher taking the element type first) on float or bf16
// elements, as `is_bf16` says, with the remaining arguments.
#define DDPV_BY_ELEMENT(is_bf16, fn, ...) \
  ((is_bf16) ? fn<::ddpv::cuda::bf16>(__VA_ARGS__) : fn<float>(__VA_ARGS__))
