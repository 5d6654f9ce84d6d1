// Note [Fused blocks] on the CPU: a conv -> [batchnorm] -> [+ residual] -> [relu] -> [max pool]
// chain as one op, built from the CPU's own ops and what their kernels can take in.
#include <memory>
#include <string>

#include "backend/cpu/cpu_ops.hpp"

namespace ddpv::cpu {
namespace {

// The op asks its kernels, at construction, for each fusion they have (Note [Fused ReLU],
// Note [BatchNorm + ReLU], Note [ReLU folded into max pooling], Note [Max pooling fused into
// the convolution], Note [Batch statistics from the convolution], Note [BatchNorm + residual],
// Note [Input gradient added]) and composes the rest from the plain passes, exactly as the
// layers ran them one by one: the block computes what the separate layers compute, and a
// deterministic run gives the same parameters bit for bit.
//
// Memory: forward keeps the convolution's output where a BatchNorm or a pooling reads it, and
// the BatchNorm's where the pooling does (`saved`); an unfused ReLU rectifies in place. Backward
// passes its gradients through at most two scratch buffers of the convolution's output size.
class CpuFusedBlock final : public F32FusedBlockOp {
 public:
  CpuFusedBlock(const CpuContext& ctx, Backend& backend, const FusedBlockConfig& cfg)
      : backend_(backend), cfg_(cfg) {
    DDPV_CHECK(!cfg.add_residual || (cfg.batch_norm && cfg.relu && !cfg.max_pool),
               "fused block: a residual add needs a BatchNorm before it and a ReLU after it, and "
               "no pooling (internal)");
    DDPV_CHECK(!cfg.max_pool || (cfg.relu && cfg.pool.kind == PoolKind::kMax),
               "fused block: its pooling is a max pooling of the ReLU's output (internal)");
    conv_ = make_conv2d(ctx, cfg.conv);
    if (cfg.batch_norm) bn_ = make_batchnorm2d(ctx, cfg.bn);
    if (cfg.max_pool) pool_ = make_pool2d(ctx, cfg.pool);
    out_ = int64_t{cfg.conv.out_h()} * cfg.conv.out_w() * cfg.conv.out_channels;
    relu_in_conv_ = cfg.relu && !cfg.batch_norm && conv_->fuse_relu();
    relu_in_bn_ = cfg.relu && cfg.batch_norm && !cfg.add_residual && bn_->fuse_relu();
    relu_in_pool_ = cfg.max_pool && !relu_in_bn_ && pool_->fold_relu_backward();
    const bool tiles = cfg.max_pool && cfg.pool.kernel == cfg.pool.stride && cfg.pool.padding == 0;
    pooled_ = tiles && relu_in_conv_ && relu_in_pool_ && conv_->fuse_max_pool(cfg.pool.kernel);
    if (cfg.batch_norm) {
      double* sums = bn_->given_stats();
      if (sums != nullptr && conv_->write_batch_stats(sums)) {
        bn_->take_given_stats();
        stats_ = sums;
      }
    }
    add_in_bn_ = cfg.add_residual && bn_->fuse_add_relu();
    adds_dx_ = cfg.add_input_grad && conv_->add_input_grad();
    relu_backward_ = cfg.relu && !cfg.add_residual && !relu_in_bn_ && !relu_in_pool_;
  }

  int64_t saved_per_sample() const override {
    if (pooled_) return 0;
    return ((cfg_.batch_norm || cfg_.max_pool) ? out_ : 0) +
           (cfg_.batch_norm && cfg_.max_pool ? out_ : 0);
  }
  int64_t scratch_per_sample() const override {
    if (pooled_) return 0;
    return ((cfg_.max_pool || relu_backward_) ? out_ : 0) + (cfg_.batch_norm ? out_ : 0);
  }
  bool adds_input_grad() const override { return adds_dx_; }

