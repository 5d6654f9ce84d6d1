// Factories of the CUDA ops, one per op family file (cuda_conv.cpp, cuda_batchnorm.cpp, ...).
// Every op holds a share of the backend's context, so ops may outlive the backend object.
#pragma once

#include <memory>

#include "backend/cuda/cuda_context.hpp"
#include "ddpv/backend/backend.hpp"

namespace ddpv::cuda {

std::unique_ptr<Conv2dOp> make_conv2d(std::shared_ptr<CudaContext> ctx, const Conv2dConfig& cfg);
std::unique_ptr<BatchNormOp> make_batchnorm2d(std::shared_ptr<CudaContext> ctx,
                                              const BatchNormConfig& cfg);
std::unique_ptr<Pool2dOp> make_pool2d(std::shared_ptr<CudaContext> ctx, const Pool2dConfig& cfg);
std::unique_ptr<LinearOp> make_linear(std::shared_ptr<CudaContext> ctx, const LinearConfig& cfg);
std::unique_ptr<SoftmaxCrossEntropyOp> make_softmax_cross_entropy(std::shared_ptr<CudaContext> ctx,
                                                                  int classes);

}  // namespace ddpv::cuda
