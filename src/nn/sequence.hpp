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
// The scratch of fused blocks (Note [Fused blocks]): the gradients inside one live for its backward
// only, and no two blocks of a model run backward at once: one scratch tensor, of the largest any
// block asks for, serves the whole model (the top-level sequence's, which its blocks' branches take
// over). It is the price of the blocks' op interface: one tensor of the largest gradient inside
// a block (resnet20: 32 x 32 x 16 floats a sample, 4 MiB at batch 64), where the layers one by
// one passed those gradients through the ping-pong buffers.
struct FusedScratch {
  Tensor t;
  int64_t per_sample = 0;
};
struct GradientBuffers {
  Tensor buf[2];
  int64_t per_sample = 0;  // the largest gradient between layers any sharer passes, per sample
  std::shared_ptr<FusedScratch> scratch = std::make_shared<FusedScratch>();
};

class Sequence {
 public:
  void add(std::unique_ptr<Layer> layer) { layers_.push_back(std::move(layer)); }
  bool empty() const { return layers_.empty(); }
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }

  // Before setup, for a residual block's main branch: the block will add the shortcut to the
  // last layer's output and rectify the sum, and (with an identity shortcut) would like the
  // first layer's backward to add its input gradient to what dx holds. The fused blocks take
  // either in where the backend can (adds_residual, adds_input_grad).
  void want_residual_end() { want_residual_ = true; }
  void want_input_grad_added() { want_add_dx_ = true; }

  // Note [Fused blocks]: sets up the layers, then hands every chain conv -> [batchnorm] ->
  // [relu] -> [max pool] (with the residual add where wanted) to Backend::fused_block, and
  // runs each chain the backend takes as one op.
  Shape setup(Backend& backend, const Shape& in);
  void collect(std::vector<ParamSlot*>& params, std::vector<ParamSlot*>& buffers);

  // x: (N, in...) -> the output of the last layer (x itself when empty), owned by the sequence.
  const Tensor& forward(const Tensor& x, bool training);
  // Note [BatchNorm + residual]: true after setup if the last fused block adds the residual and
  // rectifies; forward_add_relu then writes max(0, the last BatchNorm's output + other) into
  // y, and backward takes the gradient of that sum before the ReLU.
  bool adds_residual() const;
  void forward_add_relu(const Tensor& x, const Tensor& other, Tensor& y, bool training);
  // dy: like the output -> dx: like x (null: not needed).
  void backward(const Tensor& x, const Tensor& dy, Tensor* dx, bool accumulate,
                const GradReadyFn& ready);
  // Note [Input gradient added]: true after setup if backward adds the input gradient to what
  // dx holds; dy may then be dx itself.
  bool adds_input_grad() const;
  // Note [Shared gradient buffers]: after setup, backward takes its gradient buffers from
  // `buffers`, shared with sequences that never run backward while this one does.
  void share_gradient_buffers(const std::shared_ptr<GradientBuffers>& buffers);

 private:
  // Layers first..last as one backend op (Note [Fused blocks]).
  struct Fused {
    size_t first = 0, last = 0;
    std::unique_ptr<FusedBlockOp> op;
    bool residual = false;  // adds the residual (the sequence's last block only)
    ParamSlot *w = nullptr, *b = nullptr, *gamma = nullptr, *beta = nullptr;
    ParamSlot *mean = nullptr, *var = nullptr;
    std::string kind;  // for the layer profile: "conv 3x3/1 pad 1 + batchnorm + relu"
    Tensor saved;      // what forward keeps for backward
    FusedBlockParams params() const;
  };
  void fuse_chains(Backend& backend);
  const Tensor& run_forward(const Tensor& x, bool training, const Tensor* other, Tensor* y);
  void size_gradients();

  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Tensor> acts_;  // acts_[i]: output of layer i (in a fused block: of its last only)
  std::vector<std::string> kinds_;  // kinds_[i]: "conv 3x3/1 pad 1", for the layer profile
  std::vector<Fused> fused_;
  std::vector<int> fused_of_;  // fused_of_[i]: the fused block layer i is in, or -1
  bool want_residual_ = false, want_add_dx_ = false;
  // Note [Ping-pong gradients]: the gradient flowing between layers only lives for one layer's
  // backward, so two buffers of the largest such gradient serve the whole chain (Note [Pooled
  // activations]); a block's branches share theirs (Note [Shared gradient buffers]).
  std::shared_ptr<GradientBuffers> grads_;
  std::shared_ptr<GradientBuffers> inner_;  // the buffers this sequence's blocks share
  Backend* backend_ = nullptr;
};

}  // namespace ddpv
