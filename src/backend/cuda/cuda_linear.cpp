// Fully connected layer on cuBLAS: y = x w^T + b over row-major (N, in) x (out, in) matrices,
// forward and backward, fp32 or bf16 activations with fp32 accumulation.
#include <memory>

#include "backend/cuda/cuda_context.hpp"
#include "backend/cuda/cuda_kernels.hpp"
#include "backend/cuda/cuda_ops.hpp"

namespace ddpv::cuda {
namespace {

// Note [Row-major GEMM on cuBLAS]: cuBLAS is column-major, and a row-major (R, C) matrix is
// the column-major (C, R) matrix. So with x: (N, in), w: (out, in), dy: (N, out), all
// row-major:
//   y  (N, out) = x w^T    is  y^T  = op_T(w) x          : gemm(T, N, out, N, in)
//   dx (N, in)  = dy w     is  dx^T = w dy^T             : gemm(N, N, in, N, out)
//   dw (out,in) = dy^T x   is  dw^T = x op_T(dy)         : gemm(N, T, in, out, N)
// Under bf16 the GEMMs take bf16 x, dy and a bf16 copy of w, accumulate in fp32, write y and
// dx in their views' dtype (bf16 between layers) and dw in fp32 straight into the arena (cuBLAS
// takes bf16 A and B with an fp32 C). An f32 input (a model that starts with its linear
// layers) is rounded into scratch first (Note [Casts at the edges]).
class CudaLinear final : public LinearOp {
 public:
  CudaLinear(std::shared_ptr<CudaContext> ctx, const LinearConfig& cfg)
      : ctx_(std::move(ctx)), cfg_(cfg) {
    DDPV_CHECK(cfg.in_features > 0 && cfg.out_features > 0, "linear: invalid sizes (in ",
               cfg.in_features, ", out ", cfg.out_features, ")");
  }

  void forward(int n, ConstAct x, const float* w, const float* b, MutAct y) override {
    DDPV_CHECK(n > 0, "linear: batch size must be positive, got ", n);
    DDPV_CHECK(!cfg_.bias || b != nullptr, "linear forward: the layer has a bias but b is null");
    const int in = cfg_.in_features, out = cfg_.out_features;
    const DType c = compute_dtype();
    const cudaStream_t st = ctx_->stream();
    ScratchCarver sc(ctx_->scratch(staged_bytes(x.data, x.dtype, c, int64_t{n} * in) +
                                   staged_bytes(w, DType::kF32, c, int64_t{out} * in)));
    const void* xa = staged_input(x, c, int64_t{n} * in, sc, st);
    const void* wa = staged_input(w, c, int64_t{out} * in, sc, st);
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, wa, in, xa, in, 0.0f, y, out);
    if (b != nullptr) DDPV_CUDA_CHECK(add_bias(n, out, b, y.data, y.is_bf16(), st));
  }

  void backward(int n, ConstAct x, const float* w, ConstAct dy, MutAct dx, float* dw, float* db,
                bool accumulate) override {
    DDPV_CHECK(n > 0, "linear: batch size must be positive, got ", n);
    DDPV_CHECK(dw != nullptr, "linear backward: dw must not be null");
    DDPV_CHECK(!cfg_.bias || db != nullptr, "linear backward: the layer has a bias but db is null");
    const int in = cfg_.in_features, out = cfg_.out_features;
    const DType c = compute_dtype();
    const cudaStream_t st = ctx_->stream();
    ScratchCarver sc(ctx_->scratch(staged_bytes(x.data, x.dtype, c, int64_t{n} * in) +
                                   staged_bytes(w, DType::kF32, c, int64_t{out} * in) +
                                   staged_bytes(dy.data, dy.dtype, c, int64_t{n} * out)));
    const void* xa = staged_input(x, c, int64_t{n} * in, sc, st);
    const void* wa = staged_input(w, c, int64_t{out} * in, sc, st);
    const void* dya = staged_input(dy, c, int64_t{n} * out, sc, st);
    if (dx) gemm(CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, wa, in, dya, out, 0.0f, dx, in);
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, xa, in, dya, out, accumulate ? 1.0f : 0.0f, dw, in);
    if (db != nullptr)
      DDPV_CUDA_CHECK(bias_grad(n, out, dy.data, dy.is_bf16(), db, accumulate, st));
  }

 private:
  DType compute_dtype() const { return ctx_->bf16() ? DType::kBF16 : DType::kF32; }

  // C (m, n) = alpha op(A) op(B) + beta C, column-major; A and B in the compute dtype, C f32 or
  // bf16 as its view says.
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* a, int lda,
            const void* b, int ldb, float beta, MutAct c, int ldc) {
    const float alpha = 1.0f;
    if (!ctx_->bf16()) {
      DDPV_CUBLAS_CHECK(cublasSgemm(ctx_->cublas(), ta, tb, m, n, k, &alpha,
                                    static_cast<const float*>(a), lda, static_cast<const float*>(b),
                                    ldb, &beta, c.f32(), ldc));
      return;
    }
    DDPV_CUBLAS_CHECK(cublasGemmEx(ctx_->cublas(), ta, tb, m, n, k, &alpha, a, CUDA_R_16BF, lda, b,
                                   CUDA_R_16BF, ldb, &beta, c.data,
                                   c.is_bf16() ? CUDA_R_16BF : CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
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
