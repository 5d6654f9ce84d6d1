// BatchNorm on cuDNN over NHWC activations, f32 or bf16, with fp32 parameters and statistics:
// training forward (batch statistics, running statistics updated as PyTorch does), inference
// forward, and backward.
#include <memory>

#include "backend/cuda/cuda_context.hpp"
#include "backend/cuda/cuda_ops.hpp"
#include "ddpv/core/log.hpp"

namespace ddpv::cuda {
namespace {

// Note [BatchNorm on cuDNN]:
//  - Running statistics: cuDNN computes running = (1 - f) * running + f * batch with
//    f = exponentialAverageFactor, and uses the unbiased (N - 1) batch variance for the
//    running variance; with f = momentum this is exactly PyTorch's update (PyTorch's own CUDA
//    path calls the same function). The GPU-vs-CPU parity test checks it.
//  - Mode: CUDNN_BATCHNORM_SPATIAL_PERSISTENT through the *Ex functions, with a workspace and
//    a reserve space kept from forward to backward: what PyTorch calls for channels_last
//    training. When cuDNN declines PERSISTENT for a shape (any failure status), the op falls
//    back to the plain functions in CUDNN_BATCHNORM_SPATIAL for good (a genuine error then
//    fails there too). A backward that declines the Ex function falls back to the plain one
//    in the same mode, which reads the same saved statistics.
//    Inference always uses SPATIAL (PERSISTENT is a training-only mode).
//    --cuda-bn legacy (BatchNormPath::kLegacy) uses the plain functions (PERSISTENT, then
//    SPATIAL as above) from the start, for comparisons: what training used until the first GPU
//    run. They take no workspace and are several times slower on resnet50's shapes (the
//    figures: docs/performance.md, GPU).
//  - The persistent kernels read the per-channel vectors (gamma, beta, the running and saved
//    statistics, their gradients) 16 bytes at a time and fault with "misaligned address"
//    otherwise; the arenas keep every tensor 64-byte aligned (Note [Aligned entries]).
//  - Under --precision bf16, x, y, dy and dx are bf16 and gamma, beta, the statistics and their
//    gradients fp32 (cuDNN derives an fp32 parameter descriptor from a bf16 one), which is how
//    PyTorch runs BatchNorm on bf16 channels_last tensors. A shape for which cuDNN refuses
//    bf16 in the spatial mode too runs in fp32 for good, with a warning, through casts at its
//    edges (Note [Casts at the edges]); the saved statistics are fp32 either way.
class CudaBatchNorm final : public BatchNormOp {
 public:
  CudaBatchNorm(std::shared_ptr<CudaContext> ctx, const BatchNormConfig& cfg)
      : ctx_(std::move(ctx)),
        cfg_(cfg),
        saved_mean_(sizeof(float) * cfg.channels),
        saved_inv_var_(sizeof(float) * cfg.channels) {
    ex_ = ctx_->batchnorm_path() == BatchNormPath::kEx;  // --cuda-bn
    dtype_ = ctx_->bf16() ? DType::kBF16 : DType::kF32;
    DDPV_CHECK(cfg.channels > 0 && cfg.h > 0 && cfg.w > 0,
               "batchnorm2d: invalid configuration (channels ", cfg.channels, ", ", cfg.h, "x",
               cfg.w, ")");
    DDPV_CHECK(cfg.eps > 0 && cfg.eps >= CUDNN_BN_MIN_EPSILON,
               "batchnorm2d: eps must be positive, got ", cfg.eps);
    DDPV_CHECK(cfg.momentum >= 0 && cfg.momentum <= 1,
               "batchnorm2d: momentum must lie in [0, 1], got ", cfg.momentum);
  }

  void forward_train(int n, ConstAct x, const float* gamma, const float* beta, MutAct y,
                     float* running_mean, float* running_var) override {
    set_batch(n);
    DDPV_CHECK(int64_t{n} * cfg_.h * cfg_.w > 1,
               "batchnorm2d: training needs more than one value per channel, got batch ", n, " of ",
               cfg_.h, "x", cfg_.w, "; use a larger batch");
    for (;;) {
      set_batch(n);
      const Io io = stage(x, nullptr, y);
      const void* xc = io.x;
      void* yc = io.out;
      auto plain = [&] {
        const float one = 1.0f, zero = 0.0f;
        return cudnnBatchNormalizationForwardTraining(
            ctx_->cudnn(), mode_, &one, &zero, x_desc_.get(), xc, x_desc_.get(), yc, bn_desc_.get(),
            gamma, beta, static_cast<double>(cfg_.momentum), running_mean, running_var,
            static_cast<double>(cfg_.eps), saved_mean_.get(), saved_inv_var_.get());
      };
      cudnnStatus_t status =
          ex_ ? forward_ex(xc, gamma, beta, yc, running_mean, running_var) : plain();
      if (status != CUDNN_STATUS_SUCCESS && mode_ == CUDNN_BATCHNORM_SPATIAL_PERSISTENT) {
        DDPV_DEBUG("cuda batchnorm: persistent mode refused (", cudnnGetErrorString(status),
                   ") for C=", cfg_.channels, " ", cfg_.h, "x", cfg_.w, ", using spatial mode");
        ex_ = false;
        mode_ = CUDNN_BATCHNORM_SPATIAL;
        status = plain();
      }
      if (status == CUDNN_STATUS_SUCCESS) {
        unstage_output(yc, dtype_, y, count(), ctx_->stream());
        break;
      }
      if (!refused_bf16(status, /*restart=*/true)) DDPV_CUDNN_CHECK(status);
    }
    trained_n_ = n;
  }

