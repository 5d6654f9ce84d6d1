// Pooling on the GPU, NHWC: max (with its arg-max kept for backward), average including padding,
// and global average; forward and backward side by side, on the backend's own kernels, over f32
// or bf16 activations.
#include <memory>

#include "backend/cuda/cuda_context.hpp"
#include "backend/cuda/cuda_kernels.hpp"
#include "backend/cuda/cuda_ops.hpp"

namespace ddpv::cuda {
namespace {

// Note [Pooling kernels]: cuDNN's pooling backward takes x and y of the forward, which the
// Pool2dOp interface does not hand back (backward gets dy alone), so the op would have to keep
// copies of both. Max pooling instead keeps one int32 arg-max per output, and backward gathers
// over the windows that cover each input, which needs no atomics and is deterministic. The
// kernels are memory-bound loops of a few lines; ResNet has one max pool and one global pool.
// The output's dtype is the one computed in; an input in another (the model's f32 input) is
// converted first (Note [Casts at the edges]).
class CudaPool2d final : public Pool2dOp {
 public:
  CudaPool2d(std::shared_ptr<CudaContext> ctx, const Pool2dConfig& cfg)
      : ctx_(std::move(ctx)), cfg_(cfg) {
    const bool global = cfg.kind == PoolKind::kGlobalAvg;
    DDPV_CHECK(cfg.channels > 0 && cfg.in_h > 0 && cfg.in_w > 0, "pool2d: invalid input (channels ",
               cfg.channels, ", ", cfg.in_h, "x", cfg.in_w, ")");
    DDPV_CHECK(global || (cfg.kernel > 0 && cfg.stride > 0 && cfg.padding >= 0 &&
                          2 * cfg.padding <= cfg.kernel && cfg.out_h() > 0 && cfg.out_w() > 0),
               "pool2d: invalid window (kernel ", cfg.kernel, ", stride ", cfg.stride, ", padding ",
               cfg.padding, ") for a ", cfg.in_h, "x", cfg.in_w,
               " input; padding may be at most half the kernel");
  }

  void forward(int n, ConstAct xa, MutAct y) override {
    DDPV_CHECK(n > 0, "pool2d: batch size must be positive, got ", n);
    const cudaStream_t st = ctx_->stream();
    const PoolShape s = shape(n);
    const int64_t xn = int64_t{n} * s.h * s.w * s.c;
    ScratchCarver sc(ctx_->scratch(staged_bytes(xa.data, xa.dtype, y.dtype, xn)));
    const void* x = staged_input(xa, y.dtype, xn, sc, st);
    const bool bf16 = y.is_bf16();
    switch (cfg_.kind) {
      case PoolKind::kMax: {
        const size_t bytes = sizeof(int32_t) * static_cast<size_t>(n) * s.oh * s.ow * s.c;
        if (argmax_.size() < bytes) argmax_ = DeviceMemory(bytes);
        DDPV_CUDA_CHECK(max_pool_forward(s, x, y.data, argmax_.as<int32_t>(), bf16, st));
        break;
      }
      case PoolKind::kAvg:
        DDPV_CUDA_CHECK(avg_pool_forward(s, x, y.data, bf16, st));
        break;
      case PoolKind::kGlobalAvg:
        DDPV_CUDA_CHECK(global_avg_forward(n, s.h * s.w, s.c, x, y.data, bf16, st));
        break;
    }
    last_n_ = n;
  }

  void backward(int n, ConstAct dya, MutAct dx) override {
    const cudaStream_t st = ctx_->stream();
    const PoolShape s = shape(n);
    const int64_t yn = int64_t{n} * s.oh * s.ow * s.c;
    ScratchCarver sc(ctx_->scratch(staged_bytes(dya.data, dya.dtype, dx.dtype, yn)));
    const void* dy = staged_input(dya, dx.dtype, yn, sc, st);
    const bool bf16 = dx.is_bf16();
    switch (cfg_.kind) {
      case PoolKind::kMax:
        DDPV_CHECK(n == last_n_, "pool2d: backward of batch ", n,
                   " does not follow a forward of that batch (last was ", last_n_, ")");
        DDPV_CUDA_CHECK(max_pool_backward(s, dy, argmax_.as<int32_t>(), dx.data, bf16, st));
        break;
      case PoolKind::kAvg:
        DDPV_CUDA_CHECK(avg_pool_backward(s, dy, dx.data, bf16, st));
        break;
      case PoolKind::kGlobalAvg:
        DDPV_CUDA_CHECK(global_avg_backward(n, s.h * s.w, s.c, dy, dx.data, bf16, st));
        break;
    }
  }

 private:
  PoolShape shape(int n) const {
    PoolShape s;
    s.n = n;
    s.h = cfg_.in_h;
    s.w = cfg_.in_w;
    s.c = cfg_.channels;
    s.oh = cfg_.out_h();
    s.ow = cfg_.out_w();
    s.kernel = cfg_.kernel;
    s.stride = cfg_.stride;
    s.padding = cfg_.padding;
    return s;
  }

  std::shared_ptr<CudaContext> ctx_;
  Pool2dConfig cfg_;
  DeviceMemory argmax_;  // (N, OH, OW, C) int32, max pooling only
  int last_n_ = -1;
};

}  // namespace

std::unique_ptr<Pool2dOp> make_pool2d(std::shared_ptr<CudaContext> ctx, const Pool2dConfig& cfg) {
  return std::make_unique<CudaPool2d>(std::move(ctx), cfg);
}

}  // namespace ddpv::cuda
