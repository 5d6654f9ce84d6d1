// Parameter-free layers: ReLU, max/avg/global-average pooling, and Flatten.
#include "ddpv/nn/layers.hpp"
#include "nn/fusable.hpp"
#include "nn/weighted_layer.hpp"

namespace ddpv {
namespace {

class ReluLayer final : public Layer, public Fusable {
 public:
  using Layer::Layer;
  Shape setup(Backend& backend, const Shape& in) override {
    backend_ = &backend;
    in_ = out_ = in;
    return out_;
  }
  void forward(const Tensor& x, Tensor& y, bool) override {
    check_input(x);
    backend_->relu_forward(x.numel(), cact(x), mact(y));
  }
  void backward(const Tensor&, const Tensor& y, const Tensor& dy, Tensor* dx, bool,
                const GradReadyFn&) override {
    if (dx) backend_->relu_backward(y.numel(), cact(y), cact(dy), mact(*dx));
  }
  std::string describe() const override { return name_ + ": relu, " + in_.str(); }
  BlockPart part() override {
    BlockPart p;
    p.kind = BlockPart::kRelu;
    return p;
  }
  void join_block(const std::string&) override {}
};

class PoolLayer final : public Layer, public Fusable {
 public:
  PoolLayer(const std::string& name, PoolKind kind, int kernel, int stride, int padding)
      : Layer(name) {
    cfg_.kind = kind;
    cfg_.kernel = kernel;
    cfg_.stride = stride;
    cfg_.padding = padding;
  }
  Shape setup(Backend& backend, const Shape& in) override {
    setup_image_input(backend, in);
    cfg_.in_h = static_cast<int>(in[0]);
    cfg_.in_w = static_cast<int>(in[1]);
    cfg_.channels = static_cast<int>(in[2]);
    cfg_.block = act_block(cfg_.channels);
    DDPV_CHECK(cfg_.out_h() > 0 && cfg_.out_w() > 0, "layer ", name_, ": a ", cfg_.kernel, "x",
               cfg_.kernel, " window does not fit the input ", in.str());
    out_ = Shape{cfg_.out_h(), cfg_.out_w(), cfg_.channels};
    op_ = backend.pool2d(cfg_);
    return out_;
  }
  void forward(const Tensor& x, Tensor& y, bool) override {
    check_input(x);
    op_->forward(static_cast<int>(x.shape()[0]), cact(x), mact(y));
  }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx, bool,
                const GradReadyFn&) override {
    if (dx) op_->backward(static_cast<int>(x.shape()[0]), cact(dy), mact(*dx));
  }
  std::string describe() const override {
    const char* kind = cfg_.kind == PoolKind::kMax   ? "maxpool"
                       : cfg_.kind == PoolKind::kAvg ? "avgpool"
                                                     : "global avgpool";
    return name_ + ": " + kind + (block_how_.empty() ? "" : " (" + block_how_ + ")") + ", " +
           in_.str() + " -> " + out_.str();
  }
  // Only a max pooling follows a ReLU into a block (Note [Fused blocks]).
  BlockPart part() override {
    BlockPart p;
    if (cfg_.kind != PoolKind::kMax) return p;
    p.kind = BlockPart::kMaxPool;
    p.pool = &cfg_;
    return p;
  }
  void join_block(const std::string& how) override {
    block_how_ = how;
    op_.reset();
  }

 private:
  Pool2dConfig cfg_;
  std::unique_ptr<Pool2dOp> op_;
  std::string block_how_;  // Note [Fused blocks]: what the block's op says of the pooling
};

class FlattenLayer final : public Layer {
 public:
  using Layer::Layer;
  Shape setup(Backend& backend, const Shape& in) override {
    setup_image_input(backend, in);
    out_ = Shape{in.numel()};
    return out_;
  }
  // A 1x1 spatial map needs no reordering: (1, 1, C), (C, 1, 1) and C/b blocks of (1, 1, b)
  // are the same bytes (of the same dtype; an f32 input into bf16 is converted).
  void forward(const Tensor& x, Tensor& y, bool) override {
    check_input(x);
    if (in_[0] * in_[1] == 1 && x.dtype() == y.dtype()) {
      backend_->copy(y.raw(), y.device(), x.raw(), x.device(), x.nbytes());
    } else {
      relayout(x, y, act_block(in_[2]), Backend::kNchw);
    }
  }
  void backward(const Tensor&, const Tensor&, const Tensor& dy, Tensor* dx, bool,
                const GradReadyFn&) override {
    if (!dx) return;
    if (in_[0] * in_[1] == 1 && dx->dtype() == dy.dtype()) {
      backend_->copy(dx->raw(), dx->device(), dy.raw(), dy.device(), dy.nbytes());
    } else {
      relayout(dy, *dx, Backend::kNchw, act_block(in_[2]));
    }
  }
  std::string describe() const override {
    return name_ + ": flatten (C, H, W order), " + in_.str() + " -> " + out_.str();
  }

 private:
  void relayout(const Tensor& from, Tensor& to, int from_layout, int to_layout) {
    backend_->relayout(static_cast<int>(from.shape()[0]), static_cast<int>(in_[0]),
                       static_cast<int>(in_[1]), static_cast<int>(in_[2]), from_layout, to_layout,
                       cact(from), mact(to));
  }
};

class LinearLayer final : public WeightedLayer<LinearOp> {
 public:
  LinearLayer(const std::string& name, int out_features, bool bias) : WeightedLayer(name, bias) {
    cfg_.out_features = out_features;
    cfg_.bias = bias;
  }
  Shape setup(Backend& backend, const Shape& in) override {
    DDPV_CHECK(in.rank() == 1, "layer ", name_, ": needs a flat (F) input, got ", in.str(),
               " (add a flatten layer)");
    backend_ = &backend;
    in_ = in;
    cfg_.in_features = static_cast<int>(in[0]);
    out_ = Shape{cfg_.out_features};
    op_ = backend.linear(cfg_);
    declare(Shape{cfg_.out_features, cfg_.in_features}, cfg_.out_features, Init::kUniformFanIn,
            cfg_.in_features, cfg_.out_features);
    return out_;
  }
  std::string describe() const override {
    return name_ + ": linear, " + in_.str() + " -> " + out_.str();
  }

 private:
  LinearConfig cfg_;
};

}  // namespace

std::unique_ptr<Layer> make_relu(const std::string& name) {
  return std::make_unique<ReluLayer>(name);
}
std::unique_ptr<Layer> make_maxpool2d(const std::string& name, int kernel, int stride,
                                      int padding) {
  return std::make_unique<PoolLayer>(name, PoolKind::kMax, kernel, stride, padding);
}
std::unique_ptr<Layer> make_avgpool2d(const std::string& name, int kernel, int stride,
                                      int padding) {
  return std::make_unique<PoolLayer>(name, PoolKind::kAvg, kernel, stride, padding);
}
std::unique_ptr<Layer> make_global_avgpool(const std::string& name) {
  return std::make_unique<PoolLayer>(name, PoolKind::kGlobalAvg, 1, 1, 0);
}
std::unique_ptr<Layer> make_flatten(const std::string& name) {
  return std::make_unique<FlattenLayer>(name);
}
std::unique_ptr<Layer> make_linear(const std::string& name, int out_features, bool bias) {
  return std::make_unique<LinearLayer>(name, out_features, bias);
}

}  // namespace ddpv