  void forward_infer(int n, ConstAct x, const float* gamma, const float* beta,
                     const float* running_mean, const float* running_var, MutAct y) override {
    for (;;) {
      set_batch(n);
      const Io io = stage(x, nullptr, y);
      const void* xc = io.x;
      void* yc = io.out;
      const float one = 1.0f, zero = 0.0f;
      const cudnnStatus_t status = cudnnBatchNormalizationForwardInference(
          ctx_->cudnn(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, x_desc_.get(), xc, x_desc_.get(), yc,
          bn_desc_.get(), gamma, beta, running_mean, running_var, static_cast<double>(cfg_.eps));
      if (status == CUDNN_STATUS_SUCCESS) {
        unstage_output(yc, dtype_, y, count(), ctx_->stream());
        return;
      }
      if (!refused_bf16(status, /*restart=*/false)) DDPV_CUDNN_CHECK(status);
    }
  }

  void backward(int n, ConstAct x, const float* gamma, ConstAct dy, MutAct dx, float* dgamma,
                float* dbeta, bool accumulate) override {
    DDPV_CHECK(n == trained_n_, "batchnorm2d: backward of batch ", n,
               " does not follow a forward_train of that batch (last was ", trained_n_, ")");
    const float one = 1.0f, zero = 0.0f;
    const float* beta_param = accumulate ? &one : &zero;
    for (;;) {
      set_batch(n);
      const Io io = stage(x, dy, dx);
      const void* xc = io.x;
      const void* dyc = io.dy;
      void* dxc = io.out;
      cudnnStatus_t status = CUDNN_STATUS_NOT_SUPPORTED;
      if (ex_) {
        size_t ws_bytes = 0;
        status = cudnnGetBatchNormalizationBackwardExWorkspaceSize(
            ctx_->cudnn(), mode_, CUDNN_BATCHNORM_OPS_BN, x_desc_.get(), x_desc_.get(),
            x_desc_.get(), nullptr, x_desc_.get(), bn_desc_.get(), nullptr, &ws_bytes);
        if (status == CUDNN_STATUS_SUCCESS) {
          void* ws = ctx_->workspace(ws_bytes);
          status = cudnnBatchNormalizationBackwardEx(
              ctx_->cudnn(), mode_, CUDNN_BATCHNORM_OPS_BN, &one, &zero, &one, beta_param,
              x_desc_.get(), xc, nullptr, nullptr, x_desc_.get(), dyc, nullptr, nullptr,
              x_desc_.get(), dxc, bn_desc_.get(), gamma, nullptr, dgamma, dbeta,
              static_cast<double>(cfg_.eps), saved_mean_.get(), saved_inv_var_.get(), nullptr, ws,
              ws_bytes, reserve_.get(), reserve_.size());
        }
        if (status != CUDNN_STATUS_SUCCESS) {
          // The saved statistics are the plain functions' too: they take over from here.
          DDPV_DEBUG("cuda batchnorm: backward with a workspace refused (",
                     cudnnGetErrorString(status), ") for C=", cfg_.channels, " ", cfg_.h, "x",
                     cfg_.w, ", using the plain functions");
          ex_ = false;
        }
      }
      if (!ex_) {
        status = cudnnBatchNormalizationBackward(
            ctx_->cudnn(), mode_, &one, &zero, &one, beta_param, x_desc_.get(), xc, x_desc_.get(),
            dyc, x_desc_.get(), dxc, bn_desc_.get(), gamma, dgamma, dbeta,
            static_cast<double>(cfg_.eps), saved_mean_.get(), saved_inv_var_.get());
      }
      if (status == CUDNN_STATUS_SUCCESS) {
        unstage_output(dxc, dtype_, dx, count(), ctx_->stream());
        return;
      }
      if (!refused_bf16(status, /*restart=*/false)) DDPV_CUDNN_CHECK(status);
    }
  }

 private:
  int64_t count() const { return int64_t{n_} * cfg_.h * cfg_.w * cfg_.channels; }

  // x and dy (null in forward) as dtype_, and where to compute the output in dtype_ (Note
  // [Casts at the edges]); unstage_output finishes the output.
  struct Io {
    const void* x;
    const void* dy;
    void* out;
  };
  Io stage(ConstAct x, ConstAct dy, MutAct out) {
    ScratchCarver sc(ctx_->scratch(staged_bytes(x.data, x.dtype, dtype_, count()) +
                                   staged_bytes(dy.data, dy.dtype, dtype_, count()) +
                                   staged_bytes(out.data, out.dtype, dtype_, count())));
    const cudaStream_t st = ctx_->stream();
    const void* xc = staged_input(x, dtype_, count(), sc, st);
    const void* dyc = staged_input(dy, dtype_, count(), sc, st);
    return {xc, dyc, staged_output(out, dtype_, count(), sc)};
  }

  // After a call in bf16 that cuDNN refused in every mode: true, and the op computes in fp32
  // from now on, through casts (the caller retries). False in fp32: the refusal is an error.
  // restart (a training forward): try the Ex functions and the persistent mode again in fp32;
  // otherwise the plain functions in the current mode, which read only the saved statistics
  // (fp32 whatever the data's dtype), never a reserve space filled in bf16.
  bool refused_bf16(cudnnStatus_t status, bool restart) {
    if (dtype_ != DType::kBF16) return false;
    DDPV_WARN("cuDNN refused bf16 BatchNorm for C=", cfg_.channels, " ", cfg_.h, "x", cfg_.w, " (",
              cudnnGetErrorString(status), "): this layer computes in fp32 from now on");
    dtype_ = DType::kF32;
    ex_ = restart && ctx_->batchnorm_path() == BatchNormPath::kEx;
    if (restart) mode_ = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
    n_ = -1;  // describes x in fp32 on the next set_batch
    return true;
  }

  // The Ex forward in PERSISTENT mode; its status (a refusal is not an error: the caller falls
  // back). The reserve space it fills is what backward reads.
  cudnnStatus_t forward_ex(const void* x, const float* gamma, const float* beta, void* y,
                           float* running_mean, float* running_var) {
    const float one = 1.0f, zero = 0.0f;
    size_t ws_bytes = 0, reserve_bytes = 0;
    cudnnStatus_t status = cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
        ctx_->cudnn(), mode_, CUDNN_BATCHNORM_OPS_BN, x_desc_.get(), x_desc_.get(), x_desc_.get(),
        bn_desc_.get(), nullptr, &ws_bytes);
    if (status == CUDNN_STATUS_SUCCESS) {
      status = cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
          ctx_->cudnn(), mode_, CUDNN_BATCHNORM_OPS_BN, nullptr, x_desc_.get(), &reserve_bytes);
    }
    if (status != CUDNN_STATUS_SUCCESS) return status;
    if (reserve_bytes > reserve_.size()) reserve_ = DeviceMemory(reserve_bytes);
    void* ws = ctx_->workspace(ws_bytes);
    return cudnnBatchNormalizationForwardTrainingEx(
        ctx_->cudnn(), mode_, CUDNN_BATCHNORM_OPS_BN, &one, &zero, x_desc_.get(), x, nullptr,
        nullptr, x_desc_.get(), y, bn_desc_.get(), gamma, beta, static_cast<double>(cfg_.momentum),
        running_mean, running_var, static_cast<double>(cfg_.eps), saved_mean_.get(),
        saved_inv_var_.get(), nullptr, ws, ws_bytes, reserve_.get(), reserve_bytes);
  }

