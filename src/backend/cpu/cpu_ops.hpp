// Private to the CPU backend: factories of the op objects, one per op-family file.
#pragma once

#include <memory>

#include "backend/cpu/dnnl_check.hpp"
#include "ddpv/backend/backend.hpp"

namespace ddpv::cpu {

std::unique_ptr<Conv2dOp> make_conv2d(const CpuContext& ctx, const Conv2dConfig& cfg);  // conv.cpp
// conv_single.cpp: a convolution from one input channel on our own loops, where it applies.
bool single_channel_conv_applies(ConvAlgorithm algorithm, const Conv2dConfig& c);
std::unique_ptr<Conv2dOp> make_single_channel_conv2d(const CpuContext& ctx,
                                                     const Conv2dConfig& cfg);
std::unique_ptr<BatchNormOp> make_batchnorm2d(const CpuContext& ctx,
                                              const BatchNormConfig& cfg);  // batchnorm.cpp
std::unique_ptr<Pool2dOp> make_pool2d(const CpuContext& ctx, const Pool2dConfig& cfg);  // pool.cpp
std::unique_ptr<LinearOp> make_linear(const CpuContext& ctx,
                                      const LinearConfig& cfg);  // linear.cpp
std::unique_ptr<SoftmaxCrossEntropyOp> make_softmax_cross_entropy(const CpuContext& ctx,
                                                                  int classes);  // softmax_xent.cpp

// Checks the batch size handed to an op call.
inline void check_batch(const char* op, int n) {
  DDPV_CHECK(n > 0, op, ": batch size must be positive, got ", n);
}

}  // namespace ddpv::cpu
