// Note [bf16 fallback on the CPU]: under --precision bf16 the CPU backend's activations and
// their gradients are bf16 between layers (Note [Activation dtype]), but its op kernels (our
// own and the oneDNN primitives we build) compute in f32. Each op is therefore wrapped in an
// adapter that hands the f32 op f32 copies of its bf16 inputs and rounds the op's f32 outputs
// into the bf16 ones (to nearest even, as f32_to_bf16); parameters and their gradients pass
// through untouched, f32 as always. What the model computes is then what AMP computes:
// every layer's arithmetic in f32, every activation and activation gradient rounded to bf16
// where it is stored. It is the path on every CPU for now, and the only one on an AVX2-only
// CPU, where oneDNN 2.6 refuses bf16 convolutions outright; the conversions cost time on top of
// the f32 step, so ddpv-train warns that it will be slower than fp32 (it saves memory
// between layers, not time). The copies live in a few grow-only buffers that all adapters of
// one backend share (Bf16Staging): ops run one at a time on the calling thread, and an adapter
// needs its copies only during its call, so the extra memory is that of the largest layer's
// operands, not of every layer's.
//
// A fused block (conv -> BatchNorm -> [+ residual] -> ReLU -> [max pool], Note [Fused blocks])
// is wrapped whole: its input, residual, output and their gradients are converted at its edges
// and the f32 block's fusions (Winograd, statistics from the convolution, BatchNorm + ReLU,
// BatchNorm + residual) run between them, so the values inside the block stay f32 (in its
// `saved` buffer, which is f32 as in an fp32 run) and one conversion serves the whole chain.
// The block then computes what the fp32 block computes on the same inputs, rounded once on the
// way out, which is a little more than the layers one by one would round.
#include <omp.h>

#include "backend/cpu/cpu_ops.hpp"
#include "backend/cpu/team.hpp"
#include "ddpv/core/dtype.hpp"

namespace ddpv::cpu {

void bf16_to_f32_array(int64_t count, const uint16_t* x, float* y) {
  in_team(count >= kParallelMin, [&] {  // Note [No team of one]
#pragma omp for simd
    for (int64_t i = 0; i < count; ++i) y[i] = bf16_to_f32(x[i]);
  });
}

void f32_to_bf16_array(int64_t count, const float* x, uint16_t* y) {
  in_team(count >= kParallelMin, [&] {  // Note [No team of one]
#pragma omp for simd
    for (int64_t i = 0; i < count; ++i) y[i] = f32_to_bf16(x[i]);
  });
}

namespace {

// Conv2dOp and LinearOp take the same arguments: a weighted op's input and output, `in` and
// `out` elements per sample.
template <class Op>
class Bf16Weighted : public Op {
 public:
  Bf16Weighted(std::unique_ptr<Op> op, int64_t in, int64_t out, Bf16Staging& s)
      : op_(std::move(op)), in_(in), out_(out), st_(s) {}
  void forward(int n, ConstAct x, const float* w, const float* b, MutAct y) override {
    st_.bind_threads();
    const float* xf = st_.in(0, x, n * in_);
    op_->forward(n, xf, w, b, st_.out(1, y, n * out_));
    st_.finish(1, y, n * out_);
  }
  void backward(int n, ConstAct x, const float* w, ConstAct dy, MutAct dx, float* dw, float* db,
                bool accumulate) override {
    st_.bind_threads();
    const float* xf = st_.in(0, x, n * in_);
    const float* dyf = st_.in(1, dy, n * out_);
    op_->backward(n, xf, w, dyf, st_.out(2, dx, n * in_), dw, db, accumulate);
    st_.finish(2, dx, n * in_);
  }

