// Private to the CPU backend: factories of the op objects, one per op-family file.
#pragma once

#include <memory>

#include "backend/cpu/dnnl_check.hpp"
#include "ddpv/backend/backend.hpp"

namespace ddpv::cpu {

std::unique_ptr<Conv2dOp> make_conv2d(const CpuContext& ctx, const Conv2dConfig& cfg);  // conv.cpp
// kernels/single_channel/conv2d.cpp: a convolution from one input channel on our own loops, where
// it applies; `baseline`: the loops built for the baseline instruction set even where AVX2 + FMA
// are there (the tests compare the two).
bool single_channel_conv_applies(ConvAlgorithm algorithm, const Conv2dConfig& c);
std::unique_ptr<Conv2dOp> make_single_channel_conv2d(const CpuContext& ctx, const Conv2dConfig& cfg,
                                                     bool baseline = false);
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

// The checks every Conv2dOp entry point makes of its arguments.
inline void check_conv_forward(const Conv2dConfig& c, int n, const float* b) {
  check_batch("conv2d forward", n);
  DDPV_CHECK(!c.bias || b != nullptr, "conv2d forward: the layer has a bias but b is null");
}
inline void check_conv_backward(const Conv2dConfig& c, int n, const float* dw, const float* db) {
  check_batch("conv2d backward", n);
  DDPV_CHECK(dw != nullptr, "conv2d backward: dw must not be null");
  DDPV_CHECK(!c.bias || db != nullptr, "conv2d backward: the layer has a bias but db is null");
}

}  // namespace ddpv::cpu
