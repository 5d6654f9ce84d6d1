// Residual blocks of He et al. 2016: y = relu(main(x) + shortcut(x)).
#include "ddpv/nn/layer_profile.hpp"
#include "ddpv/nn/layers.hpp"
#include "nn/sequence.hpp"

namespace ddpv {
namespace {

// Note [Input gradient added]: a block's input gradient is the main branch's plus the
// shortcut's, and with an identity shortcut the shortcut's is the ReLU-masked output gradient
// itself. Unfused, backward writes that mask to a tensor of its own, the main branch writes
// its input gradient (the Winograd convolution zeroing dx first, as its tiles overlap), and an
// addition pass reads both and writes dx: four passes over the activation. When the main
// branch's first fused block can add its input gradient to what dx holds
// (FusedBlockConfig::add_input_grad; on the CPU the Winograd convolution, whose tiles are added
// into dx anyway), the mask goes straight to dx and the branch adds to it: one pass. The
// branch reads its output gradient (dx) before its first convolution adds to dx, so the two
// may share memory (Sequence::fuse_chains asks only where that holds). Seven of resnet20's
// nine blocks qualify; blocks with a projection shortcut, and the CUDA backend, keep the passes.

class ResidualBlock final : public Layer {
 public:
  ResidualBlock(const std::string& name, const char* kind) : Layer(name), kind_(kind) {}
  Sequence& main() { return main_; }
  Sequence& shortcut() { return shortcut_; }

  Shape setup(Backend& backend, const Shape& in) override {
    backend_ = &backend;
    in_ = in;
    main_.want_residual_end();                             // Note [BatchNorm + residual]
    if (shortcut_.empty()) main_.want_input_grad_added();  // Note [Input gradient added]
    out_ = main_.setup(backend, in);
    const Shape sc = shortcut_.setup(backend, in);
    DDPV_CHECK(sc == out_, "block ", name_, ": main branch gives ", out_.str(),
               " but the shortcut gives ", sc.str());
    add_dx_ = main_.adds_input_grad();
    add_relu_fused_ = main_.adds_residual();
    return out_;
  }

  // Forward order main then shortcut, so the reverse (arena) order is shortcut then main,
  // the order backward produces them (see Note [Reverse layer order]).
  void collect(std::vector<ParamSlot*>& params, std::vector<ParamSlot*>& buffers) override {
    main_.collect(params, buffers);
    shortcut_.collect(params, buffers);
  }

  void forward(const Tensor& x, Tensor& y, bool training) override {
    check_input(x);
    if (add_relu_fused_) {  // Note [BatchNorm + residual]: the shortcut first
      const Tensor& s = shortcut_.forward(x, training);
      main_.forward_add_relu(x, s, y, training);
      return;
    }
    const Tensor& m = main_.forward(x, training);
    const Tensor& s = shortcut_.forward(x, training);
    ProfileScope timed(backend_, profile_name_, profile_kind_, ProfilePhase::kForward);
    backend_->add_relu(y.numel(), cact(m), cact(s), mact(y));
  }

  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx, bool accumulate,
                const GradReadyFn& ready) override {
    if (add_dx_ && dx) {  // Note [Input gradient added]
      {
        ProfileScope timed(backend_, profile_name_, profile_kind_, ProfilePhase::kBackward);
        backend_->relu_backward(y.numel(), cact(y), cact(dy), mact(*dx));
      }
      main_.backward(x, *dx, dx, accumulate, ready);
      return;
    }
    ensure_tensor(dsum_, y.shape(), *backend_);
    {
      ProfileScope timed(backend_, profile_name_, profile_kind_, ProfilePhase::kBackward);
      backend_->relu_backward(y.numel(), cact(y), cact(dy), mact(dsum_));
    }
    Tensor* dx_short = nullptr;
    if (!shortcut_.empty()) {
      ensure_tensor(dx_short_, x.shape(), *backend_);
      dx_short = &dx_short_;
      shortcut_.backward(x, dsum_, dx ? dx_short : nullptr, accumulate, ready);
    }
    main_.backward(x, dsum_, dx, accumulate, ready);
    if (dx) {
      ProfileScope timed(backend_, profile_name_, profile_kind_, ProfilePhase::kBackward);
      const Tensor& other = shortcut_.empty() ? dsum_ : *dx_short;
      backend_->add(dx->numel(), cact(*dx), cact(other), mact(*dx));
    }
  }

