// What every CUDA op of one backend shares: the device, the compute stream, the cuDNN and cuBLAS
// handles, the reusable workspace and scratch buffers and the cache of convolution algorithms;
// plus RAII owners for device memory and cuDNN descriptors.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <utility>

#include "backend/cuda/cuda_check.hpp"
#include "ddpv/backend/backend.hpp"

namespace ddpv::cuda {

// Device memory from cudaMalloc, freed on destruction (cudaFree waits for the device, so
// memory still in use by queued kernels is never handed back early).
class DeviceMemory {
 public:
  DeviceMemory() = default;
  explicit DeviceMemory(size_t bytes);
  ~DeviceMemory();
  DeviceMemory(DeviceMemory&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceMemory& operator=(DeviceMemory&& o) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  void* get() const { return ptr_; }
  size_t size() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// One cuDNN descriptor, created on construction and destroyed with the object.
template <typename T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
class CudnnDescriptor {
 public:
  CudnnDescriptor() { DDPV_CUDNN_CHECK(Create(&desc_)); }
  ~CudnnDescriptor() {
    if (desc_ != nullptr) Destroy(desc_);
  }
  CudnnDescriptor(const CudnnDescriptor&) = delete;
  CudnnDescriptor& operator=(const CudnnDescriptor&) = delete;
  T get() const { return desc_; }

 private:
  T desc_ = nullptr;
};
using TensorDesc = CudnnDescriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor,
                                   cudnnDestroyTensorDescriptor>;
using FilterDesc = CudnnDescriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor,
                                   cudnnDestroyFilterDescriptor>;
using ConvDesc = CudnnDescriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                                 cudnnDestroyConvolutionDescriptor>;

// The algorithm picked for one convolution shape and direction.
struct ConvAlgo {
  int algo = 0;  // a cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace = 0;
};

// Note [One scratch buffer]: all ops of a backend run in order on one compute stream, and no
// op needs its scratch contents after it returns (what backward needs is kept in the op's own
// buffers). So one grow-only scratch buffer and one grow-only cuDNN workspace serve every op.
// A pointer from scratch() or workspace() is valid until the next call of the same function:
// an op asks once per call for everything it needs and carves it with ScratchCarver.
class CudaContext {
 public:
  CudaContext(int device, Precision precision, bool deterministic, BatchNormPath batchnorm);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  int device() const { return device_; }
  Precision precision() const { return precision_; }
  bool bf16() const { return precision_ == Precision::kBF16; }
  bool deterministic() const { return deterministic_; }
  BatchNormPath batchnorm_path() const { return batchnorm_; }
  cudaStream_t stream() const { return stream_; }
  cudnnHandle_t cudnn() const { return cudnn_; }
  cublasHandle_t cublas() const { return cublas_; }
  const std::string& device_name() const { return device_name_; }

  // Makes this context's GPU current on the calling thread (a loader or communication thread).
  void make_current() const;
  void* workspace(size_t bytes) { return grow(workspace_, bytes); }
  void* scratch(size_t bytes) { return grow(scratch_, bytes); }
  // Waits for the stream and throws if it failed.
  void synchronize() const;

  // Convolution algorithms found once per shape (see Note [Convolution algorithms]).
  const ConvAlgo* cached_algo(const std::string& key) const;
  void cache_algo(const std::string& key, const ConvAlgo& algo) { algos_[key] = algo; }

 private:
  void* grow(DeviceMemory& buffer, size_t bytes);

  int device_;
  Precision precision_;
  bool deterministic_;
  BatchNormPath batchnorm_;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  DeviceMemory workspace_, scratch_;
  std::map<std::string, ConvAlgo> algos_;
};

// Hands out 256-byte aligned pieces of one buffer: first count the sizes, then carve.
class ScratchCarver {
 public:
  static constexpr size_t kAlign = 256;
  static size_t round(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
  explicit ScratchCarver(void* base) : base_(static_cast<char*>(base)) {}
  void* take(size_t bytes) {
    void* p = base_ + used_;
    used_ += round(bytes);
    return p;
  }

 private:
  char* base_;
  size_t used_ = 0;
};

// Note [Casts at the edges]: an op computes in one dtype (bf16 under --precision bf16, unless
// cuDNN has no bf16 kernel for it: Note [bf16 fallback]), while its operands come in the
// backend's activation dtype, or f32 for the model's input (Note [Activation dtype]). An
// operand in the dtype the op computes in is used where it lies; another is converted through
// scratch, an input before the call and an output after it. With bf16 activations that is
// only the first layer's input and the layers that fell back to fp32; no cast sits between
// two bf16 layers.
inline bool is_bf16(DType t) { return t == DType::kBF16; }
inline cudnnDataType_t cudnn_dtype(DType t) {
  return is_bf16(t) ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}
// The scratch an operand of `count` elements needs to become `want` (0: none, or a null view).
size_t staged_bytes(const void* data, DType have, DType want, int64_t count);
// The input as `want`: the view's memory, or a converted copy carved from `sc`.
const void* staged_input(ConstAct a, DType want, int64_t count, ScratchCarver& sc, cudaStream_t st);
// Where to compute an output in `want`: the view's memory, or a piece of `sc`; then
// unstage_output converts what was computed there into the view (nothing when it is the view).
void* staged_output(MutAct a, DType want, int64_t count, ScratchCarver& sc);
void unstage_output(const void* computed, DType want, MutAct a, int64_t count, cudaStream_t st);

}  // namespace ddpv::cuda
