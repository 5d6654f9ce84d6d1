// The layers a model graph is built from: conv, batchnorm, relu, pooling, flatten, linear,
// and the residual blocks of the ResNets. Each layer owns its backend ops and the activations
// its backward needs; parameters live in the model's arenas (see Note [Reverse layer order]).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ddpv/backend/backend.hpp"
#include "ddpv/nn/model.hpp"

namespace ddpv {

struct GradientBuffers;  // Note [Shared gradient buffers] (nn/sequence.hpp)

// How a tensor starts (PyTorch's rules): kUniformFanIn is uniform(+-1/sqrt(fan_in)), which is
// torch's default for conv/linear weights (kaiming-uniform, a = sqrt(5)) and biases;
// kNormalFanOut is kaiming-normal(mode = fan_out, relu), torchvision's ResNet conv init.
enum class Init : uint8_t { kZeros, kOnes, kUniformFanIn, kNormalFanOut };

// A named tensor of a layer, placed in an arena by the Model.
struct ParamSlot {
  std::string name;  // full PyTorch name, e.g. "layer1.0.bn1.weight"
  Shape shape;
  bool decay = true;
  Init init = Init::kZeros;
  int64_t fan_in = 1, fan_out = 1;
  float* value = nullptr;  // into the parameter (or buffer) arena
  float* grad = nullptr;   // into the gradient arena (parameters only)
  int index = -1;          // position in Model::params()
};

class Layer {
 public:
  explicit Layer(std::string name) : name_(std::move(name)) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  const std::string& name() const { return name_; }
  const Shape& in_shape() const { return in_; }    // per sample: (H, W, C) or (F)
  const Shape& out_shape() const { return out_; }  // per sample

  // Checks the per-sample input shape, creates the backend ops, returns the output shape.
  virtual Shape setup(Backend& backend, const Shape& in) = 0;
  // Appends this layer's parameters and buffers in the order forward uses them.
  virtual void collect(std::vector<ParamSlot*>& /*params*/, std::vector<ParamSlot*>& /*buffers*/) {}

  // x: (N, in_shape...) -> y: (N, out_shape...), y allocated by the caller.
  virtual void forward(const Tensor& x, Tensor& y, bool training) = 0;
  // dy: like y -> dx: like x (null when the input needs no gradient). Parameter gradients go to
  // the arena (added when accumulate); ready(index) is called as each becomes final.
  virtual void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx,
                        bool accumulate, const GradReadyFn& ready) = 0;

  virtual std::string describe() const;  // "conv1: conv 3x3/1 pad 1, (32, 32, 3) -> (32, 32, 16)"
  // Throws ddpv::Error naming the layer and both shapes when x is not (N, in_shape...).
  void check_input(const Tensor& x) const;
  // A block runs layers of its own, which the profile times instead (Note [Layer profile]).
  virtual bool is_block() const { return false; }
  // Note [Shared gradient buffers]: a block's branches take their gradient buffers from
  // `buffers`, which every block of the sequence around it shares.
  virtual void share_gradient_buffers(const std::shared_ptr<GradientBuffers>& /*buffers*/) {}
  // Fusion is the backend's: a Sequence hands chains of layers to Backend::fused_block (Note
  // [Fused blocks]), and a layer knows nothing of its neighbours.

 protected:
  // For layers over images: checks that `in` is (H, W, C), records it and the backend.
  void setup_image_input(Backend& backend, const Shape& in);
  // The layout of this layer's activations of `channels` channels (Note [Blocked activations]).
  int act_block(int64_t channels) const {
    return block_for(static_cast<int>(channels), backend_->activation_block());
  }
  static void report(const ParamSlot& p, const GradReadyFn& ready) {
    if (ready) ready(p.index);
  }

  std::string name_;
  Shape in_, out_;
  Backend* backend_ = nullptr;
};

// Makes `t` an owning tensor of shape `shape` on the backend's device, allocating only when
// its storage is too small (Note [Grow-only activations]), of the backend's activation dtype
// (Note [Activation dtype]) or of `dtype`.
void ensure_tensor(Tensor& t, const Shape& shape, Backend& backend);
void ensure_tensor(Tensor& t, const Shape& shape, Backend& backend, DType dtype);
// (N, per_sample...) as a Shape.
Shape batch_shape(int64_t n, const Shape& per_sample);

// ---- leaf layers ----------------------------------------------------------------------------
std::unique_ptr<Layer> make_conv2d(const std::string& name, int out_channels, int kernel,
                                   int stride, int padding, bool bias, bool kaiming_fan_out);
std::unique_ptr<Layer> make_batchnorm2d(const std::string& name);
std::unique_ptr<Layer> make_relu(const std::string& name);
std::unique_ptr<Layer> make_maxpool2d(const std::string& name, int kernel, int stride, int padding);
std::unique_ptr<Layer> make_avgpool2d(const std::string& name, int kernel, int stride, int padding);
std::unique_ptr<Layer> make_global_avgpool(const std::string& name);
// (H, W, C) -> (C*H*W) in PyTorch's (C, H, W) order.
std::unique_ptr<Layer> make_flatten(const std::string& name);
std::unique_ptr<Layer> make_linear(const std::string& name, int out_features, bool bias);

// ---- residual blocks (He et al. 2016) -------------------------------------------------------
// Basic block: conv3x3-bn-relu-conv3x3-bn + shortcut, relu. The shortcut is the identity, or
// when the shape changes a 1x1 convolution + BatchNorm ("option B", torchvision's
// `downsample.0/1` naming).
std::unique_ptr<Layer> make_basic_block(const std::string& name, int planes, int stride);
// Bottleneck block (ResNet-50): conv1x1-bn-relu-conv3x3(stride)-bn-relu-conv1x1(4x)-bn + shortcut.
std::unique_ptr<Layer> make_bottleneck(const std::string& name, int planes, int stride);

}  // namespace ddpv
