// Launch helpers shared by the backend's .cu files: block size, grid size, grid-stride loop.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ddpv::cuda {

constexpr int kThreads = 256;

// Grid-stride loops cover what a capped grid leaves over, so any int64 count is fine.
inline unsigned blocks_for(int64_t count) {
  const int64_t b = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (1 << 20) ? (1 << 20) : b));
}

}  // namespace ddpv::cuda

#define DDPV_GRID_STRIDE(i, count)                                                           \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (count); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
