// Factory of the CUDA backend (cuDNN, cuBLAS, own kernels); private to the backend registry.
#pragma once

#include <memory>

#include "ddpv/backend/backend.hpp"

namespace ddpv {

// Throws ddpv::Error with a one-line reason when no usable GPU is visible.
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);

// Number of GPUs the CUDA runtime sees: 0 when there is no driver or no device. Never throws.
int cuda_visible_device_count();

}  // namespace ddpv
