// Conv2d and BatchNorm2d layers over the backend's conv and batchnorm ops.
#include "ddpv/nn/layers.hpp"
#include "nn/weighted_layer.hpp"

namespace ddpv {
namespace {

class Conv2dLayer final : public WeightedLayer<Conv2dOp> {
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
           in_.str() + " -> " + out_.str() + " (" + op_->algorithm() +
           (relu_fused_ ? ", + relu" : "") + (pool_ ? ", + maxpool)" : ")");
  }

  bool fuse_relu() override { return relu_fused_ = op_->fuse_relu(); }

  bool add_input_grad() override { return op_->add_input_grad(); }

  bool feed_batch_stats(Layer& next) override {
    BatchNormOp* bn = next.fusable_batch_norm();
    double* sums = bn != nullptr ? bn->given_stats() : nullptr;
    if (sums == nullptr || !op_->write_batch_stats(sums)) return false;
    bn->take_given_stats();
    stats_ = sums;
    return true;
  }

  // In evaluation the BatchNorm normalises with its running statistics: the sums go unread,
  // so the convolution writes none (a few percent of its output transform).
  void forward(const Tensor& x, Tensor& y, bool training) override {
    if (stats_ != nullptr) op_->write_batch_stats(training ? stats_ : nullptr);
    WeightedLayer::forward(x, y, training);
  }

  bool fuse_max_pool(Layer& pool) override {
    int kernel = 0;
    Pool2dOp* op = pool.fusable_max_pool(&kernel);
    if (!relu_fused_ || op == nullptr || !op_->fuse_max_pool(kernel)) return false;
    pool_ = op;
    return true;
  }

  void forward_pooled(const Tensor& x, Tensor& pooled, bool) override {
    check_input(x);
    const int n = static_cast<int>(x.shape()[0]);
    int32_t* positions = pool_ ? pool_->positions_for(n) : nullptr;
    DDPV_CHECK(positions != nullptr, "layer ", name_,
               ": its max pooling cannot be fused (internal)");
    op_->forward_pooled(n, x.data<float>(), weight_.value, has_bias_ ? bias_.value : nullptr,
                        pooled.data<float>(), positions);
    positions_ = positions;
    pooled_n_ = n;
  }

  void backward_pooled(const Tensor& x, const Tensor& dpooled, Tensor* dx, bool accumulate,
                       const GradReadyFn& ready) override {
    const int n = static_cast<int>(x.shape()[0]);
    DDPV_CHECK(positions_ != nullptr && n == pooled_n_, "layer ", name_,
               ": backward of a batch of ", n, " after a pooled forward of ", pooled_n_,
               " (internal)");
    op_->backward_pooled(n, x.data<float>(), weight_.value, dpooled.data<float>(), positions_,
                         dx ? dx->data<float>() : nullptr, weight_.grad,
                         has_bias_ ? bias_.grad : nullptr, accumulate);
    if (has_bias_) report(bias_, ready);
    report(weight_, ready);
  }

 private:
  Conv2dConfig cfg_;
  bool fan_out_init_;
  bool relu_fused_ = false;
  Pool2dOp* pool_ = nullptr;            // Note [Max pooling fused into the convolution]
  const int32_t* positions_ = nullptr;  // what the last forward_pooled recorded, for pooled_n_
  int pooled_n_ = 0;
  double* stats_ = nullptr;  // Note [Batch statistics from the convolution]: the BatchNorm's sums
};

class BatchNorm2dLayer final : public Layer {
 public:
  explicit BatchNorm2dLayer(const std::string& name) : Layer(name) {}

  Shape setup(Backend& backend, const Shape& in) override {
    setup_image_input(backend, in);
    out_ = in;
    BatchNormConfig cfg;
    cfg.h = static_cast<int>(in[0]);
    cfg.w = static_cast<int>(in[1]);
    cfg.channels = static_cast<int>(in[2]);
    cfg.block = act_block(cfg.channels);
    op_ = backend.batchnorm2d(cfg);
    const Shape c{cfg.channels};
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
      op_->forward_train(n, x.data<float>(), gamma_.value, beta_.value, y.data<float>(),
                         mean_.value, var_.value);
    } else {
      op_->forward_infer(n, x.data<float>(), gamma_.value, beta_.value, mean_.value, var_.value,
                         y.data<float>());
    }
  }

  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx, bool accumulate,
                const GradReadyFn& ready) override {
    DDPV_CHECK(dx != nullptr, "layer ", name_, ": BatchNorm always needs its input gradient");
    op_->backward(static_cast<int>(x.shape()[0]), x.data<float>(), gamma_.value, dy.data<float>(),
                  dx->data<float>(), gamma_.grad, beta_.grad, accumulate);
    report(beta_, ready);
    report(gamma_, ready);
  }

  std::string describe() const override {
    const bool given = op_->takes_given_stats();
    const std::string how = relu_fused_ && given ? " (+ relu, statistics from the convolution)"
                            : relu_fused_        ? " (+ relu)"
                            : add_relu_fused_
                                ? " (statistics from the convolution, + shortcut + relu)"
                            : given ? " (statistics from the convolution)"
                                    : "";
    return name_ + ": batchnorm" + how + ", " + in_.str();
  }
  bool fuse_relu() override { return relu_fused_ = op_->fuse_relu(); }
  bool fuses_relu_backward() const override { return relu_fused_; }
  BatchNormOp* fusable_batch_norm() override { return op_.get(); }
  bool fuse_add_relu() override { return add_relu_fused_ = op_->fuse_add_relu(); }
  void forward_add_relu(const Tensor& x, const Tensor& other, Tensor& y, bool training) override {
    check_input(x);
    DDPV_CHECK(add_relu_fused_, "layer ", name_, ": forward_add_relu without fuse_add_relu");
    op_->forward_add_relu(static_cast<int>(x.shape()[0]), training, x.data<float>(), gamma_.value,
                          beta_.value, other.data<float>(), y.data<float>(), mean_.value,
                          var_.value);
  }

 private:
  std::unique_ptr<BatchNormOp> op_;
  ParamSlot gamma_, beta_, mean_, var_;
  bool relu_fused_ = false;
  bool add_relu_fused_ = false;  // Note [BatchNorm + residual]
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
