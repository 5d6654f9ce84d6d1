// Sequence: runs a chain of layers forward and backward, owning the activations between them.
// Used for a model's top level and for each branch of a residual block.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ddpv/nn/layers.hpp"

namespace ddpv {

// Note [Shared gradient buffers]: the gradient flowing between a sequence's layers lives for
// one layer's backward (Note [Ping-pong gradients]), and the branches of two blocks never run
// backward at the same time: the blocks of one sequence share one pair of buffers, sized for the
// largest gradient any of their branches passes, where each branch had held its own. resnet20
// at batch 64 (nine blocks, two projection shortcuts): 22 buffers of 48 MiB in all became two
// of 4 MiB (host tensors at their peak: 167.7 -> 127.7 MiB a rank); resnet50 at batch 256 on a
// GPU, counted from its shapes: about 13 GiB of buffers in fp32 become 1.5 GiB. The sequence
// around the blocks keeps its own pair: its upstream gradient is live while a block runs.
struct GradientBuffers {
  Tensor buf[2];
  int64_t per_sample = 0;  // the largest gradient between layers any sharer passes, per sample
};

class Sequence {
 public:
  void add(std::unique_ptr<Layer> layer) { layers_.push_back(std::move(layer)); }
  bool empty() const { return layers_.empty(); }
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }

  Shape setup(Backend& backend, const Shape& in);
  void collect(std::vector<ParamSlot*>& params, std::vector<ParamSlot*>& buffers);

  // x: (N, in...) -> the output of the last layer (x itself when empty), owned by the sequence.
  const Tensor& forward(const Tensor& x, bool training);
  // Note [BatchNorm + residual]: after setup, asks the last layer to add `other` to its output
  // and rectify the sum in its own pass; true if it will, and forward_add_relu then writes
  // max(0, the output + other) into y (the last layer's own output is never written).
  bool fuse_add_relu();
  void forward_add_relu(const Tensor& x, const Tensor& other, Tensor& y, bool training);
  // dy: like the output -> dx: like x (null: not needed).
  void backward(const Tensor& x, const Tensor& dy, Tensor* dx, bool accumulate,
                const GradReadyFn& ready);
  // Note [Input gradient added]: after setup, asks backward to add the input gradient to what
  // dx holds; true if it will from now on, and then dy may be dx itself.
  bool add_input_grad();
  // Note [Shared gradient buffers]: after setup, backward takes its gradient buffers from
  // `buffers`, shared with sequences that never run backward while this one does.
  void share_gradient_buffers(const std::shared_ptr<GradientBuffers>& buffers);

 private:
  const Tensor& run_forward(const Tensor& x, bool training, const Tensor* other, Tensor* y);
  void size_gradients();
  // Layer k runs no backward of its own: a ReLU whose backward a neighbour applies, or a layer
  // whose output layer k - 2 writes (Note [Pooled weight gradient]).
  bool passes_gradient(size_t k) const { return folded_[k] || (k >= 2 && pooled_[k - 2]); }

  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Tensor> acts_;        // acts_[i]: output of layer i
  std::vector<std::string> kinds_;  // kinds_[i]: "conv 3x3/1 pad 1", for the layer profile
  std::vector<char>
      fused_;  // fused_[i]: layer i is a ReLU that layer i - 1 applies (Note [Fused ReLU])
  // folded_[i]: layer i is a ReLU whose backward layer i + 1 (Note [ReLU folded into max
  // pooling]) or layer i - 1 (Note [BatchNorm + ReLU]) applies
  std::vector<char> folded_;
  // pooled_[i]: layer i writes layer i + 2's output (Note [Max pooling fused into the
  // convolution]: conv, ReLU, max pooling) and takes its gradient (Note [Pooled weight
  // gradient]); layers i + 1 and i + 2 run neither forward nor backward, and acts_[i] and
  // acts_[i + 1] stay empty (Note [Pooled activations])
  std::vector<char> pooled_;
  // Note [Ping-pong gradients]: the gradient flowing between layers only lives for one layer's
  // backward, so two buffers of the largest such gradient serve the whole chain (Note [Pooled
  // activations]); a block's branches share theirs (Note [Shared gradient buffers]).
  std::shared_ptr<GradientBuffers> grads_;
  std::shared_ptr<GradientBuffers> inner_;  // the buffers this sequence's blocks share
  Backend* backend_ = nullptr;
};

}  // namespace ddpv