 protected:
  std::unique_ptr<Op> op_;
  int64_t in_, out_;  // elements per sample
  Bf16Staging& st_;
};

class Bf16Conv2d final : public Bf16Weighted<Conv2dOp> {
 public:
  Bf16Conv2d(std::unique_ptr<Conv2dOp> op, const Conv2dConfig& c, Bf16Staging& s)
      : Bf16Weighted(std::move(op), int64_t{c.in_h} * c.in_w * c.in_channels,
                     int64_t{c.out_h()} * c.out_w() * c.out_channels, s) {}
  std::string algorithm() const override { return op_->algorithm() + ", bf16 stored, f32 math"; }
};

class Bf16BatchNorm final : public BatchNormOp {
 public:
  Bf16BatchNorm(std::unique_ptr<BatchNormOp> op, const BatchNormConfig& c, Bf16Staging& s)
      : op_(std::move(op)), per_(int64_t{c.h} * c.w * c.channels), st_(s) {}
  void forward_train(int n, ConstAct x, const float* gamma, const float* beta, MutAct y,
                     float* running_mean, float* running_var) override {
    st_.bind_threads();
    const float* xf = st_.in(0, x, n * per_);
    op_->forward_train(n, xf, gamma, beta, st_.out(1, y, n * per_), running_mean, running_var);
    st_.finish(1, y, n * per_);
  }
  void forward_infer(int n, ConstAct x, const float* gamma, const float* beta,
                     const float* running_mean, const float* running_var, MutAct y) override {
    st_.bind_threads();
    const float* xf = st_.in(0, x, n * per_);
    op_->forward_infer(n, xf, gamma, beta, running_mean, running_var, st_.out(1, y, n * per_));
    st_.finish(1, y, n * per_);
  }
  void backward(int n, ConstAct x, const float* gamma, ConstAct dy, MutAct dx, float* dgamma,
                float* dbeta, bool accumulate) override {
    st_.bind_threads();
    const float* xf = st_.in(0, x, n * per_);
    const float* dyf = st_.in(1, dy, n * per_);
    op_->backward(n, xf, gamma, dyf, st_.out(2, dx, n * per_), dgamma, dbeta, accumulate);
    st_.finish(2, dx, n * per_);
  }

 private:
  std::unique_ptr<BatchNormOp> op_;
  int64_t per_;
  Bf16Staging& st_;
};

class Bf16Pool2d final : public Pool2dOp {
 public:
  Bf16Pool2d(std::unique_ptr<Pool2dOp> op, const Pool2dConfig& c, Bf16Staging& s)
      : op_(std::move(op)),
        in_(int64_t{c.in_h} * c.in_w * c.channels),
        out_(int64_t{c.out_h()} * c.out_w() * c.channels),
        st_(s) {}
  void forward(int n, ConstAct x, MutAct y) override {
    st_.bind_threads();
    const float* xf = st_.in(0, x, n * in_);
    op_->forward(n, xf, st_.out(1, y, n * out_));
    st_.finish(1, y, n * out_);
  }
  void backward(int n, ConstAct dy, MutAct dx) override {
    st_.bind_threads();
    const float* dyf = st_.in(0, dy, n * out_);
    op_->backward(n, dyf, st_.out(1, dx, n * in_));
    st_.finish(1, dx, n * in_);
  }

 private:
  std::unique_ptr<Pool2dOp> op_;
  int64_t in_, out_;
  Bf16Staging& st_;
};

// The loss reads bf16 logits as f32 and writes the gradient of the logits rounded to bf16;
// the loss itself and the counts are f32 / integer as always.
class Bf16SoftmaxCrossEntropy final : public SoftmaxCrossEntropyOp {
 public:
  Bf16SoftmaxCrossEntropy(std::unique_ptr<SoftmaxCrossEntropyOp> op, int classes, Bf16Staging& s)
      : op_(std::move(op)), k_(classes), st_(s) {}
  LossResult forward(int n, ConstAct logits, const int32_t* labels) override {
    st_.bind_threads();
    return op_->forward(n, st_.in(0, logits, n * k_), labels);
  }
  void backward(int n, const int32_t* labels, MutAct dlogits, float scale) override {
    st_.bind_threads();
    op_->backward(n, labels, st_.out(0, dlogits, n * k_), scale);
    st_.finish(0, dlogits, n * k_);
  }

