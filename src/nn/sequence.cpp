// Sequence: forward and backward through a chain of layers.
#include "nn/sequence.hpp"

#include <algorithm>

#include "ddpv/nn/layer_profile.hpp"

namespace ddpv {

Shape Sequence::setup(Backend& backend, const Shape& in) {
  backend_ = &backend;
  Shape s = in;
  for (auto& layer : layers_) s = layer->setup(backend, s);
  inner_ = std::make_shared<GradientBuffers>();  // Note [Shared gradient buffers]
  for (auto& layer : layers_) layer->share_gradient_buffers(inner_);
  acts_.assign(layers_.size(), Tensor());
  kinds_.clear();
  for (auto& layer : layers_) {
    // "conv1: conv 3x3/1 pad 1, (32, 32, 3) -> ..." -> "conv 3x3/1 pad 1"
    std::string d = layer->describe();
    const size_t colon = d.find(": ");
    if (colon != std::string::npos) d = d.substr(colon + 2);
    kinds_.push_back(d.substr(0, d.find(", (")));
  }
  fused_.assign(layers_.size(), 0);
  folded_.assign(layers_.size(), 0);
  pooled_.assign(layers_.size(), 0);
  if (!backend.fuse_layers()) {  // every layer on its own
    size_gradients();
    return s;
  }
  for (size_t i = 1; i < layers_.size(); ++i)
    fused_[i] = layers_[i]->is_relu() && layers_[i - 1]->fuse_relu();
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (!layers_[i]->is_relu()) continue;
    folded_[i] = (fused_[i] && layers_[i - 1]->fuses_relu_backward()) ||
                 (i + 1 < layers_.size() && layers_[i + 1]->fold_relu_backward());
  }
  for (size_t i = 0; i + 2 < layers_.size(); ++i)
    pooled_[i] = fused_[i + 1] && folded_[i + 1] && layers_[i]->fuse_max_pool(*layers_[i + 2]);
  // Note [Batch statistics from the convolution]
  for (size_t i = 0; i + 1 < layers_.size(); ++i)
    if (!pooled_[i]) layers_[i]->feed_batch_stats(*layers_[i + 1]);
  size_gradients();
  return s;
}

// Note [Pooled activations]: a convolution that computes its max pooling (Note [Max pooling
// fused into the convolution]) writes only the pooling's output, so its own full-size output
// and its ReLU's are never allocated (lenet at batch 64: 6.4 MB for conv1, 3.2 MB for conv2),
// and the two gradient buffers (Note [Ping-pong gradients]) hold the largest gradient a layer
// writes for the layer before it: the input of a layer k > 0 that runs a backward of its own
// (layer 0 writes the caller's dx). Before, the largest activation of all sized them, and
// lenet's were conv1's full output too: 2 x 6.4 MB where 2 x 1.6 MB serve.
void Sequence::size_gradients() {
  grads_ = std::make_shared<GradientBuffers>();
  for (size_t k = 1; k < layers_.size(); ++k)
    if (!passes_gradient(k))
      grads_->per_sample = std::max(grads_->per_sample, layers_[k - 1]->out_shape().numel());
}

void Sequence::share_gradient_buffers(const std::shared_ptr<GradientBuffers>& buffers) {
  buffers->per_sample = std::max(buffers->per_sample, grads_->per_sample);
  grads_ = buffers;
}

bool Sequence::add_input_grad() {
  if (backend_ == nullptr || !backend_->fuse_layers() || layers_.empty() || passes_gradient(0))
    return false;
  // dy may be dx: a later layer must take it (and be done with it) before layer 0 writes dx.
  bool later = false;
  for (size_t k = 1; k < layers_.size(); ++k) later = later || !passes_gradient(k);
  return later && layers_[0]->add_input_grad();
}

void Sequence::collect(std::vector<ParamSlot*>& params, std::vector<ParamSlot*>& buffers) {
  for (auto& layer : layers_) layer->collect(params, buffers);
}

bool Sequence::fuse_add_relu() {
  if (backend_ == nullptr || !backend_->fuse_layers() || layers_.empty()) return false;
  const size_t last = layers_.size() - 1;
  if (fused_[last] || pooled_[last] || (last >= 2 && pooled_[last - 2])) return false;
  return layers_[last]->fuse_add_relu();
}

