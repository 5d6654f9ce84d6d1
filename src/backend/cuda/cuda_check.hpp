// Check macros for the CUDA runtime, cuDNN and cuBLAS: each failed call throws ddpv::Error
// naming the library, the call and its message (plus rank, host, file:line from ddpv::Error).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "ddpv/core/error.hpp"

#define DDPV_CUDA_CHECK(expr)                                             \
  do {                                                                    \
    const cudaError_t ddpv_cuda_status_ = (expr);                         \
    if (ddpv_cuda_status_ != cudaSuccess) [[unlikely]]                    \
      DDPV_FAIL("CUDA error ", cudaGetErrorName(ddpv_cuda_status_), " (", \
                cudaGetErrorString(ddpv_cuda_status_), ") in ", #expr);   \
  } while (0)

#define DDPV_CUDNN_CHECK(expr)                                                           \
  do {                                                                                   \
    const cudnnStatus_t ddpv_cudnn_status_ = (expr);                                     \
    if (ddpv_cudnn_status_ != CUDNN_STATUS_SUCCESS) [[unlikely]]                         \
      DDPV_FAIL("cuDNN error ", cudnnGetErrorString(ddpv_cudnn_status_), " in ", #expr); \
  } while (0)

#define DDPV_CUBLAS_CHECK(expr)                                                              \
  do {                                                                                       \
    const cublasStatus_t ddpv_cublas_status_ = (expr);                                       \
    if (ddpv_cublas_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                           \
      DDPV_FAIL("cuBLAS error ", cublasGetStatusString(ddpv_cublas_status_), " in ", #expr); \
  } while (0)

// Kernel launches report configuration errors only through cudaGetLastError.
#define DDPV_CUDA_CHECK_LAUNCH() DDPV_CUDA_CHECK(cudaGetLastError())