 private:
  std::unique_ptr<SoftmaxCrossEntropyOp> op_;
  int64_t k_;
  Bf16Staging& st_;
};

class Bf16FusedBlock final : public FusedBlockOp {
 public:
  Bf16FusedBlock(std::unique_ptr<FusedBlockOp> op, const FusedBlockConfig& c, Bf16Staging& s)
      : op_(std::move(op)),
        in_(int64_t{c.conv.in_h} * c.conv.in_w * c.conv.in_channels),
        out_(c.max_pool ? int64_t{c.pool.out_h()} * c.pool.out_w() * c.pool.channels
                        : int64_t{c.conv.out_h()} * c.conv.out_w() * c.conv.out_channels),
        st_(s) {
    DDPV_CHECK(!op_->adds_input_grad(), "a bf16 fused block cannot add to dx (internal)");
  }
  int64_t saved_per_sample() const override { return op_->saved_per_sample(); }
  int64_t scratch_per_sample() const override { return op_->scratch_per_sample(); }
  void forward(int n, bool training, ConstAct x, const FusedBlockParams& p, ConstAct residual,
               float* saved, MutAct y) override {
    st_.bind_threads();
    const float* xf = st_.in(0, x, n * in_);
    const float* rf = st_.in(1, residual, n * out_);
    op_->forward(n, training, xf, p, rf, saved, st_.out(2, y, n * out_));
    st_.finish(2, y, n * out_);
  }
  void backward(int n, ConstAct x, const FusedBlockParams& p, const float* saved, ConstAct y,
                ConstAct dy, float* scratch, MutAct dx, bool accumulate) override {
    st_.bind_threads();
    const float* xf = st_.in(0, x, n * in_);
    const float* yf = st_.in(1, y, n * out_);
    const float* dyf = st_.in(2, dy, n * out_);
    op_->backward(n, xf, p, saved, yf, dyf, scratch, st_.out(3, dx, n * in_), accumulate);
    st_.finish(3, dx, n * in_);
  }
  std::string describe_conv() const override {
    return op_->describe_conv() + ", bf16 stored, f32 math";
  }
  std::string describe_batch_norm() const override { return op_->describe_batch_norm(); }
  std::string describe_pool() const override { return op_->describe_pool(); }

 private:
  std::unique_ptr<FusedBlockOp> op_;
  int64_t in_, out_;  // elements per sample of x and of y
  Bf16Staging& st_;
};

}  // namespace

std::unique_ptr<FusedBlockOp> bf16_fallback(std::unique_ptr<FusedBlockOp> op,
                                            const FusedBlockConfig& cfg, Bf16Staging& staging) {
  return std::make_unique<Bf16FusedBlock>(std::move(op), cfg, staging);
}
std::unique_ptr<Conv2dOp> bf16_fallback(std::unique_ptr<Conv2dOp> op, const Conv2dConfig& cfg,
                                        Bf16Staging& staging) {
  return std::make_unique<Bf16Conv2d>(std::move(op), cfg, staging);
}
std::unique_ptr<BatchNormOp> bf16_fallback(std::unique_ptr<BatchNormOp> op,
                                           const BatchNormConfig& cfg, Bf16Staging& staging) {
  return std::make_unique<Bf16BatchNorm>(std::move(op), cfg, staging);
}
std::unique_ptr<Pool2dOp> bf16_fallback(std::unique_ptr<Pool2dOp> op, const Pool2dConfig& cfg,
                                        Bf16Staging& staging) {
  return std::make_unique<Bf16Pool2d>(std::move(op), cfg, staging);
}
std::unique_ptr<LinearOp> bf16_fallback(std::unique_ptr<LinearOp> op, const LinearConfig& cfg,
                                        Bf16Staging& staging) {
  return std::make_unique<Bf16Weighted<LinearOp>>(std::move(op), cfg.in_features,
                                                   cfg.out_features, staging);
}
std::unique_ptr<SoftmaxCrossEntropyOp> bf16_fallback(std::unique_ptr<SoftmaxCrossEntropyOp> op,
                                                     int classes, Bf16Staging& staging) {
  return std::make_unique<Bf16SoftmaxCrossEntropy>(std::move(op), classes, staging);
}

}  // namespace ddpv::cpu
