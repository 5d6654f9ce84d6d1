// Check macros of the NCCL communicator: DDPV_NCCL_CHECK, and the CUDA runtime check (the
// backend has its own copy in src/backend/cuda; dist does not include backend internals).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include "ddpv/core/error.hpp"

#define DDPV_NCCL_CHECK(expr)                                                         \
  do {                                                                                \
    const ncclResult_t ddpv_nccl_status_ = (expr);                                    \
    if (ddpv_nccl_status_ != ncclSuccess) [[unlikely]]                                \
      DDPV_FAIL("NCCL error ", ncclGetErrorString(ddpv_nccl_status_), " in ", #expr); \
  } while (0)

#ifndef DDPV_CUDA_CHECK
#define DDPV_CUDA_CHECK(expr)                                             \
  do {                                                                    \
    const cudaError_t ddpv_cuda_status_ = (expr);                         \
    if (ddpv_cuda_status_ != cudaSuccess) [[unlikely]]                    \
      DDPV_FAIL("CUDA error ", cudaGetErrorName(ddpv_cuda_status_), " (", \
                cudaGetErrorString(ddpv_cuda_status_), ") in ", #expr);   \
  } while (0)
#endif
