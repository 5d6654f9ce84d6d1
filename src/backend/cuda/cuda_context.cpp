// CudaContext: device, stream and library handles shared by the ops of one CUDA backend, and the
// grow-only workspace and scratch buffers (Note [One scratch buffer]).
#include "backend/cuda/cuda_context.hpp"

#include "backend/cuda/cuda_kernels.hpp"
#include "ddpv/core/log.hpp"

namespace ddpv::cuda {

DeviceMemory::DeviceMemory(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t status = cudaMalloc(&ptr_, bytes);
  if (status != cudaSuccess) {
    ptr_ = nullptr;
    bytes_ = 0;
    (void)cudaGetLastError();  // clear the sticky-free error so later calls are not confused
    DDPV_FAIL("out of GPU memory allocating ", bytes, " bytes (", cudaGetErrorString(status),
              "): lower --batch-size");
  }
}

DeviceMemory::~DeviceMemory() {
  if (ptr_ != nullptr) (void)cudaFree(ptr_);
}

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& o) noexcept {
  if (this != &o) {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

CudaContext::CudaContext(int device, Precision precision, bool deterministic,
                         BatchNormPath batchnorm)
    : device_(device), precision_(precision), deterministic_(deterministic), batchnorm_(batchnorm) {
  DDPV_CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  DDPV_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  device_name_ = prop.name;
  try {
    // Non-blocking: the legacy default stream (used by libraries we do not control) must not
    // serialise with our compute.
    DDPV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DDPV_CUDNN_CHECK(cudnnCreate(&cudnn_));
    DDPV_CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
    DDPV_CUBLAS_CHECK(cublasCreate(&cublas_));
    DDPV_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    // fp32 GEMMs stay true fp32 (no TF32), so that fp32 runs match the CPU backend.
    DDPV_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
  } catch (...) {
    if (cublas_ != nullptr) cublasDestroy(cublas_);
    if (cudnn_ != nullptr) cudnnDestroy(cudnn_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    throw;
  }
}

CudaContext::~CudaContext() {
  (void)cudaSetDevice(device_);
  (void)cudaStreamSynchronize(stream_);
  workspace_ = DeviceMemory();
  scratch_ = DeviceMemory();
  cublasDestroy(cublas_);
  cudnnDestroy(cudnn_);
  (void)cudaStreamDestroy(stream_);
}

void CudaContext::make_current() const { DDPV_CUDA_CHECK(cudaSetDevice(device_)); }

void CudaContext::synchronize() const { DDPV_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void* CudaContext::grow(DeviceMemory& buffer, size_t bytes) {
  if (bytes <= buffer.size()) return buffer.get();
  // Round up to whole MiB and a quarter more, so a slowly growing request does not reallocate
  // at every call; the old buffer may still be read by queued work, and cudaFree waits for it.
  constexpr size_t kMiB = size_t{1} << 20;
  const size_t want = (bytes + bytes / 4 + kMiB - 1) / kMiB * kMiB;
  buffer = DeviceMemory();
  buffer = DeviceMemory(want);
  DDPV_DEBUG("cuda: grew a buffer to ", want / kMiB, " MiB");
  return buffer.get();
}

const ConvAlgo* CudaContext::cached_algo(const std::string& key) const {
  const auto it = algos_.find(key);
  return it == algos_.end() ? nullptr : &it->second;
}

size_t staged_bytes(const void* data, DType have, DType want, int64_t count) {
  if (data == nullptr || have == want) return 0;
  return ScratchCarver::round(static_cast<size_t>(count) * dtype_size(want));
}

const void* staged_input(ConstAct a, DType want, int64_t count, ScratchCarver& sc,
                         cudaStream_t st) {
  if (a.data == nullptr || a.dtype == want) return a.data;
  void* p = sc.take(static_cast<size_t>(count) * dtype_size(want));
  DDPV_CUDA_CHECK(convert(count, a.data, is_bf16(a.dtype), p, is_bf16(want), st));
  return p;
}

void* staged_output(MutAct a, DType want, int64_t count, ScratchCarver& sc) {
  if (a.data == nullptr || a.dtype == want) return a.data;
  return sc.take(static_cast<size_t>(count) * dtype_size(want));
}

void unstage_output(const void* computed, DType want, MutAct a, int64_t count, cudaStream_t st) {
  if (a.data == nullptr || computed == a.data) return;
  DDPV_CUDA_CHECK(convert(count, computed, is_bf16(want), a.data, is_bf16(a.dtype), st));
}

}  // namespace ddpv::cuda
