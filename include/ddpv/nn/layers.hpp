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
  // Note [Input gradient added]: asks backward (and backward_pooled) to add the input gradient
  // to what dx holds instead of overwriting it; true if this layer will from now on.
  virtual bool add_input_grad() { return false; }
  // Note [Batch statistics from the convolution]: a BatchNorm's op, if the layer that writes
  // its input may hand it the batch statistics (null otherwise); and, on that layer,
  // feed_batch_stats(next) asks it to do so for `next`, the layer after it: true if it will.
  virtual BatchNormOp* fusable_batch_norm() { return nullptr; }
  virtual bool feed_batch_stats(Layer& /*next*/) { return false; }
  // Note [BatchNorm + residual]: asks forward_add_relu to write max(0, this layer's output +
  // other) (other shaped as the output) instead of the output; true if it will. Backward is
  // unchanged: dy is still the gradient of the layer's own output.
  virtual bool fuse_add_relu() { return false; }
  virtual void forward_add_relu(const Tensor& /*x*/, const Tensor& /*other*/, Tensor& /*y*/,
                                bool /*training*/) {
    DDPV_FAIL("layer ", name_, " adds no residual (internal)");
  }
  // A block runs layers of its own, which the profile times instead (Note [Layer profile]).
  virtual bool is_block() const { return false; }
  // Note [Shared gradient buffers]: a block's branches take their gradient buffers from
  // `buffers`, which every block of the sequence around it shares.
  virtual void share_gradient_buffers(const std::shared_ptr<GradientBuffers>& /*buffers*/) {}

  // Note [Fused ReLU]: a layer followed by a ReLU may apply it in its own forward, for free;
  // the sequence then gives the ReLU's output the same memory, and the ReLU's backward (which
  // reads only that output) runs as before. fuse_relu() is true if this layer now does so.
  virtual bool fuse_relu() { return false; }
  virtual bool is_relu() const { return false; }
  // Note [ReLU folded into max pooling]: a layer whose input is a ReLU's output may apply that
  // ReLU's backward in its own; the sequence then skips the ReLU's backward.
  // fold_relu_backward() is true if this layer now does so.
  virtual bool fold_relu_backward() { return false; }
  // After fuse_relu(): true if this layer's backward also takes the ReLU's output gradient and
  // applies the ReLU's backward (Note [BatchNorm + ReLU]); the sequence skips the ReLU then.
  virtual bool fuses_relu_backward() const { return false; }
  // Note [Max pooling fused into the convolution]: a max pooling that a producer may compute
  // (windows that tile the input, its ReLU's backward folded): its op, and its kernel in
  // *kernel; null otherwise.
  virtual Pool2dOp* fusable_max_pool(int* /*kernel*/) { return nullptr; }
  // After fuse_relu(): asks this layer to compute `pool` (a fusable_max_pool) of its rectified
  // output itself; true if it will, and the sequence then calls forward_pooled, which writes
  // the pooling's output and leaves this layer's own output unwritten, and backward_pooled,
  // which takes the pooling's output gradient (Note [Pooled weight gradient]): neither the
  // ReLU nor the pooling runs its own backward.
  virtual bool fuse_max_pool(Layer& /*pool*/) { return false; }
  virtual void forward_pooled(const Tensor& /*x*/, Tensor& /*pooled*/, bool /*training*/) {
    DDPV_FAIL("layer ", name_, " fuses no max pooling (internal)");
  }
  virtual void backward_pooled(const Tensor& /*x*/, const Tensor& /*dpooled*/, Tensor* /*dx*/,
                               bool /*accumulate*/, const GradReadyFn& /*ready*/) {
    DDPV_FAIL("layer ", name_, " fuses no max pooling (internal)");
  }

 protected:
  // Throws ddpv::Error naming the layer and both shapes when x is not (N, in_shape...).
  void check_input(const Tensor& x) const;
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
// its storage is too small (Note [Grow-only activations]).
void ensure_tensor(Tensor& t, const Shape& shape, Backend& backend);
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
