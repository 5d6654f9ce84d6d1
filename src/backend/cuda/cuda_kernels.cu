// The CUDA backend's own kernels: elementwise ops, casts and filter layouts, bias and the fused
// SGD update. Launchers are declared in cuda_kernels.hpp.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_kernel_util.cuh"
#include "backend/cuda/cuda_kernels.hpp"

namespace ddpv::cuda {
namespace {

__global__ void fill_kernel(int64_t count, float value, float* y) {
  DDPV_GRID_STRIDE(i, count) y[i] = value;
}
__global__ void scale_kernel(int64_t count, float alpha, float* y) {
  DDPV_GRID_STRIDE(i, count) y[i] *= alpha;
}

// Note [Vector elementwise]: the activation-sized elementwise ops (the residual addition with
// its ReLU, ReLU forward and backward) are memory-bound: the first H200 profile had them at
// about half the memory bandwidth, one float per thread, and the residual output in two
// passes (add, then ReLU in place). Each is now one pass of a functor over 16 bytes per
// thread (4 floats or 8 bf16, one 16-byte load per operand and one store) where every pointer
// is 16-byte aligned, which activations always are, with the tail on the grid's first
// threads; otherwise one element per thread. The functor computes in f32 and a bf16 result is
// rounded once. Outputs may alias inputs: each thread reads its elements before writing them.
// NaN propagates through the ReLU (as in PyTorch and the CPU backend), so a diverged run is
// still seen.
__device__ __forceinline__ float relu(float v) { return (v > 0.0f || v != v) ? v : 0.0f; }
struct Add {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct AddRelu {
  __device__ float operator()(float a, float b) const { return relu(a + b); }
};
struct ReluMask {  // (y, dy) -> dx: the ReLU's backward, with its output as the mask
  __device__ float operator()(float y, float dy) const { return y > 0.0f ? dy : 0.0f; }
};
struct Relu {
  __device__ float operator()(float v, float) const { return relu(v); }
};

template <typename T, class F>
__global__ void map_kernel(int64_t count, const T* a, const T* b, T* y, F f) {
  DDPV_GRID_STRIDE(i, count) store(y, i, f(load(a, i), load(b, i)));
}
template <typename T, class F>
__global__ void map16_kernel(int64_t count, const T* a, const T* b, T* y, F f) {
  constexpr int kPer = 16 / sizeof(T);
  const int64_t chunks = count / kPer;
  DDPV_GRID_STRIDE(i, chunks) {
    const uint4 u = reinterpret_cast<const uint4*>(a)[i], v = reinterpret_cast<const uint4*>(b)[i];
    uint4 w;
    const T* ua = reinterpret_cast<const T*>(&u);
    const T* vb = reinterpret_cast<const T*>(&v);
    T* wy = reinterpret_cast<T*>(&w);
#pragma unroll
    for (int k = 0; k < kPer; ++k) store(wy, k, f(load(ua, k), load(vb, k)));
    reinterpret_cast<uint4*>(y)[i] = w;
  }
  const int64_t tail = chunks * kPer + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (tail < count) store(y, tail, f(load(a, tail), load(b, tail)));
}
__global__ void nonfinite_kernel(int64_t count, const float* x, int* flag) {
  DDPV_GRID_STRIDE(i, count) {
    if (!isfinite(x[i])) *flag = 1;  // every writer writes the same value: a benign race
  }
}

// Four elements per thread when the buffers allow it: casts sit on the bf16 hot path.
__global__ void f32_to_bf16_kernel4(int64_t count4, const float4* x, __nv_bfloat162* y) {
  DDPV_GRID_STRIDE(i, count4) {
    const float4 v = x[i];
    y[2 * i] = __floats2bfloat162_rn(v.x, v.y);
    y[2 * i + 1] = __floats2bfloat162_rn(v.z, v.w);
  }
}
__global__ void f32_to_bf16_kernel(int64_t count, const float* x, __nv_bfloat16* y) {
  DDPV_GRID_STRIDE(i, count) y[i] = __float2bfloat16_rn(x[i]);
}
__global__ void bf16_to_f32_kernel4(int64_t count4, const __nv_bfloat162* x, float4* y) {
  DDPV_GRID_STRIDE(i, count4) {
    const float2 a = __bfloat1622float2(x[2 * i]);
    const float2 b = __bfloat1622float2(x[2 * i + 1]);
    y[i] = make_float4(a.x, a.y, b.x, b.y);
  }
}
__global__ void bf16_to_f32_kernel(int64_t count, const __nv_bfloat16* x, float* y) {
  DDPV_GRID_STRIDE(i, count) y[i] = __bfloat162float(x[i]);
}

template <typename Out>
__global__ void oihw_to_ohwi_kernel(int o, int ci, int kk, const float* w, Out* out) {
  const int64_t total = static_cast<int64_t>(o) * ci * kk;
  DDPV_GRID_STRIDE(idx, total) {
    const int64_t oo = idx / (static_cast<int64_t>(kk) * ci);
    const int64_t r = idx % (static_cast<int64_t>(kk) * ci);
    const int64_t s = r / ci, i = r % ci;
    out[idx] = static_cast<Out>(w[(oo * ci + i) * kk + s]);
  }
}
template <typename In>
__global__ void ohwi_to_oihw_kernel(int o, int ci, int kk, const In* w, float* out,
                                    bool accumulate) {
  const int64_t total = static_cast<int64_t>(o) * ci * kk;
  DDPV_GRID_STRIDE(idx, total) {
    const int64_t oo = idx / (static_cast<int64_t>(ci) * kk);
    const int64_t r = idx % (static_cast<int64_t>(ci) * kk);
    const int64_t i = r / kk, s = r % kk;
    const float v = static_cast<float>(w[(oo * kk + s) * ci + i]);
    out[idx] = accumulate ? out[idx] + v : v;
  }
}

template <typename T>  // moves elements as they are: float or bf16 bits alike
__global__ void transpose_last2_kernel(int64_t b, int64_t r, int64_t c, const T* x, T* y) {
  DDPV_GRID_STRIDE(idx, b * r * c) {  // idx walks y: (B, C, R)
    const int64_t i = idx % r, j = idx / r % c, k = idx / (r * c);
    y[idx] = x[(k * r + i) * c + j];
  }
}

template <typename T>
__global__ void add_bias_kernel(int64_t rows, int cols, const float* b, T* y) {
  DDPV_GRID_STRIDE(idx, rows * cols) store(y, idx, load(y, idx) + b[idx % cols]);
}
// One block per 32 columns, 32 x 32 threads, rows summed in a fixed order: deterministic.
template <typename T>
__global__ void bias_grad_kernel(int64_t rows, int cols, const T* dy, float* db, bool accumulate) {
  __shared__ float part[32][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  float sum = 0.0f;
  if (col < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += 32) sum += load(dy, r * cols + col);
  }
  part[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.0f;
    for (int j = 0; j < 32; ++j) total += part[j][threadIdx.x];
    db[col] = accumulate ? db[col] + total : total;
  }
}

// ---- SGD ------------------------------------------------------------------------------------
__device__ bool in_ranges(int64_t i, const int64_t* ranges, int num) {
  int lo = 0, hi = num - 1;  // last range whose begin <= i
  while (lo <= hi) {
    const int mid = (lo + hi) / 2;
    if (ranges[2 * mid] <= i) {
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return hi >= 0 && i < ranges[2 * hi + 1];
}
// PyTorch's SGD (Note [Fused SGD] in the CPU backend); with no momentum buffer, d = g.
__global__ void sgd_kernel(SgdArgs a, const int64_t* ranges, int num_ranges, int64_t count,
                           float* param, const float* grad, float* momentum) {
  DDPV_GRID_STRIDE(i, count) {
    const float p = param[i];
    const float wd = in_ranges(i, ranges, num_ranges) ? a.weight_decay : 0.0f;
    const float g = a.grad_scale * grad[i] + wd * p;
    if (momentum == nullptr) {
      param[i] = p - a.lr * g;
      continue;
    }
    const float m = a.momentum * momentum[i] + g;
    momentum[i] = m;
    param[i] = p - a.lr * (a.nesterov ? g + a.momentum * m : m);
  }
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// y = f(a, b) elementwise (Note [Vector elementwise]); b may be a (unary functors ignore it).
template <typename T, class F>
cudaError_t map_as(int64_t count, const void* av, const void* bv, void* yv, F f, cudaStream_t st) {
  if (count <= 0) return cudaSuccess;
  const T* a = static_cast<const T*>(av);
  const T* b = static_cast<const T*>(bv);
  T* y = static_cast<T*>(yv);
  if (aligned(a, 16) && aligned(b, 16) && aligned(y, 16)) {
    map16_kernel<<<blocks_for(count / (16 / sizeof(T))), kThreads, 0, st>>>(count, a, b, y, f);
  } else {
    map_kernel<<<blocks_for(count), kThreads, 0, st>>>(count, a, b, y, f);
  }
  return cudaGetLastError();
}
template <class F>
cudaError_t map(int64_t count, const void* a, const void* b, void* y, bool bf16, F f,
                cudaStream_t st) {
  return DDPV_BY_ELEMENT(bf16, map_as, count, a, b, y, f, st);
}

template <typename T>
cudaError_t transpose_as(int64_t b, int64_t r, int64_t c, const void* x, void* y, cudaStream_t st) {
  transpose_last2_kernel<<<blocks_for(b * r * c), kThreads, 0, st>>>(
      b, r, c, static_cast<const T*>(x), static_cast<T*>(y));
  return cudaGetLastError();
}
template <typename T>
cudaError_t add_bias_as(int64_t rows, int cols, const float* b, void* y, cudaStream_t st) {
  add_bias_kernel<<<blocks_for(rows * cols), kThreads, 0, st>>>(rows, cols, b, static_cast<T*>(y));
  return cudaGetLastError();
}
template <typename T>
cudaError_t bias_grad_as(int64_t rows, int cols, const void* dy, float* db, bool accumulate,
                         cudaStream_t st) {
  bias_grad_kernel<<<(cols + 31) / 32, dim3(32, 32), 0, st>>>(rows, cols, static_cast<const T*>(dy),
                                                              db, accumulate);
  return cudaGetLastError();
}

}  // namespace

// ---- launchers ------------------------------------------------------------------------------
cudaError_t fill(int64_t count, float value, float* y, cudaStream_t st) {
  fill_kernel<<<blocks_for(count), kThreads, 0, st>>>(count, value, y);
  return cudaGetLastError();
}
cudaError_t scale(int64_t count, float alpha, float* y, cudaStream_t st) {
  scale_kernel<<<blocks_for(count), kThreads, 0, st>>>(count, alpha, y);
  return cudaGetLastError();
}
cudaError_t add(int64_t count, const void* a, const void* b, void* y, bool bf16, cudaStream_t st) {
  return map(count, a, b, y, bf16, Add{}, st);
}
cudaError_t add_relu(int64_t count, const void* a, const void* b, void* y, bool bf16,
                     cudaStream_t st) {
  return map(count, a, b, y, bf16, AddRelu{}, st);
}
cudaError_t relu_forward(int64_t count, const void* x, void* y, bool bf16, cudaStream_t st) {
  return map(count, x, x, y, bf16, Relu{}, st);
}
cudaError_t relu_backward(int64_t count, const void* y, const void* dy, void* dx, bool bf16,
                          cudaStream_t st) {
  return map(count, y, dy, dx, bf16, ReluMask{}, st);
}
cudaError_t flag_nonfinite(int64_t count, const float* x, int* flag, cudaStream_t st) {
  nonfinite_kernel<<<blocks_for(count), kThreads, 0, st>>>(count, x, flag);
  return cudaGetLastError();
}

cudaError_t f32_to_bf16(int64_t count, const float* x, void* y, cudaStream_t st) {
  if (count % 4 == 0 && aligned(x, 16) && aligned(y, 8)) {
    f32_to_bf16_kernel4<<<blocks_for(count / 4), kThreads, 0, st>>>(
        count / 4, reinterpret_cast<const float4*>(x), static_cast<__nv_bfloat162*>(y));
  } else {
    f32_to_bf16_kernel<<<blocks_for(count), kThreads, 0, st>>>(count, x,
                                                               static_cast<__nv_bfloat16*>(y));
  }
  return cudaGetLastError();
}
cudaError_t bf16_to_f32(int64_t count, const void* x, float* y, cudaStream_t st) {
  if (count % 4 == 0 && aligned(x, 8) && aligned(y, 16)) {
    bf16_to_f32_kernel4<<<blocks_for(count / 4), kThreads, 0, st>>>(
        count / 4, static_cast<const __nv_bfloat162*>(x), reinterpret_cast<float4*>(y));
  } else {
    bf16_to_f32_kernel<<<blocks_for(count), kThreads, 0, st>>>(
        count, static_cast<const __nv_bfloat16*>(x), y);
  }
  return cudaGetLastError();
}
cudaError_t convert(int64_t count, const void* x, bool x_bf16, void* y, bool y_bf16,
                    cudaStream_t st) {
  if (count <= 0) return cudaSuccess;
  if (x_bf16 == y_bf16) {
    return cudaMemcpyAsync(y, x, static_cast<size_t>(count) * (x_bf16 ? 2 : 4),
                           cudaMemcpyDeviceToDevice, st);
  }
  return x_bf16 ? bf16_to_f32(count, x, static_cast<float*>(y), st)
                : f32_to_bf16(count, static_cast<const float*>(x), y, st);
}
cudaError_t oihw_to_ohwi(int o, int i, int kk, const float* w, void* out, bool to_bf16,
                         cudaStream_t st) {
  const unsigned blocks = blocks_for(static_cast<int64_t>(o) * i * kk);
  if (to_bf16) {
    oihw_to_ohwi_kernel<<<blocks, kThreads, 0, st>>>(o, i, kk, w, static_cast<__nv_bfloat16*>(out));
  } else {
    oihw_to_ohwi_kernel<<<blocks, kThreads, 0, st>>>(o, i, kk, w, static_cast<float*>(out));
  }
  return cudaGetLastError();
}
cudaError_t ohwi_to_oihw(int o, int i, int kk, const void* w, bool from_bf16, float* out,
                         bool accumulate, cudaStream_t st) {
  const unsigned blocks = blocks_for(static_cast<int64_t>(o) * i * kk);
  if (from_bf16) {
    ohwi_to_oihw_kernel<<<blocks, kThreads, 0, st>>>(o, i, kk, static_cast<const __nv_bfloat16*>(w),
                                                     out, accumulate);
  } else {
    ohwi_to_oihw_kernel<<<blocks, kThreads, 0, st>>>(o, i, kk, static_cast<const float*>(w), out,
                                                     accumulate);
  }
  return cudaGetLastError();
}

cudaError_t transpose_last2(int64_t b, int64_t r, int64_t c, const void* x, void* y, bool bf16,
                            cudaStream_t st) {
  return bf16 ? transpose_as<uint16_t>(b, r, c, x, y, st) : transpose_as<float>(b, r, c, x, y, st);
}

cudaError_t add_bias(int64_t rows, int cols, const float* b, void* y, bool bf16, cudaStream_t st) {
  return DDPV_BY_ELEMENT(bf16, add_bias_as, rows, cols, b, y, st);
}
cudaError_t bias_grad(int64_t rows, int cols, const void* dy, bool bf16, float* db, bool accumulate,
                      cudaStream_t st) {
  return DDPV_BY_ELEMENT(bf16, bias_grad_as, rows, cols, dy, db, accumulate, st);
}

cudaError_t sgd_update(const SgdArgs& a, const int64_t* decay_ranges, int num_ranges, int64_t count,
                       float* param, const float* grad, float* momentum, cudaStream_t st) {
  sgd_kernel<<<blocks_for(count), kThreads, 0, st>>>(a, decay_ranges, num_ranges, count, param,
                                                     grad, momentum);
  return cudaGetLastError();
}

}  // namespace ddpv::cuda
