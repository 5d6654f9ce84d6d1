// LinearOp on oneDNN's sgemm: y = x w^T + b with weights (out, in) as PyTorch keeps them;
// forward and backward side by side.
#include <memory>

#include "backend/cpu/cpu_ops.hpp"

namespace ddpv::cpu {
namespace {

// Note [Linear on sgemm]: a fully connected layer is three row-major GEMMs. dnnl_sgemm takes
// PyTorch's (out, in) weights as they are, needs no primitive to build per batch size, and its
// beta = 1 accumulates weight gradients in place, with no scratch buffer.

// Row-major C (m, n) = alpha * op(A) op(B) + beta * C.
void sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  DDPV_DNNL_CHECK("linear: sgemm",
                  check_dnnl_status(dnnl_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc),
                                    "dnnl_sgemm"));
}

class CpuLinear final : public F32LinearOp {
 public:
  CpuLinear(const CpuContext& ctx, const LinearConfig& cfg) : ctx_(ctx), cfg_(cfg) {
    DDPV_CHECK(cfg.in_features > 0 && cfg.out_features > 0,
               "linear: in_features and out_features must be positive, got ", cfg.in_features,
               " and ", cfg.out_features);
  }

  // x: (N, in)  w: (out, in)  b: (out) or null  ->  y: (N, out)
  void forward_f32(int n, const float* x, const float* w, const float* b, float* y) override {
    check_batch("linear forward", n);
    DDPV_CHECK(!cfg_.bias || b != nullptr, "linear forward: the layer has a bias but b is null");
    ctx_.bind_threads();
    const int64_t in = cfg_.in_features, out = cfg_.out_features;
    float beta = 0.0f;
    if (cfg_.bias) {  // y starts as the bias on every row; the GEMM adds x w^T to it
      for (int64_t i = 0; i < n; ++i)
        for (int64_t o = 0; o < out; ++o) y[i * out + o] = b[o];
      beta = 1.0f;
    }
    sgemm('N', 'T', n, out, in, x, in, w, in, beta, y, out);
  }

  // dy: (N, out) -> dx: (N, in) = dy w;  dw: (out, in) = dy^T x;  db: (out) = sum over N of dy
  void backward_f32(int n, const float* x, const float* w, const float* dy, float* dx, float* dw,
                    float* db, bool accumulate) override {
    check_batch("linear backward", n);
    DDPV_CHECK(dw != nullptr, "linear backward: dw must not be null");
    DDPV_CHECK(!cfg_.bias || db != nullptr, "linear backward: the layer has a bias but db is null");
    ctx_.bind_threads();
    const int64_t in = cfg_.in_features, out = cfg_.out_features;
    if (dx != nullptr) sgemm('N', 'N', n, in, out, dy, out, w, in, 0.0f, dx, in);
    sgemm('T', 'N', out, in, n, dy, out, x, in, accumulate ? 1.0f : 0.0f, dw, in);
    if (cfg_.bias) {
      if (!accumulate)
        for (int64_t o = 0; o < out; ++o) db[o] = 0.0f;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t o = 0; o < out; ++o) db[o] += dy[i * out + o];
    }
  }

 private:
  CpuContext ctx_;
  LinearConfig cfg_;
};

}  // namespace

std::unique_ptr<LinearOp> make_linear(const CpuContext& ctx, const LinearConfig& cfg) {
  return std::make_unique<CpuLinear>(ctx, cfg);
}

}  // namespace ddpv::cpu
