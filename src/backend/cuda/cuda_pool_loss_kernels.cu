// The CUDA backend's own kernels for pooling (max, average, global average; NHWC) and for the
// fused softmax + cross-entropy. Launchers are declared in cuda_kernels.hpp. Activations are
// f32 or bf16 (the kernels' element type T), read into f32 and rounded once on the store.
#include <cstdint>

#include "backend/cuda/cuda_kernel_util.cuh"
#include "backend/cuda/cuda_kernels.hpp"

namespace ddpv::cuda {
namespace {

// ---- pooling ------------------------------------------------------------------------------
struct PoolIndex {
  int64_t n, h, w, c;
};
__device__ PoolIndex split_nhwc(int64_t idx, int hh, int ww, int cc) {
  PoolIndex p;
  p.c = idx % cc;
  idx /= cc;
  p.w = idx % ww;
  idx /= ww;
  p.h = idx % hh;
  p.n = idx / hh;
  return p;
}
// Output rows whose window covers input row i: [lo, hi] (empty when lo > hi).
__device__ void covering(int i, int pad, int k, int stride, int out, int* lo, int* hi) {
  const int first = i + pad - k + 1;
  *lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  const int last = (i + pad) / stride;
  *hi = last < out - 1 ? last : out - 1;
}

template <typename T>
__global__ void max_pool_forward_kernel(PoolShape s, const T* x, T* y, int32_t* arg) {
  const int64_t total = static_cast<int64_t>(s.n) * s.oh * s.ow * s.c;
  DDPV_GRID_STRIDE(idx, total) {
    const PoolIndex o = split_nhwc(idx, s.oh, s.ow, s.c);
    const int h0 = static_cast<int>(o.h) * s.stride - s.padding;
    const int w0 = static_cast<int>(o.w) * s.stride - s.padding;
    float best = -INFINITY;
    int32_t best_at = -1;
    for (int kh = 0; kh < s.kernel; ++kh) {
      const int ih = h0 + kh;
      if (ih < 0 || ih >= s.h) continue;
      for (int kw = 0; kw < s.kernel; ++kw) {
        const int iw = w0 + kw;
        if (iw < 0 || iw >= s.w) continue;
        const float v = load(x, ((o.n * s.h + ih) * s.w + iw) * s.c + o.c);
        if (best_at < 0 || v > best || (v != v && best == best)) {
          best = v;
          best_at = ih * s.w + iw;
        }
      }
    }
    store(y, idx, best);
    arg[idx] = best_at;
  }
}
// Gathers over the windows that cover each input: no atomics, so the result is deterministic.
template <typename T>
__global__ void max_pool_backward_kernel(PoolShape s, const T* dy, const int32_t* arg, T* dx) {
  const int64_t total = static_cast<int64_t>(s.n) * s.h * s.w * s.c;
  DDPV_GRID_STRIDE(idx, total) {
    const PoolIndex in = split_nhwc(idx, s.h, s.w, s.c);
    int oh_lo, oh_hi, ow_lo, ow_hi;
    covering(static_cast<int>(in.h), s.padding, s.kernel, s.stride, s.oh, &oh_lo, &oh_hi);
    covering(static_cast<int>(in.w), s.padding, s.kernel, s.stride, s.ow, &ow_lo, &ow_hi);
    const int32_t me = static_cast<int32_t>(in.h * s.w + in.w);
    float sum = 0.0f;
    for (int oh = oh_lo; oh <= oh_hi; ++oh) {
      for (int ow = ow_lo; ow <= ow_hi; ++ow) {
        const int64_t o = ((in.n * s.oh + oh) * s.ow + ow) * s.c + in.c;
        if (arg[o] == me) sum += load(dy, o);
      }
    }
    store(dx, idx, sum);
  }
}
template <typename T>
__global__ void avg_pool_forward_kernel(PoolShape s, const T* x, T* y) {
  const int64_t total = static_cast<int64_t>(s.n) * s.oh * s.ow * s.c;
  const float inv = 1.0f / static_cast<float>(s.kernel * s.kernel);
  DDPV_GRID_STRIDE(idx, total) {
    const PoolIndex o = split_nhwc(idx, s.oh, s.ow, s.c);
    const int h0 = static_cast<int>(o.h) * s.stride - s.padding;
    const int w0 = static_cast<int>(o.w) * s.stride - s.padding;
    float sum = 0.0f;
    for (int kh = 0; kh < s.kernel; ++kh) {
      const int ih = h0 + kh;
      if (ih < 0 || ih >= s.h) continue;
      for (int kw = 0; kw < s.kernel; ++kw) {
        const int iw = w0 + kw;
        if (iw >= 0 && iw < s.w) sum += load(x, ((o.n * s.h + ih) * s.w + iw) * s.c + o.c);
      }
    }
    store(y, idx, sum * inv);
  }
}
template <typename T>
__global__ void avg_pool_backward_kernel(PoolShape s, const T* dy, T* dx) {
  const int64_t total = static_cast<int64_t>(s.n) * s.h * s.w * s.c;
  const float inv = 1.0f / static_cast<float>(s.kernel * s.kernel);
  DDPV_GRID_STRIDE(idx, total) {
    const PoolIndex in = split_nhwc(idx, s.h, s.w, s.c);
    int oh_lo, oh_hi, ow_lo, ow_hi;
    covering(static_cast<int>(in.h), s.padding, s.kernel, s.stride, s.oh, &oh_lo, &oh_hi);
    covering(static_cast<int>(in.w), s.padding, s.kernel, s.stride, s.ow, &ow_lo, &ow_hi);
    float sum = 0.0f;
    for (int oh = oh_lo; oh <= oh_hi; ++oh) {
      for (int ow = ow_lo; ow <= ow_hi; ++ow)
        sum += load(dy, ((in.n * s.oh + oh) * s.ow + ow) * s.c + in.c);
    }
    store(dx, idx, sum * inv);
  }
}
template <typename T>
__global__ void global_avg_forward_kernel(int n, int hw, int c, const T* x, T* y) {
  DDPV_GRID_STRIDE(idx, static_cast<int64_t>(n) * c) {
    const int64_t b = idx / c, ch = idx % c;
    float sum = 0.0f;
    for (int p = 0; p < hw; ++p) sum += load(x, (b * hw + p) * c + ch);
    store(y, idx, sum / static_cast<float>(hw));
  }
}
template <typename T>
__global__ void global_avg_backward_kernel(int n, int hw, int c, const T* dy, T* dx) {
  DDPV_GRID_STRIDE(idx, static_cast<int64_t>(n) * hw * c) {
    const int64_t ch = idx % c, b = idx / (static_cast<int64_t>(hw) * c);
    store(dx, idx, load(dy, b * c + ch) / static_cast<float>(hw));
  }
}

// ---- softmax + cross-entropy ----------------------------------------------------------------
// One block per sample. The arg-max keeps the first index among equal maxima.
template <typename T>
__global__ void softmax_xent_kernel(int k, const T* logits, const int32_t* labels, float* probs,
                                    float* row_loss, int32_t* row_tag) {
  __shared__ float s_val[kThreads];
  __shared__ int s_idx[kThreads];
  const int64_t row = blockIdx.x;
  const T* z = logits + row * k;
  float* p = probs + row * k;
  float best = -INFINITY;
  int best_at = k;
  for (int j = threadIdx.x; j < k; j += blockDim.x) {
    const float v = load(z, j);
    if (v > best || best_at == k) {
      best = v;
      best_at = j;
    }
  }
  s_val[threadIdx.x] = best;
  s_idx[threadIdx.x] = best_at;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const float v = s_val[threadIdx.x + stride];
      const int at = s_idx[threadIdx.x + stride];
      if (at < k && (s_idx[threadIdx.x] == k || v > s_val[threadIdx.x] ||
                     (v == s_val[threadIdx.x] && at < s_idx[threadIdx.x]))) {
        s_val[threadIdx.x] = v;
        s_idx[threadIdx.x] = at;
      }
    }
    __syncthreads();
  }
  const float zmax = s_val[0];
  const int argmax = s_idx[0];
  __syncthreads();
  float sum = 0.0f;
  for (int j = threadIdx.x; j < k; j += blockDim.x) sum += expf(load(z, j) - zmax);
  s_val[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) s_val[threadIdx.x] += s_val[threadIdx.x + stride];
    __syncthreads();
  }
  const float total = s_val[0];
  const float inv = 1.0f / total;
  for (int j = threadIdx.x; j < k; j += blockDim.x) p[j] = expf(load(z, j) - zmax) * inv;
  if (threadIdx.x == 0) {
    const int32_t label = labels[row];
    if (label < 0 || label >= k) {
      row_loss[row] = 0.0f;
      row_tag[row] = -1;
    } else {
      row_loss[row] = logf(total) - (load(z, label) - zmax);
      row_tag[row] = argmax == label ? 1 : 0;
    }
  }
}
// One block sums the rows in a fixed order.
__global__ void loss_reduce_kernel(int n, const int32_t* labels, const float* row_loss,
                                   const int32_t* row_tag, LossAccum* accum) {
  __shared__ double s_loss[kThreads];
  __shared__ unsigned long long s_correct[kThreads];
  __shared__ unsigned int s_bad[kThreads];
  __shared__ int s_first[kThreads];
  double loss = 0.0;
  unsigned long long correct = 0;
  unsigned int bad = 0;
  int first = n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    loss += row_loss[i];
    correct += row_tag[i] == 1 ? 1 : 0;
    if (row_tag[i] < 0) {
      ++bad;
      first = min(first, i);
    }
  }
  s_loss[threadIdx.x] = loss;
  s_correct[threadIdx.x] = correct;
  s_bad[threadIdx.x] = bad;
  s_first[threadIdx.x] = first;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      s_loss[threadIdx.x] += s_loss[threadIdx.x + stride];
      s_correct[threadIdx.x] += s_correct[threadIdx.x + stride];
      s_bad[threadIdx.x] += s_bad[threadIdx.x + stride];
      s_first[threadIdx.x] = min(s_first[threadIdx.x], s_first[threadIdx.x + stride]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    accum->loss_sum = s_loss[0];
    accum->correct = s_correct[0];
    accum->bad_labels = s_bad[0];
    accum->first_bad_row = s_first[0] < n ? s_first[0] : -1;
    accum->first_bad_label = s_first[0] < n ? labels[s_first[0]] : 0;
  }
}
template <typename T>
__global__ void softmax_xent_backward_kernel(int n, int k, const float* probs,
                                             const int32_t* labels, float scale, T* d) {
  DDPV_GRID_STRIDE(idx, static_cast<int64_t>(n) * k) {
    const int64_t row = idx / k;
    const int j = static_cast<int>(idx % k);
    store(d, idx, (probs[idx] - (labels[row] == j ? 1.0f : 0.0f)) * scale);
  }
}