  void set_batch(int n) {
    DDPV_CHECK(n > 0, "batchnorm2d: batch size must be positive, got ", n);
    if (n == n_) return;
    DDPV_CUDNN_CHECK(cudnnSetTensor4dDescriptor(
        x_desc_.get(), CUDNN_TENSOR_NHWC, cudnn_dtype(dtype_), n, cfg_.channels, cfg_.h, cfg_.w));
    // The derived (1, C, 1, 1) descriptor is the same for the spatial modes.
    DDPV_CUDNN_CHECK(
        cudnnDeriveBNTensorDescriptor(bn_desc_.get(), x_desc_.get(), CUDNN_BATCHNORM_SPATIAL));
    n_ = n;
  }

  std::shared_ptr<CudaContext> ctx_;
  BatchNormConfig cfg_;
  TensorDesc x_desc_, bn_desc_;
  DeviceMemory saved_mean_, saved_inv_var_;  // (C): kept by forward_train for backward
  DeviceMemory reserve_;  // the Ex path's reserve space, kept by forward_train for backward
  bool ex_ = true;        // the Ex functions (Note [BatchNorm on cuDNN])
  DType dtype_;           // what x, y, dy and dx are computed in
  cudnnBatchNormMode_t mode_ = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
  int n_ = -1, trained_n_ = -1;
};

}  // namespace

std::unique_ptr<BatchNormOp> make_batchnorm2d(std::shared_ptr<CudaContext> ctx,
                                              const BatchNormConfig& cfg) {
  return std::make_unique<CudaBatchNorm>(std::move(ctx), cfg);
}

}  // namespace ddpv::cuda
