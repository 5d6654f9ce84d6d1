// Private to the CPU backend: the single-channel convolution's pooled weight gradient on
// AVX-512 (Note [Pooled weight gradient by channel vectors] in kernels/pooled_grad/isa_avx512.cpp).
#pragma once

#include <cstdint>

namespace ddpv::cpu {

// One batch's operands, as SingleChannelConv2d holds them (Note [Pooled weight gradient] in
// kernels/single_channel/loops.hpp): padded images, the pooled gradient and the window positions in
// blocks of `block` channels, and each pooled cell's patch offset.
struct PooledGradArgs {
  int k = 0;  // kernel (3 or 5), stride 1, 2 x 2 pooling
  int cout = 0, block = 0;
  int cells = 0;      // pooled cells per channel of an image
  int pwid = 0;       // a padded image's row, in floats
  int64_t image = 0;  // a padded image, in floats
  const int32_t* cell_at = nullptr;
  const float* xp = nullptr;
  const float* dpooled = nullptr;
  const int32_t* positions = nullptr;
};

// Whether pooled_weight_grad_avx512 takes these: built with AVX-512, the CPU has it, and the
// shape is one it handles (kernel 3 or 5, blocks of a multiple of 16 channels).
bool pooled_weight_grad_avx512_takes(const PooledGradArgs& a);
// Images [i0, i1)'s sums, zeroed first, in the slice layout of the other loops: [cout][k][8]
// weights (taps of a row at lanes 0..k-1), then [cout] biases.
void pooled_weight_grad_avx512(const PooledGradArgs& a, int i0, int i1, float* sums);

}  // namespace ddpv::cpu