template <typename T>
cudaError_t max_pool_forward_as(const PoolShape& s, const void* x, void* y, int32_t* argmax,
                                cudaStream_t st) {
  const int64_t total = static_cast<int64_t>(s.n) * s.oh * s.ow * s.c;
  max_pool_forward_kernel<<<blocks_for(total), kThreads, 0, st>>>(s, static_cast<const T*>(x),
                                                                  static_cast<T*>(y), argmax);
  return cudaGetLastError();
}
template <typename T>
cudaError_t max_pool_backward_as(const PoolShape& s, const void* dy, const int32_t* argmax,
                                 void* dx, cudaStream_t st) {
  const int64_t total = static_cast<int64_t>(s.n) * s.h * s.w * s.c;
  max_pool_backward_kernel<<<blocks_for(total), kThreads, 0, st>>>(s, static_cast<const T*>(dy),
                                                                   argmax, static_cast<T*>(dx));
  return cudaGetLastError();
}
template <typename T>
cudaError_t avg_pool_forward_as(const PoolShape& s, const void* x, void* y, cudaStream_t st) {
  const int64_t total = static_cast<int64_t>(s.n) * s.oh * s.ow * s.c;
  avg_pool_forward_kernel<<<blocks_for(total), kThreads, 0, st>>>(s, static_cast<const T*>(x),
                                                                  static_cast<T*>(y));
  return cudaGetLastError();
}
template <typename T>
cudaError_t avg_pool_backward_as(const PoolShape& s, const void* dy, void* dx, cudaStream_t st) {
  const int64_t total = static_cast<int64_t>(s.n) * s.h * s.w * s.c;
  avg_pool_backward_kernel<<<blocks_for(total), kThreads, 0, st>>>(s, static_cast<const T*>(dy),
                                                                   static_cast<T*>(dx));
  return cudaGetLastError();
}
template <typename T>
cudaError_t global_avg_forward_as(int n, int hw, int c, const void* x, void* y, cudaStream_t st) {
  global_avg_forward_kernel<<<blocks_for(static_cast<int64_t>(n) * c), kThreads, 0, st>>>(
      n, hw, c, static_cast<const T*>(x), static_cast<T*>(y));
  return cudaGetLastError();
}
template <typename T>
cudaError_t global_avg_backward_as(int n, int hw, int c, const void* dy, void* dx,
                                   cudaStream_t st) {
  global_avg_backward_kernel<<<blocks_for(static_cast<int64_t>(n) * hw * c), kThreads, 0, st>>>(
      n, hw, c, static_cast<const T*>(dy), static_cast<T*>(dx));
  return cudaGetLastError();
}
template <typename T>
cudaError_t softmax_xent_forward_as(int n, int k, const void* logits, const int32_t* labels,
                                    float* probs, float* row_loss, int32_t* row_tag,
                                    LossAccum* accum, cudaStream_t st) {
  if (n > 0) {
    softmax_xent_kernel<<<n, kThreads, 0, st>>>(k, static_cast<const T*>(logits), labels, probs,
                                                row_loss, row_tag);
  }
  loss_reduce_kernel<<<1, kThreads, 0, st>>>(n, labels, row_loss, row_tag, accum);
  return cudaGetLastError();
}
template <typename T>
cudaError_t softmax_xent_backward_as(int n, int k, const float* probs, const int32_t* labels,
                                     float scale, void* dlogits, cudaStream_t st) {
  softmax_xent_backward_kernel<<<blocks_for(static_cast<int64_t>(n) * k), kThreads, 0, st>>>(
      n, k, probs, labels, scale, static_cast<T*>(dlogits));
  return cudaGetLastError();
}

}  // namespace