const Tensor& Sequence::forward(const Tensor& x, bool training) {
  return run_forward(x, training, nullptr, nullptr);
}

void Sequence::forward_add_relu(const Tensor& x, const Tensor& other, Tensor& y, bool training) {
  run_forward(x, training, &other, &y);
}

const Tensor& Sequence::run_forward(const Tensor& x, bool training, const Tensor* other,
                                    Tensor* y) {
  const int64_t n = x.shape()[0];
  const Tensor* in = &x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (other != nullptr && i + 1 == layers_.size()) {  // Note [BatchNorm + residual]
      acts_[i] = Tensor::wrap(y->raw(), y->shape(), y->dtype(), y->device());
      ProfileScope timed(backend_, layers_[i]->name(), kinds_[i], ProfilePhase::kForward);
      layers_[i]->forward_add_relu(*in, *other, *y, training);
    } else if (i >= 1 && pooled_[i - 1]) {
      // Note [Pooled activations]: the ReLU that layer i - 1 applies has no tensor
    } else if (fused_[i]) {  // the previous layer's output is already rectified
      acts_[i] = Tensor::wrap(in->raw(), in->shape(), in->dtype(), in->device());
    } else if (i >= 2 && pooled_[i - 2]) {
      // written by layer i - 2
    } else if (pooled_[i]) {  // Note [Pooled activations]: only the pooled output is written
      ProfileScope timed(backend_, layers_[i]->name(), kinds_[i], ProfilePhase::kForward);
      ensure_tensor(acts_[i + 2], batch_shape(n, layers_[i + 2]->out_shape()), *backend_);
      layers_[i]->forward_pooled(*in, acts_[i + 2], training);
    } else {
      ensure_tensor(acts_[i], batch_shape(n, layers_[i]->out_shape()), *backend_);
      const bool leaf = !layers_[i]->is_block();
      ProfileScope timed(leaf ? backend_ : nullptr, layers_[i]->name(), kinds_[i],
                         ProfilePhase::kForward);
      layers_[i]->forward(*in, acts_[i], training);
    }
    in = &acts_[i];
  }
  return *in;
}

void Sequence::backward(const Tensor& x, const Tensor& dy, Tensor* dx, bool accumulate,
                        const GradReadyFn& ready) {
  if (layers_.empty()) {
    if (dx) backend_->copy(dx->raw(), dx->device(), dy.raw(), dy.device(), dy.nbytes());
    return;
  }
  const int64_t n = x.shape()[0];
  if (grads_->per_sample > 0)
    for (auto& g : grads_->buf) ensure_tensor(g, Shape{n * grads_->per_sample}, *backend_);
  Tensor upstream = dy;
  int next = 0;
  for (size_t k = layers_.size(); k-- > 0;) {
    // A ReLU whose backward a neighbour applies, or a pooling fused into layer k - 2 (Note
    // [Pooled weight gradient]): the gradient passes through.
    if (passes_gradient(k)) {
      if (k == 0 && dx)
        backend_->copy(dx->raw(), dx->device(), upstream.raw(), upstream.device(),
                       upstream.nbytes());
      continue;
    }
    const Tensor& in = k == 0 ? x : acts_[k - 1];
    Tensor view;
    Tensor* down = nullptr;
    if (k == 0) {
      down = dx;
    } else {
      view = Tensor::wrap(grads_->buf[next].raw(), in.shape(), DType::kF32, in.device());
      down = &view;
    }
    const bool leaf = !layers_[k]->is_block();
    ProfileScope timed(leaf ? backend_ : nullptr, layers_[k]->name(), kinds_[k],
                       ProfilePhase::kBackward);
    if (pooled_[k]) {
      layers_[k]->backward_pooled(in, upstream, down, accumulate, ready);
    } else {
      layers_[k]->backward(in, acts_[k], upstream, down, accumulate, ready);
    }
    if (k > 0) {
      upstream = view;
      next ^= 1;
    }
  }
}

}  // namespace ddpv
