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

void check_config(const LinearConfig& cfg) {
  DDPV_CHECK(cfg.in_features > 0 && cfg.out_features > 0,
             "linear: in_features and out_features must be positive, got ", cfg.in_features,
             " and ", cfg.out_features);
}

class CpuLinear final : public F32LinearOp {
 public:
  CpuLinear(const CpuContext& ctx, const LinearConfig& cfg) : ctx_(ctx), cfg_(cfg) {
    check_config(cfg);
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

// Note [bf16 on oneDNN]: on bf16 activations a fully connected layer is oneDNN's inner
// product (its bf16 GEMM has no entry point that takes bf16 outputs): bf16 x, dy and dx,
// weights reordered from the arena into bf16 on every call, f32 weight and bias gradients.
using LinearPlan = WeightedPlan<dnnl::inner_product_forward, dnnl::inner_product_backward_data,
                                dnnl::inner_product_backward_weights>;

class OneDnnBf16Linear final : public LinearOp {
 public:
  OneDnnBf16Linear(const CpuContext& ctx, const LinearConfig& cfg, Bf16Staging& s)
      : ctx_(ctx), cfg_(cfg), st_(s) {}

  void forward(int n, ConstAct x, const float* w, const float* b, MutAct y) override {
    check_batch("linear forward", n);
    DDPV_CHECK(!cfg_.bias || b != nullptr, "linear forward: the layer has a bias but b is null");
    ctx_.bind_threads();
    LinearPlan& p = plans_.get(n, "linear", this, &OneDnnBf16Linear::build);
    DDPV_DNNL_CHECK("linear forward", p.forward(ctx_, st_.as_bf16(x, int64_t{n} * cfg_.in_features),
                                                w, cfg_.bias ? b : nullptr, y.bf16()));
  }

  void backward(int n, ConstAct x, const float* w, ConstAct dy, MutAct dx, float* dw, float* db,
                bool accumulate) override {
    check_batch("linear backward", n);
    DDPV_CHECK(dw != nullptr, "linear backward: dw must not be null");
    DDPV_CHECK(!cfg_.bias || db != nullptr, "linear backward: the layer has a bias but db is null");
    ctx_.bind_threads();
    LinearPlan& p = plans_.get(n, "linear", this, &OneDnnBf16Linear::build);
    DDPV_DNNL_CHECK("linear backward", {
      p.dy.load(ctx_, dy.bf16());
      if (dx) p.backward_data(ctx_, w, dx.bf16());
      p.backward_weights(ctx_, st_.as_bf16(x, int64_t{n} * cfg_.in_features), dw,
                         cfg_.bias ? db : nullptr, cfg_.out_features, accumulate);
    });
  }

  // Whether oneDNN builds the primitives for n images (on a kernel other than its reference
  // one unless any_kernel). Not called on the hot path.
  bool try_plan(int n, bool any_kernel) {
    const LinearPlan* p = plans_.try_get(n, this, &OneDnnBf16Linear::build);
    return p != nullptr && (any_kernel || !p->on_reference());
  }

 private:
  void build(int n, LinearPlan& p) const {
    const dnnl::engine& eng = ctx_.engine;
    const Mem::dim in = cfg_.in_features, out = cfg_.out_features;
    const Mem::desc x_md({n, in}, Dt::bf16, Tag::nc), y_md({n, out}, Dt::bf16, Tag::nc);
    const Mem::desc w_user_md({out, in}, Dt::f32, Tag::oi), w_any({out, in}, Dt::bf16, Tag::any),
        dw_any({out, in}, Dt::f32, Tag::any), b_md({out}, Dt::f32, Tag::x);
    const auto attr = user_scratchpad_attr();
    using Fwd = dnnl::inner_product_forward;
    using BwdData = dnnl::inner_product_backward_data;
    using BwdWeights = dnnl::inner_product_backward_weights;
    const auto train = dnnl::prop_kind::forward_training;
    const Fwd::primitive_desc fwd_pd(
        cfg_.bias ? Fwd::desc(train, x_md, w_any, b_md, y_md) : Fwd::desc(train, x_md, w_any, y_md),
        attr, eng);
    const BwdData::primitive_desc bwd_data_pd(BwdData::desc(x_md, w_any, y_md), attr, eng, fwd_pd);
    const BwdWeights::primitive_desc bwd_w_pd(cfg_.bias ? BwdWeights::desc(x_md, dw_any, b_md, y_md)
                                                        : BwdWeights::desc(x_md, dw_any, y_md),
                                              attr, eng, fwd_pd);
    p.x = Relayout(x_md, fwd_pd.src_desc(), eng);
    p.y = Relayout(y_md, fwd_pd.dst_desc(), eng);
    p.dy = Relayout(y_md, bwd_w_pd.diff_dst_desc(), eng);
    p.dx = Relayout(x_md, bwd_data_pd.diff_src_desc(), eng);
    p.build(fwd_pd, bwd_data_pd, bwd_w_pd, w_user_md, b_md, cfg_.bias, eng);
  }

  CpuContext ctx_;
  LinearConfig cfg_;
  Bf16Staging& st_;
  PlansByBatch<LinearPlan> plans_;
};

}  // namespace

std::unique_ptr<LinearOp> make_linear(const CpuContext& ctx, const LinearConfig& cfg) {
  return std::make_unique<CpuLinear>(ctx, cfg);
}

std::unique_ptr<LinearOp> make_onednn_bf16_linear(const CpuContext& ctx, const LinearConfig& cfg,
                                                  bool any_kernel, Bf16Staging& staging) {
  check_config(cfg);
  auto op = std::make_unique<OneDnnBf16Linear>(ctx, cfg, staging);
  if (!op->try_plan(2, any_kernel)) return nullptr;
  return op;
}

}  // namespace ddpv::cpu