  void forward_f32(int n, bool training, const float* x, const FusedBlockParams& p,
                   const float* residual, float* saved, float* y) override {
    if (pooled_) {  // Note [Pooled activations]: only the pooling's output is written
      int32_t* positions = pool_->positions_for(n);
      DDPV_CHECK(positions != nullptr, "fused block: its max pooling cannot be fused (internal)");
      conv_->forward_pooled(n, x, p.w, p.b, y, positions);
      positions_ = positions;
      pooled_n_ = n;
      return;
    }
    const int64_t count = int64_t{n} * out_;
    float* c = cfg_.batch_norm || cfg_.max_pool ? saved : y;  // the convolution's output
    // In evaluation the BatchNorm normalises with its running statistics: the sums go
    // unread, so the convolution writes none.
    if (stats_ != nullptr) conv_->write_batch_stats(training ? stats_ : nullptr);
    conv_->forward(n, x, p.w, p.b, c);
    float* r = c;  // what the ReLU rectifies and the pooling reads
    if (cfg_.batch_norm) {
      if (add_in_bn_) {
        bn_->forward_add_relu(n, training, c, p.gamma, p.beta, residual, y, p.running_mean,
                              p.running_var);
        return;
      }
      float* b = cfg_.max_pool ? saved + count : y;
      if (training) {
        bn_->forward_train(n, c, p.gamma, p.beta, b, p.running_mean, p.running_var);
      } else {
        bn_->forward_infer(n, c, p.gamma, p.beta, p.running_mean, p.running_var, b);
      }
      if (cfg_.add_residual) {
        backend_.add_relu(count, b, residual, y);
        return;
      }
      r = b;
    }
    if (cfg_.relu && !relu_in_conv_ && !relu_in_bn_) backend_.relu_forward(count, r, r);
    if (cfg_.max_pool) pool_->forward(n, r, y);
  }

  void backward_f32(int n, const float* x, const FusedBlockParams& p, const float* saved,
                    const float* y, const float* dy, float* scratch, float* dx,
                    bool accumulate) override {
    if (pooled_) {  // Note [Pooled weight gradient]
      DDPV_CHECK(positions_ != nullptr && n == pooled_n_, "fused block: backward of a batch of ", n,
                 " after a pooled forward of ", pooled_n_, " (internal)");
      conv_->backward_pooled(n, x, p.w, dy, positions_, dx, p.dw, p.db, accumulate);
      return;
    }
    const int64_t count = int64_t{n} * out_;
    float* s0 = scratch;
    const float* g = dy;  // the gradient of the stage's output, going down
    if (cfg_.max_pool) {
      pool_->backward(n, g, s0);
      g = s0;
    }
    if (relu_backward_) {
      const float* r = !cfg_.max_pool ? y : cfg_.batch_norm ? saved + count : saved;
      backend_.relu_backward(count, r, g, s0);
      g = s0;
    }
    if (cfg_.batch_norm) {
      float* d = g == s0 ? scratch + count : s0;
      bn_->backward(n, saved, p.gamma, g, d, p.dgamma, p.dbeta, accumulate);
      g = d;
    }
    conv_->backward(n, x, p.w, g, dx, p.dw, p.db, accumulate);
  }

  std::string describe_conv() const override {
    return conv_->algorithm() + (relu_in_conv_ ? ", + relu" : "") + (pooled_ ? ", + maxpool" : "");
  }
  std::string describe_batch_norm() const override {
    if (!bn_) return "";
    const bool given = bn_->takes_given_stats();
    return relu_in_bn_ && given ? "+ relu, statistics from the convolution"
           : relu_in_bn_        ? "+ relu"
           : add_in_bn_         ? "statistics from the convolution, + shortcut + relu"
           : given              ? "statistics from the convolution"
                                : "";
  }
  std::string describe_pool() const override { return relu_in_pool_ ? "+ relu backward" : ""; }

 private:
  Backend& backend_;
  FusedBlockConfig cfg_;
  std::unique_ptr<FusableConv> conv_;
  std::unique_ptr<FusableBatchNorm> bn_;
  std::unique_ptr<FusablePool> pool_;
  int64_t out_ = 0;  // the convolution's output, floats per sample
  bool relu_in_conv_ = false, relu_in_bn_ = false, relu_in_pool_ = false, pooled_ = false;
  bool add_in_bn_ = false, adds_dx_ = false, relu_backward_ = false;
  double* stats_ = nullptr;             // the BatchNorm's sums, which the convolution writes
  const int32_t* positions_ = nullptr;  // what the last pooled forward recorded, for pooled_n_
  int pooled_n_ = 0;
};

}  // namespace

std::unique_ptr<FusedBlockOp> make_fused_block(const CpuContext& ctx, Backend& backend,
                                               const FusedBlockConfig& cfg) {
  return std::make_unique<CpuFusedBlock>(ctx, backend, cfg);
}

}  // namespace ddpv::cpu
