// Launchers of the backend's own CUDA kernels (cuda_kernels.cu): elementwise ops, casts and
// layout transforms, bias, pooling, softmax + cross-entropy and the fused SGD update.
// Every launcher enqueues on `stream`, returns at once with cudaGetLastError() (callers wrap it
// in DDPV_CUDA_CHECK), and takes bf16 buffers as void* so that this header stays plain C++.
// Activations (Note [Activation dtype]) are void* with a flag `bf16`: every activation operand
// of one call is bf16 when it is set, f32 otherwise; arithmetic is f32 either way, and a bf16
// output is rounded once, to nearest even.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ddpv::cuda {

// ---- elementwise over `count` elements ----------------------------------------------------
cudaError_t fill(int64_t count, float value, float* y, cudaStream_t stream);
cudaError_t scale(int64_t count, float alpha, float* y, cudaStream_t stream);
cudaError_t add(int64_t count, const void* a, const void* b, void* y, bool bf16,
                cudaStream_t stream);
cudaError_t add_relu(int64_t count, const void* a, const void* b, void* y, bool bf16,
                     cudaStream_t stream);
cudaError_t relu_forward(int64_t count, const void* x, void* y, bool bf16, cudaStream_t stream);
cudaError_t relu_backward(int64_t count, const void* y, const void* dy, void* dx, bool bf16,
                          cudaStream_t stream);
// Sets *flag (device int) to 1 when some element is NaN or +-Inf; leaves it alone otherwise.
cudaError_t flag_nonfinite(int64_t count, const float* x, int* flag, cudaStream_t stream);

// ---- casts and layouts ----------------------------------------------------------------------
cudaError_t f32_to_bf16(int64_t count, const float* x, void* y, cudaStream_t stream);
cudaError_t bf16_to_f32(int64_t count, const void* x, float* y, cudaStream_t stream);
// y = x over `count` elements, each f32 or bf16 (a cast, or a copy when both are alike).
cudaError_t convert(int64_t count, const void* x, bool x_bf16, void* y, bool y_bf16,
                    cudaStream_t stream);
// w: (O, I, KK) f32 -> out: (O, KK, I), f32 or bf16 (KRSC, the NHWC filter layout of cuDNN).
cudaError_t oihw_to_ohwi(int o, int i, int kk, const float* w, void* out, bool to_bf16,
                         cudaStream_t stream);
// w: (O, KK, I) f32 or bf16 -> out: (O, I, KK) f32; adds to out when accumulate.
cudaError_t ohwi_to_oihw(int o, int i, int kk, const void* w, bool from_bf16, float* out,
                         bool accumulate, cudaStream_t stream);

// x: (B, R, C) -> y: (B, C, R); y must not alias x. NHWC -> NCHW is (N, H*W, C).
cudaError_t transpose_last2(int64_t b, int64_t r, int64_t c, const void* x, void* y, bool bf16,
                            cudaStream_t stream);

// ---- bias over the last dimension -----------------------------------------------------------
// y: (rows, cols) += b: (cols)
cudaError_t add_bias(int64_t rows, int cols, const float* b, void* y, bool bf16,
                     cudaStream_t stream);
// db: (cols) (+)= sum over rows of dy: (rows, cols)
cudaError_t bias_grad(int64_t rows, int cols, const void* dy, bool bf16, float* db, bool accumulate,
                      cudaStream_t stream);

// ---- pooling, NHWC; x, y, dy and dx f32 or (bf16) bf16 alike ---------------------------------
struct PoolShape {
  int n = 0, h = 0, w = 0, c = 0, oh = 0, ow = 0, kernel = 1, stride = 1, padding = 0;
};
// argmax: (N, OH, OW, C), the index ih * W + iw of each window's maximum (first on ties).
cudaError_t max_pool_forward(const PoolShape& s, const void* x, void* y, int32_t* argmax, bool bf16,
                             cudaStream_t stream);
cudaError_t max_pool_backward(const PoolShape& s, const void* dy, const int32_t* argmax, void* dx,
                              bool bf16, cudaStream_t stream);
// Average over the window including padding (divisor kernel * kernel), as PyTorch's default.
cudaError_t avg_pool_forward(const PoolShape& s, const void* x, void* y, bool bf16,
                             cudaStream_t stream);
cudaError_t avg_pool_backward(const PoolShape& s, const void* dy, void* dx, bool bf16,
                              cudaStream_t stream);
// (N, H, W, C) <-> (N, C)
cudaError_t global_avg_forward(int n, int hw, int c, const void* x, void* y, bool bf16,
                               cudaStream_t stream);
cudaError_t global_avg_backward(int n, int hw, int c, const void* dy, void* dx, bool bf16,
                                cudaStream_t stream);

// ---- softmax + cross-entropy --------------------------------------------------------------
struct LossAccum {
  double loss_sum;
  unsigned long long correct;
  unsigned int bad_labels;  // labels outside [0, K): reported as an error by the caller
  int first_bad_row;        // the first such sample (-1: none) and its label
  int first_bad_label;
};
// logits: (N, K), f32 or (logits_bf16) bf16, labels: (N) -> probs: (N, K) f32, and *accum
// (device) = the batch's sums.
// row_loss: (N), row_tag: (N) are scratch; the sums are reduced in a fixed order, so the
// reported loss does not depend on the scheduling of blocks.
cudaError_t softmax_xent_forward(int n, int k, const void* logits, bool logits_bf16,
                                 const int32_t* labels, float* probs, float* row_loss,
                                 int32_t* row_tag, LossAccum* accum, cudaStream_t stream);
// dlogits: (N, K), f32 or (bf16) bf16, = (probs - onehot(label)) * scale
cudaError_t softmax_xent_backward(int n, int k, const float* probs, const int32_t* labels,
                                  float scale, void* dlogits, bool bf16, cudaStream_t stream);

// ---- optimizer ----------------------------------------------------------------------------
struct SgdArgs {
  float lr, momentum, weight_decay, grad_scale;
  bool nesterov;
};
// decay_ranges: (num_ranges, 2) sorted, disjoint [begin, end) runs that take weight decay.
// momentum may be null (momentum 0: d = g).
cudaError_t sgd_update(const SgdArgs& a, const int64_t* decay_ranges, int num_ranges, int64_t count,
                       float* param, const float* grad, float* momentum, cudaStream_t stream);

}  // namespace ddpv::cuda
