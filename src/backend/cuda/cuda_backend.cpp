// The CUDA backend: device and pinned allocators, copies, elementwise ops and the fused SGD
// update on own kernels, op factories (cuDNN, cuBLAS), and the GPU count the registry asks for.
#include "backend/cuda/cuda_backend.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_context.hpp"
#include "backend/cuda/cuda_kernels.hpp"
#include "backend/cuda/cuda_ops.hpp"

namespace ddpv {
namespace {

// Device memory, zero-filled on the compute stream (so ordered before any use of it there).
class CudaDeviceAllocator final : public Allocator {
 public:
  explicit CudaDeviceAllocator(cuda::CudaContext* ctx) : ctx_(ctx) {}
  Device device() const override { return Device::kCuda; }
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    ctx_->make_current();
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, bytes);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      DDPV_FAIL("out of GPU memory allocating ", bytes, " bytes on GPU ", ctx_->device(), " (",
                cudaGetErrorString(status), "): lower --batch-size");
    }
    DDPV_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ctx_->stream()));
    return p;
  }
  void deallocate(void* ptr, size_t) noexcept override {
    if (ptr != nullptr) (void)cudaFree(ptr);
  }

 private:
  cuda::CudaContext* ctx_;
};

// Page-locked host memory: copies from it run at full PCIe/NVLink speed and can be async.
class CudaPinnedAllocator final : public Allocator {
 public:
  explicit CudaPinnedAllocator(cuda::CudaContext* ctx) : ctx_(ctx) {}
  Device device() const override { return Device::kCpu; }
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    ctx_->make_current();
    void* p = nullptr;
    const cudaError_t status = cudaMallocHost(&p, bytes);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      DDPV_FAIL("cannot allocate ", bytes, " bytes of pinned host memory (",
                cudaGetErrorString(status), ")");
    }
    std::memset(p, 0, bytes);
    return p;
  }
  void deallocate(void* ptr, size_t) noexcept override {
    if (ptr != nullptr) (void)cudaFreeHost(ptr);
  }

 private:
  cuda::CudaContext* ctx_;
};

// Note [Batch uploads] on CUDA: a non-blocking copy stream and two events per slot, `copied`
// (recorded on the copy stream after the slot's uploads) and `released` (recorded on the
// compute stream after the slot's last reader). Uploads wait on `released`, compute waits on
// `copied`; only host_done blocks the host. An event never recorded is complete, so a slot's
// first upload does not wait.
class CudaUploadStream final : public UploadStream {
 public:
  CudaUploadStream(cuda::CudaContext* ctx, int slots) : ctx_(ctx) {
    DDPV_CHECK(slots >= 1, "an upload stream needs at least one slot, got ", slots);
    ctx_->make_current();
    DDPV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    events_.resize(static_cast<size_t>(slots) * 2, nullptr);
    for (cudaEvent_t& e : events_) {
      DDPV_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
  }
  ~CudaUploadStream() override {
    (void)cudaSetDevice(ctx_->device());
    if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
    for (cudaEvent_t e : events_) {
      if (e != nullptr) (void)cudaEventDestroy(e);
    }
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }
  CudaUploadStream(const CudaUploadStream&) = delete;
  CudaUploadStream& operator=(const CudaUploadStream&) = delete;

  int slots() const override { return static_cast<int>(events_.size() / 2); }
  void copy(int slot, void* device_dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    DDPV_CUDA_CHECK(cudaStreamWaitEvent(stream_, released(slot), 0));
    DDPV_CUDA_CHECK(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
  }
  void commit(int slot) override { DDPV_CUDA_CHECK(cudaEventRecord(copied(slot), stream_)); }
  void acquire(int slot) override {
    DDPV_CUDA_CHECK(cudaStreamWaitEvent(ctx_->stream(), copied(slot), 0));
  }
  void release(int slot) override {
    DDPV_CUDA_CHECK(cudaEventRecord(released(slot), ctx_->stream()));
  }
  void host_done(int slot) override { DDPV_CUDA_CHECK(cudaEventSynchronize(copied(slot))); }

 private:
  cudaEvent_t copied(int slot) const { return events_.at(static_cast<size_t>(2 * slot)); }
  cudaEvent_t released(int slot) const { return events_.at(static_cast<size_t>(2 * slot + 1)); }

  cuda::CudaContext* ctx_;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;  // per slot: copied, released
};

// Note [Copies are synchronous]: Backend::copy promises the copy is done when it returns
// (callers reuse host buffers at once), so a copy that touches host memory waits for the
// compute stream. Device-to-device copies stay asynchronous, ordered on the stream. The
// overlap of input batches with compute goes through upload_stream() (Note [Batch uploads]).
class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& o)
      : ctx_(std::make_shared<cuda::CudaContext>(o.device_index, o.precision, o.deterministic,
                                                 o.cuda_batchnorm)),
        device_alloc_(ctx_.get()),
        pinned_alloc_(ctx_.get()),
        flag_(sizeof(int)) {}