// ---- launchers ------------------------------------------------------------------------------
cudaError_t max_pool_forward(const PoolShape& s, const void* x, void* y, int32_t* argmax, bool bf16,
                             cudaStream_t st) {
  return DDPV_BY_ELEMENT(bf16, max_pool_forward_as, s, x, y, argmax, st);
}
cudaError_t max_pool_backward(const PoolShape& s, const void* dy, const int32_t* argmax, void* dx,
                              bool bf16, cudaStream_t st) {
  return DDPV_BY_ELEMENT(bf16, max_pool_backward_as, s, dy, argmax, dx, st);
}
cudaError_t avg_pool_forward(const PoolShape& s, const void* x, void* y, bool bf16,
                             cudaStream_t st) {
  return DDPV_BY_ELEMENT(bf16, avg_pool_forward_as, s, x, y, st);
}
cudaError_t avg_pool_backward(const PoolShape& s, const void* dy, void* dx, bool bf16,
                              cudaStream_t st) {
  return DDPV_BY_ELEMENT(bf16, avg_pool_backward_as, s, dy, dx, st);
}
cudaError_t global_avg_forward(int n, int hw, int c, const void* x, void* y, bool bf16,
                               cudaStream_t st) {
  return DDPV_BY_ELEMENT(bf16, global_avg_forward_as, n, hw, c, x, y, st);
}
cudaError_t global_avg_backward(int n, int hw, int c, const void* dy, void* dx, bool bf16,
                                cudaStream_t st) {
  return DDPV_BY_ELEMENT(bf16, global_avg_backward_as, n, hw, c, dy, dx, st);
}

cudaError_t softmax_xent_forward(int n, int k, const void* logits, bool logits_bf16,
                                 const int32_t* labels, float* probs, float* row_loss,
                                 int32_t* row_tag, LossAccum* accum, cudaStream_t st) {
  return DDPV_BY_ELEMENT(logits_bf16, softmax_xent_forward_as, n, k, logits, labels, probs,
                         row_loss, row_tag, accum, st);
}
cudaError_t softmax_xent_backward(int n, int k, const float* probs, const int32_t* labels,
                                  float scale, void* dlogits, bool bf16, cudaStream_t st) {
  return DDPV_BY_ELEMENT(bf16, softmax_xent_backward_as, n, k, probs, labels, scale, dlogits, st);
}

}  // namespace ddpv::cuda