  bool is_block() const override { return true; }
  void share_gradient_buffers(const std::shared_ptr<GradientBuffers>& buffers) override {
    main_.share_gradient_buffers(buffers);  // Note [Shared gradient buffers]
    shortcut_.share_gradient_buffers(buffers);
  }
  std::string describe() const override {
    const std::string how =
        !shortcut_.empty() ? " (projection shortcut)"
        : add_dx_          ? " (" + main_.layers()[0]->name() + " adds the shortcut's gradient)"
                           : "";
    std::string d = name_ + ": " + kind_ + " block" + how + ", " + in_.str() + " -> " + out_.str();
    for (const Sequence* branch : {&main_, &shortcut_})  // its layers, one line each, indented
      for (const auto& layer : branch->layers()) d += "\n    " + layer->describe();
    return d;
  }

 private:
  const std::string profile_name_ = name_ + ".add", profile_kind_ = "residual add";
  const char* kind_;
  Sequence main_, shortcut_;
  bool add_dx_ = false;          // main_ adds its input gradient (identity shortcut only)
  bool add_relu_fused_ = false;  // main_'s last layer adds the shortcut and rectifies
  Tensor dsum_, dx_short_;
};

// 1x1 projection + BatchNorm when the block changes the shape ("option B").
void add_downsample(ResidualBlock& b, const std::string& name, int out_planes, int stride) {
  b.shortcut().add(make_conv2d(name + ".downsample.0", out_planes, 1, stride, 0, false, true));
  b.shortcut().add(make_batchnorm2d(name + ".downsample.1"));
}

// Decides the projection at setup time, when the input channel count is known.
class LazyBlock final : public Layer {
 public:
  LazyBlock(const std::string& name, int planes, int stride, bool bottleneck)
      : Layer(name), planes_(planes), stride_(stride), bottleneck_(bottleneck) {}

  Shape setup(Backend& backend, const Shape& in) override {
    DDPV_CHECK(in.rank() == 3, "block ", name_, ": needs an (H, W, C) input, got ", in.str());
    backend_ = &backend;
    block_ = std::make_unique<ResidualBlock>(name_, bottleneck_ ? "bottleneck" : "basic");
    Sequence& m = block_->main();
    const std::string& p = name_;
    int out_planes = planes_;
    if (bottleneck_) {
      out_planes = planes_ * 4;
      m.add(make_conv2d(p + ".conv1", planes_, 1, 1, 0, false, true));
      m.add(make_batchnorm2d(p + ".bn1"));
      m.add(make_relu(p + ".relu1"));
      m.add(make_conv2d(p + ".conv2", planes_, 3, stride_, 1, false, true));
      m.add(make_batchnorm2d(p + ".bn2"));
      m.add(make_relu(p + ".relu2"));
      m.add(make_conv2d(p + ".conv3", out_planes, 1, 1, 0, false, true));
      m.add(make_batchnorm2d(p + ".bn3"));
    } else {
      m.add(make_conv2d(p + ".conv1", planes_, 3, stride_, 1, false, true));
      m.add(make_batchnorm2d(p + ".bn1"));
      m.add(make_relu(p + ".relu1"));
      m.add(make_conv2d(p + ".conv2", planes_, 3, 1, 1, false, true));
      m.add(make_batchnorm2d(p + ".bn2"));
    }
    if (stride_ != 1 || in[2] != out_planes) add_downsample(*block_, p, out_planes, stride_);
    in_ = in;
    out_ = block_->setup(backend, in);
    return out_;
  }
  void collect(std::vector<ParamSlot*>& params, std::vector<ParamSlot*>& buffers) override {
    block_->collect(params, buffers);
  }
  void forward(const Tensor& x, Tensor& y, bool training) override {
    block_->forward(x, y, training);
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx, bool accumulate,
                const GradReadyFn& ready) override {
    block_->backward(x, y, dy, dx, accumulate, ready);
  }
  bool is_block() const override { return true; }
  void share_gradient_buffers(const std::shared_ptr<GradientBuffers>& buffers) override {
    block_->share_gradient_buffers(buffers);
  }
  std::string describe() const override { return block_ ? block_->describe() : name_; }

 private:
  int planes_, stride_;
  bool bottleneck_;
  std::unique_ptr<ResidualBlock> block_;
};

}  // namespace

std::unique_ptr<Layer> make_basic_block(const std::string& name, int planes, int stride) {
  return std::make_unique<LazyBlock>(name, planes, stride, false);
}

std::unique_ptr<Layer> make_bottleneck(const std::string& name, int planes, int stride) {
  return std::make_unique<LazyBlock>(name, planes, stride, true);
}

}  // namespace ddpv