  ~CudaBackend() override {
    (void)cudaSetDevice(ctx_->device());
    (void)cudaStreamSynchronize(ctx_->stream());
  }

  Device device() const override { return Device::kCuda; }
  std::string name() const override {
    int runtime = 0;
    (void)cudaRuntimeGetVersion(&runtime);
    const size_t dnn = cudnnGetVersion();
    return detail::concat(
        "cuda (", ctx_->device_name(), " #", ctx_->device(), ", CUDA ", runtime / 1000, ".",
        runtime % 1000 / 10, ", cuDNN ", dnn / 10000, ".", dnn % 10000 / 100, ", ",
        precision_name(ctx_->precision()),
        // Note [Tuning options]: shown when not the default
        ctx_->batchnorm_path() == BatchNormPath::kLegacy ? ", batchnorm legacy" : "", ")");
  }

  Allocator* allocator() override { return &device_alloc_; }
  Allocator* staging_allocator() override { return &pinned_alloc_; }

  void copy(void* dst, Device dst_device, const void* src, Device src_device,
            size_t bytes) override {
    if (bytes == 0) return;
    if (dst_device == Device::kCpu && src_device == Device::kCpu) {
      std::memcpy(dst, src, bytes);
      return;
    }
    ctx_->make_current();
    DDPV_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ctx_->stream()));
    if (dst_device == Device::kCpu || src_device == Device::kCpu) ctx_->synchronize();
  }

  void synchronize() override { ctx_->synchronize(); }
  void* native_stream() override { return ctx_->stream(); }
  std::unique_ptr<UploadStream> upload_stream(int slots) override {
    return std::make_unique<CudaUploadStream>(ctx_.get(), slots);
  }

  std::unique_ptr<Conv2dOp> conv2d(const Conv2dConfig& cfg) override {
    DDPV_CHECK(cfg.in_block == 0 && cfg.out_block == 0, "the CUDA backend keeps activations NHWC");
    return cuda::make_conv2d(ctx_, cfg);
  }
  std::unique_ptr<BatchNormOp> batchnorm2d(const BatchNormConfig& cfg) override {
    DDPV_CHECK(cfg.block == 0, "the CUDA backend keeps activations NHWC");
    return cuda::make_batchnorm2d(ctx_, cfg);
  }
  std::unique_ptr<Pool2dOp> pool2d(const Pool2dConfig& cfg) override {
    DDPV_CHECK(cfg.block == 0, "the CUDA backend keeps activations NHWC");
    return cuda::make_pool2d(ctx_, cfg);
  }
  std::unique_ptr<LinearOp> linear(const LinearConfig& cfg) override {
    return cuda::make_linear(ctx_, cfg);
  }
  std::unique_ptr<SoftmaxCrossEntropyOp> softmax_cross_entropy(int classes) override {
    return cuda::make_softmax_cross_entropy(ctx_, classes);
  }

  // Activations are bf16 under --precision bf16 (Note [Activation dtype]); each op computes in
  // its output's dtype.
  DType activation_dtype() const override { return ctx_->bf16() ? DType::kBF16 : DType::kF32; }
  void relu_forward(int64_t count, ConstAct x, MutAct y) override {
    const Operands in = alike(count, x, nullptr, y.dtype);
    DDPV_CUDA_CHECK(cuda::relu_forward(count, in.a, y.data, y.is_bf16(), ctx_->stream()));
  }
  void relu_backward(int64_t count, ConstAct y, ConstAct dy, MutAct dx) override {
    const Operands in = alike(count, y, dy, dx.dtype);
    DDPV_CUDA_CHECK(cuda::relu_backward(count, in.a, in.b, dx.data, dx.is_bf16(), ctx_->stream()));
  }
  void add(int64_t count, ConstAct a, ConstAct b, MutAct y) override {
    const Operands in = alike(count, a, b, y.dtype);
    DDPV_CUDA_CHECK(cuda::add(count, in.a, in.b, y.data, y.is_bf16(), ctx_->stream()));
  }
  void add_relu(int64_t count, ConstAct a, ConstAct b, MutAct y) override {
    const Operands in = alike(count, a, b, y.dtype);
    DDPV_CUDA_CHECK(cuda::add_relu(count, in.a, in.b, y.data, y.is_bf16(), ctx_->stream()));
  }
  void fill(int64_t count, float value, float* y) override {
    DDPV_CUDA_CHECK(cuda::fill(count, value, y, ctx_->stream()));
  }
  void scale(int64_t count, float alpha, float* y) override {
    DDPV_CUDA_CHECK(cuda::scale(count, alpha, y, ctx_->stream()));
  }

  void cast_to_bf16(int64_t count, const float* x, uint16_t* y) override {
    if (count > 0) DDPV_CUDA_CHECK(cuda::f32_to_bf16(count, x, y, ctx_->stream()));
  }
  void cast_from_bf16(int64_t count, const uint16_t* x, float* y) override {
    if (count > 0) DDPV_CUDA_CHECK(cuda::bf16_to_f32(count, x, y, ctx_->stream()));
  }

  void relayout(int n, int h, int w, int c, int from, int to, ConstAct xa, MutAct y) override {
    DDPV_CHECK(xa.data != y.data, "relayout: a transpose cannot run in place");
    const void* x = alike(int64_t{n} * h * w * c, xa, nullptr, y.dtype).a;
    const cudaStream_t st = ctx_->stream();
    if (from == 0 && to == kNchw) {
      DDPV_CUDA_CHECK(cuda::transpose_last2(n, int64_t{h} * w, c, x, y.data, y.is_bf16(), st));
    } else if (from == kNchw && to == 0) {
      DDPV_CUDA_CHECK(cuda::transpose_last2(n, c, int64_t{h} * w, x, y.data, y.is_bf16(), st));
    } else {
      DDPV_FAIL("the CUDA backend converts activations between NHWC and NCHW only (asked: ", from,
                " -> ", to, ")");
    }
  }

  bool all_finite(int64_t count, const float* x) override {
    const cudaStream_t st = ctx_->stream();
    DDPV_CUDA_CHECK(cudaMemsetAsync(flag_.get(), 0, sizeof(int), st));
    DDPV_CUDA_CHECK(cuda::flag_nonfinite(count, x, flag_.as<int>(), st));
    int host = 0;
    DDPV_CUDA_CHECK(cudaMemcpyAsync(&host, flag_.get(), sizeof host, cudaMemcpyDeviceToHost, st));
    ctx_->synchronize();
    return host == 0;
  }

  void sgd_update(const SgdConfig& cfg, const std::vector<ParamSpan>& spans, int64_t count,
                  float* param, const float* grad, float* momentum) override {
    DDPV_CHECK(cfg.momentum >= 0 && cfg.weight_decay >= 0 && cfg.lr >= 0,
               "sgd_update: lr, momentum and weight decay must be >= 0, got lr=", cfg.lr,
               " momentum=", cfg.momentum, " weight_decay=", cfg.weight_decay);
    DDPV_CHECK(momentum != nullptr || cfg.momentum == 0.0f, "sgd_update: momentum ", cfg.momentum,
               " needs a momentum buffer, got null");
    upload_decay_ranges(spans, count);
    const cuda::SgdArgs args{cfg.lr, cfg.momentum, cfg.weight_decay, cfg.grad_scale, cfg.nesterov};
    DDPV_CUDA_CHECK(cuda::sgd_update(args, ranges_.as<int64_t>(),
                                     static_cast<int>(host_ranges_.size() / 2), count, param, grad,
                                     momentum, ctx_->stream()));
  }

 private:
  // An elementwise op's inputs in its output's dtype: where they lie, or converted into scratch
  // (Note [Casts at the edges]; mixed dtypes meet only at the model's f32 input). b may be null.
  struct Operands {
    const void* a;
    const void* b;
  };
  Operands alike(int64_t count, ConstAct a, ConstAct b, DType want) {
    cuda::ScratchCarver sc(ctx_->scratch(cuda::staged_bytes(a.data, a.dtype, want, count) +
                                         cuda::staged_bytes(b.data, b.dtype, want, count)));
    const cudaStream_t st = ctx_->stream();
    const void* ap = cuda::staged_input(a, want, count, sc, st);
    return {ap, cuda::staged_input(b, want, count, sc, st)};
  }

  // The decayed runs of the arena as sorted, merged [begin, end) pairs on the device; uploaded
  // again only when the spans change (they are fixed for a model, so once per run).
  void upload_decay_ranges(const std::vector<ParamSpan>& spans, int64_t count) {
    std::vector<ParamSpan> sorted = spans;
    std::sort(sorted.begin(), sorted.end(),
              [](const ParamSpan& a, const ParamSpan& b) { return a.offset < b.offset; });
    std::vector<int64_t> ranges;
    int64_t covered = 0;  // the spans, sorted, must tile [0, count)
    for (const ParamSpan& s : sorted) {
      DDPV_CHECK(s.offset >= 0 && s.count >= 0 && s.offset + s.count <= count, "sgd_update: span [",
                 s.offset, ", ", s.offset + s.count, ") lies outside the arena of ", count,
                 " parameters");
      DDPV_CHECK(s.offset == covered, "sgd_update: the spans leave out or overlap at parameter ",
                 std::min(s.offset, covered), "; every parameter must lie in exactly one span");
      covered = s.offset + s.count;
      if (!s.decay || s.count == 0) continue;
      if (!ranges.empty() && ranges.back() == s.offset) {
        ranges.back() = s.offset + s.count;
      } else {
        ranges.push_back(s.offset);
        ranges.push_back(s.offset + s.count);
      }
    }
    DDPV_CHECK(covered == count, "sgd_update: the spans cover ", covered, " of the ", count,
               " parameters; every parameter must lie in exactly one span");
    if (ranges == host_ranges_) return;  // starts empty: no table needed then
    const size_t bytes = std::max<size_t>(sizeof(int64_t) * ranges.size(), sizeof(int64_t) * 2);
    if (ranges_.size() < bytes) ranges_ = cuda::DeviceMemory(bytes);
    if (!ranges.empty()) {
      DDPV_CUDA_CHECK(cudaMemcpyAsync(ranges_.get(), ranges.data(), sizeof(int64_t) * ranges.size(),
                                      cudaMemcpyHostToDevice, ctx_->stream()));
      ctx_->synchronize();  // the host vector may change before an async copy would read it
    }
    host_ranges_ = std::move(ranges);
  }

  std::shared_ptr<cuda::CudaContext> ctx_;
  CudaDeviceAllocator device_alloc_;
  CudaPinnedAllocator pinned_alloc_;
  cuda::DeviceMemory flag_;    // one int for all_finite
  cuda::DeviceMemory ranges_;  // decay ranges for sgd_update
  std::vector<int64_t> host_ranges_;
};

}  // namespace

int cuda_visible_device_count() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: not an error for the caller
    return 0;
  }
  return count;
}

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  const int count = cuda_visible_device_count();
  DDPV_CHECK(count > 0,
             "--device cuda: no CUDA device is visible on this host (check nvidia-smi and "
             "CUDA_VISIBLE_DEVICES, or use --device cpu)");
  DDPV_CHECK(options.device_index >= 0 && options.device_index < count, "GPU ",
             options.device_index, " was asked for (the rank's node-local rank) but this host has ",
             count, " visible: start at most ", count, " ranks per node");
  DDPV_CHECK(options.precision != Precision::kF16,
             "--precision fp16 is not supported by the CUDA backend: use bf16 (same speed, no "
             "loss scaling) or fp32");
  return std::make_unique<CudaBackend>(options);
}

}  // namespace ddpv
