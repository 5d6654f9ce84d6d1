// Fully connected layer on cuBLAS: y = x w^T + b over row-major (N, in) x (out, in) matrices,
// forward and backward, fp32 or bf16 inputs with fp32 accumulation and fp32 outputs.
#include <memory>

#include "backend/cuda/cuda_context.hpp"
#include "backend/cuda/cuda_kernels.hpp"
#include "backend/cuda/cuda_ops.hpp"
#include "backend/f32_ops.hpp"

namespace ddpv::cuda {
namespace {

// Note [Row-major GEMM on cuBLAS]: cuBLAS is column-major, and a row-major (R, C) matrix is
// the column-major (C, R) matrix. So with x: (N, in), w: (out, in), dy: (N, out), all
// row-major:
//   y  (N, out) = x w^T    is  y^T  = op_T(w) x          : gemm(T, N, out, N, in)
//   dx (N, in)  = dy w     is  dx^T = w dy^T             : gemm(N, N, in, N, out)
//   dw (out,in) = dy^T x   is  dw^T = x op_T(dy)         : gemm(N, T, in, out, N)
class CudaLinear final : public F32LinearOp {
 public:
  CudaLinear(std::shared_ptr<CudaContext> ctx, const LinearConfig& cfg)
      : ctx_(std::move(ctx)), cfg_(cfg) {
    DDPV_CHECK(cfg.in_features > 0 && cfg.out_features > 0, "linear: invalid sizes (in ",
               cfg.in_features, ", out ", cfg.out_features, ")");
  }

  void forward_f32(int n, const float* x, const float* w, const float* b, float* y) override {
    DDPV_CHECK(n > 0, "linear: batch size must be positive, got ", n);
    DDPV_CHECK(!cfg_.bias || b != nullptr, "linear forward: the layer has a bias but b is null");
    const int in = cfg_.in_features, out = cfg_.out_features;
    const cudaStream_t st = ctx_->stream();
    const void* xa = x;
    const void* wa = w;
    if (ctx_->bf16()) {
      ScratchCarver sc(ctx_->scratch(ScratchCarver::round(2 * size_t(n) * in) +
                                     ScratchCarver::round(2 * size_t(out) * in)));
      void* xb = sc.take(2 * size_t(n) * in);
      void* wb = sc.take(2 * size_t(out) * in);
      DDPV_CUDA_CHECK(f32_to_bf16(int64_t{n} * in, x, xb, st));
      DDPV_CUDA_CHECK(f32_to_bf16(int64_t{out} * in, w, wb, st));
      xa = xb;
      wa = wb;
    }
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, wa, in, xa, in, 0.0f, y, out);
    if (b != nullptr) DDPV_CUDA_CHECK(add_bias(n, out, b, y, st));
  }

  void backward_f32(int n, const float* x, const float* w, const float* dy, float* dx, float* dw,
                    float* db, bool accumulate) override {
    DDPV_CHECK(n > 0, "linear: batch size must be positive, got ", n);
    DDPV_CHECK(dw != nullptr, "linear backward: dw must not be null");
    DDPV_CHECK(!cfg_.bias || db != nullptr, "linear backward: the layer has a bias but db is null");
    const int in = cfg_.in_features, out = cfg_.out_features;
    const cudaStream_t st = ctx_->stream();
    const void* xa = x;
    const void* wa = w;
    const void* dya = dy;
    if (ctx_->bf16()) {
      const size_t xs = 2 * size_t(n) * in, ws = 2 * size_t(out) * in, ys = 2 * size_t(n) * out;
      ScratchCarver sc(ctx_->scratch(ScratchCarver::round(xs) + ScratchCarver::round(ws) +
                                     ScratchCarver::round(ys)));
      void* xb = sc.take(xs);
      void* wb = sc.take(ws);
      void* dyb = sc.take(ys);
      DDPV_CUDA_CHECK(f32_to_bf16(int64_t{n} * in, x, xb, st));
      DDPV_CUDA_CHECK(f32_to_bf16(int64_t{out} * in, w, wb, st));
      DDPV_CUDA_CHECK(f32_to_bf16(int64_t{n} * out, dy, dyb, st));
      xa = xb;
      wa = wb;
      dya = dyb;
    }
    if (dx != nullptr) gemm(CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, wa, in, dya, out, 0.0f, dx, in);
    if (dw != nullptr) {
      gemm(CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, xa, in, dya, out, accumulate ? 1.0f : 0.0f, dw,
           in);
    }
    if (db != nullptr) DDPV_CUDA_CHECK(bias_grad(n, out, dy, db, accumulate, st));
  }

 private:
  // C (m, n) = alpha op(A) op(B) + beta C, column-major; A and B are bf16 under --precision bf16.
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* a, int lda,
            const void* b, int ldb, float beta, float* c, int ldc) {
    const float alpha = 1.0f;
    if (!ctx_->bf16()) {
      DDPV_CUBLAS_CHECK(cublasSgemm(ctx_->cublas(), ta, tb, m, n, k, &alpha,
                                    static_cast<const float*>(a), lda, static_cast<const float*>(b),
                                    ldb, &beta, c, ldc));
      return;
    }
    DDPV_CUBLAS_CHECK(cublasGemmEx(ctx_->cublas(), ta, tb, m, n, k, &alpha, a, CUDA_R_16BF, lda, b,
                                   CUDA_R_16BF, ldb, &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
  }

  std::shared_ptr<CudaContext> ctx_;
  LinearConfig cfg_;
};

}  // namespace

std::unique_ptr<LinearOp> make_linear(std::shared_ptr<CudaContext> ctx, const LinearConfig& cfg) {
  return std::make_unique<CudaLinear>(std::move(ctx), cfg);
}

}  // namespace ddpv::cuda
