// Note [bf16 blocks on oneDNN]: on oneDNN's bf16 path (Note [bf16 on oneDNN]) the f32 fused
// blocks are declined, but the chain conv -> BatchNorm -> ReLU (the first half of every
// residual block) still fuses: oneDNN's bf16 BatchNorm takes fuse_norm_relu as its f32 one
// does (Note [BatchNorm + ReLU]), so the ReLU's forward and backward passes over the
// activation go, and the BatchNorm's output is the block's, one tensor fewer kept for
// backward. The convolution's output, bf16, is the block's `saved` (two bf16 values to a
// float of it) and the BatchNorm's input gradient, bf16, goes through its `scratch`. The
// block computes what the three layers compute one by one: ReLU and bf16 rounding commute
// (a value and its rounding have the same sign), and backward masks dy with the same signs.
#include <memory>
#include <string>

#include "backend/cpu/cpu_ops.hpp"

namespace ddpv::cpu {
namespace {

class OneDnnBf16Block final : public FusedBlockOp {
 public:
  OneDnnBf16Block(const FusedBlockConfig& cfg, std::unique_ptr<Conv2dOp> conv,
                  std::unique_ptr<BatchNormOp> bn)
      : conv_(std::move(conv)),
        bn_(std::move(bn)),
        out_(int64_t{cfg.conv.out_h()} * cfg.conv.out_w() * cfg.conv.out_channels) {}

  int64_t saved_per_sample() const override { return (out_ + 1) / 2; }  // bf16 in floats
  int64_t scratch_per_sample() const override { return (out_ + 1) / 2; }

  void forward(int n, bool training, ConstAct x, const FusedBlockParams& p, ConstAct /*residual*/,
               float* saved, MutAct y) override {
    const MutAct c(reinterpret_cast<uint16_t*>(saved), DType::kBF16);  // the convolution's output
    conv_->forward(n, x, p.w, p.b, c);
    if (training) {
      bn_->forward_train(n, c, p.gamma, p.beta, y, p.running_mean, p.running_var);
    } else {
      bn_->forward_infer(n, c, p.gamma, p.beta, p.running_mean, p.running_var, y);
    }
  }

  void backward(int n, ConstAct x, const FusedBlockParams& p, const float* saved, ConstAct /*y*/,
                ConstAct dy, float* scratch, MutAct dx, bool accumulate) override {
    const ConstAct c(reinterpret_cast<const uint16_t*>(saved), DType::kBF16);
    const MutAct dc(reinterpret_cast<uint16_t*>(scratch), DType::kBF16);
    bn_->backward(n, c, p.gamma, dy, dc, p.dgamma, p.dbeta, accumulate);  // dy masked inside
    conv_->backward(n, x, p.w, dc, dx, p.dw, p.db, accumulate);
  }

  std::string describe_conv() const override { return conv_->algorithm(); }
  std::string describe_batch_norm() const override { return "+ relu"; }

 private:
  std::unique_ptr<Conv2dOp> conv_;
  std::unique_ptr<BatchNormOp> bn_;
  int64_t out_;  // the convolution's output elements per sample
};

}  // namespace

bool onednn_bf16_block_applies(const FusedBlockConfig& cfg) {
  return cfg.batch_norm && cfg.relu && !cfg.add_residual && !cfg.max_pool;
}

std::unique_ptr<FusedBlockOp> make_onednn_bf16_block(const FusedBlockConfig& cfg,
                                                     std::unique_ptr<Conv2dOp> conv,
                                                     std::unique_ptr<BatchNormOp> bn) {
  if (!onednn_bf16_block_applies(cfg) || !conv || !bn) return nullptr;
  return std::make_unique<OneDnnBf16Block>(cfg, std::move(conv), std::move(bn));
}

}  // namespace ddpv::cpu
