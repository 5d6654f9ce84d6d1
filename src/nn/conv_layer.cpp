// Conv2d and BatchNorm2d layers over the backend's conv and batchnorm ops; both may be parts
// of a fused block (Note [Fused blocks]).
#include "ddpv/nn/layers.hpp"
#include "nn/fusable.hpp"
#include "nn/weighted_layer.hpp"

namespace ddpv {
namespace {

class Conv2dLayer final : public WeightedLayer<Conv2dOp>, public Fusable {
 public:
  Conv2dLayer(const std::string& name, int out_channels, int kernel, int stride, int padding,
              bool bias, bool fan_out_init)
      : WeightedLayer(name, bias), fan_out_init_(fan_out_init) {
    cfg_.out_channels = out_channels;
    cfg_.kernel = kernel;
    cfg_.stride = stride;
    cfg_.padding = padding;
    cfg_.bias = bias;
  }

  Shape setup(Backend& backend, const Shape& in) override {
    setup_image_input(backend, in);
    cfg_.in_h = static_cast<int>(in[0]);
    cfg_.in_w = static_cast<int>(in[1]);
    cfg_.in_channels = static_cast<int>(in[2]);
    cfg_.in_block = act_block(cfg_.in_channels);  // Note [Blocked activations]
    cfg_.out_block = act_block(cfg_.out_channels);
    DDPV_CHECK(cfg_.out_h() > 0 && cfg_.out_w() > 0, "layer ", name_, ": a ", cfg_.kernel, "x",
               cfg_.kernel, " kernel does not fit the input ", in.str());
    out_ = Shape{cfg_.out_h(), cfg_.out_w(), cfg_.out_channels};
    op_ = backend.conv2d(cfg_);
    const int64_t k2 = static_cast<int64_t>(cfg_.kernel) * cfg_.kernel;
    declare(Shape{cfg_.out_channels, cfg_.in_channels, cfg_.kernel, cfg_.kernel}, cfg_.out_channels,
            fan_out_init_ ? Init::kNormalFanOut : Init::kUniformFanIn, cfg_.in_channels * k2,
            cfg_.out_channels * k2);
    return out_;
  }

  std::string describe() const override {
    return name_ + ": conv " + std::to_string(cfg_.kernel) + "x" + std::to_string(cfg_.kernel) +
           "/" + std::to_string(cfg_.stride) + " pad " + std::to_string(cfg_.padding) + ", " +
           in_.str() + " -> " + out_.str() + " (" + (op_ ? op_->algorithm() : block_how_) + ")";
  }

  BlockPart part() override {
    BlockPart p;
    p.kind = BlockPart::kConv;
    p.conv = &cfg_;
    p.weight = &weight_;
    p.bias = has_bias_ ? &bias_ : nullptr;
    return p;
  }
  void join_block(const std::string& how) override {
    block_how_ = how;
    op_.reset();
  }

 private:
  Conv2dConfig cfg_;
  bool fan_out_init_;
  std::string block_how_;  // Note [Fused blocks]: what the block's op says of the convolution
};

class BatchNorm2dLayer final : public Layer, public Fusable {
 public:
  explicit BatchNorm2dLayer(const std::string& name) : Layer(name) {}

  Shape setup(Backend& backend, const Shape& in) override {
    setup_image_input(backend, in);
    out_ = in;
    cfg_.h = static_cast<int>(in[0]);
    cfg_.w = static_cast<int>(in[1]);
    cfg_.channels = static_cast<int>(in[2]);
    cfg_.block = act_block(cfg_.channels);
    op_ = backend.batchnorm2d(cfg_);
    const Shape c{cfg_.channels};
    gamma_ = {name_ + ".weight", c, false, Init::kOnes};
    beta_ = {name_ + ".bias", c, false, Init::kZeros};
    mean_ = {name_ + ".running_mean", c, false, Init::kZeros};
    var_ = {name_ + ".running_var", c, false, Init::kOnes};
    return out_;
  }

  void collect(std::vector<ParamSlot*>& params, std::vector<ParamSlot*>& buffers) override {
    params.push_back(&gamma_);
    params.push_back(&beta_);
    buffers.push_back(&mean_);
    buffers.push_back(&var_);
  }

  void forward(const Tensor& x, Tensor& y, bool training) override {
    check_input(x);
    const int n = static_cast<int>(x.shape()[0]);
    if (training) {
      op_->forward_train(n, cact(x), gamma_.value, beta_.value, mact(y), mean_.value, var_.value);
    } else {
      op_->forward_infer(n, cact(x), gamma_.value, beta_.value, mean_.value, var_.value, mact(y));
    }
  }

  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx, bool accumulate,
                const GradReadyFn& ready) override {
    DDPV_CHECK(dx != nullptr, "layer ", name_, ": BatchNorm always needs its input gradient");
    op_->backward(static_cast<int>(x.shape()[0]), cact(x), gamma_.value, cact(dy), mact(*dx),
                  gamma_.grad, beta_.grad, accumulate);
    report(beta_, ready);
    report(gamma_, ready);
  }

  std::string describe() const override {
    return name_ + ": batchnorm" + (block_how_.empty() ? "" : " (" + block_how_ + ")") + ", " +
           in_.str();
  }

  BlockPart part() override {
    BlockPart p;
    p.kind = BlockPart::kBatchNorm;
    p.bn = &cfg_;
    p.weight = &gamma_;
    p.bias = &beta_;
    p.running_mean = &mean_;
    p.running_var = &var_;
    return p;
  }
  void join_block(const std::string& how) override {
    block_how_ = how;
    op_.reset();
  }

 private:
  BatchNormConfig cfg_;
  std::unique_ptr<BatchNormOp> op_;
  ParamSlot gamma_, beta_, mean_, var_;
  std::string block_how_;  // Note [Fused blocks]: what the block's op says of the BatchNorm
};

}  // namespace

std::unique_ptr<Layer> make_conv2d(const std::string& name, int out_channels, int kernel,
                                   int stride, int padding, bool bias, bool kaiming_fan_out) {
  return std::make_unique<Conv2dLayer>(name, out_channels, kernel, stride, padding, bias,
                                       kaiming_fan_out);
}

std::unique_ptr<Layer> make_batchnorm2d(const std::string& name) {
  return std::make_unique<BatchNorm2dLayer>(name);
}

}  // namespace ddpv
