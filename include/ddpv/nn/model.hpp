// Model: a CNN as a graph of layers (sequential stages and residual blocks) whose parameters,
// gradients and momentum live in flat arenas laid out in reverse layer order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddpv/backend/backend.hpp"

namespace ddpv {

// One named tensor of an arena. Names are PyTorch state_dict names ("layer1.0.conv1.weight").
struct ArenaEntry {
  std::string name;
  Shape shape;         // PyTorch shape: conv OIHW, linear (out, in), vectors (C)
  int64_t offset = 0;  // in floats, from the start of the arena
  int64_t count = 0;
  int64_t extent = 0;  // floats it occupies: count and its padding (Note [Aligned entries])
  bool decay = true;   // weight decay applies (false for BatchNorm parameters and biases)
};

// Note [Aligned entries]: every entry of an arena starts on a 64-byte boundary (kArenaAlign
// floats): its extent is its count rounded up, and the padding after it stays zero in every
// arena (parameters, gradients, momentum, buffers), so the optimizer, the allreduce and the
// checksums may run over it as over any parameter. Devices want it: cuDNN's persistent
// BatchNorm kernels read the per-channel vectors 16 bytes at a time and fault with "misaligned
// address" otherwise (on a GPU, resnet20's 10-float fc.bias, first in the arena, put every
// later tensor 8 bytes off), and vector loads on the CPU cross no cache line.
// param_count() is the arena's length; num_parameters() counts the model's own.
inline constexpr int64_t kArenaAlign = 16;

// Note [Reverse layer order]: arenas list tensors in the reverse of the order in which the
// forward pass uses them. Backward produces gradients in exactly that order, so every
// gradient bucket is one contiguous slice of the arena and fusing costs no copy; params and
// momentum share the layout so the optimizer is one elementwise pass over three arenas.

// Called during backward when the gradient of params()[index] is final.
using GradReadyFn = std::function<void(int index)>;

class Layer;

class Model {
 public:
  Model(std::string name, Backend& backend, std::vector<std::unique_ptr<Layer>> layers,
        const Shape& input_hwc, int num_classes);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const std::string& name() const { return name_; }
  Backend& backend() { return backend_; }
  const Shape& input_shape() const { return input_; }  // (H, W, C)
  int num_classes() const { return num_classes_; }

  // Parameters (and gradients, momentum: same layout) in arena order.
  const std::vector<ArenaEntry>& params() const { return params_; }
  int64_t param_count() const { return param_count_; }  // the arena's length, in floats
  int64_t num_parameters() const;                       // without the padding
  float* param_data() { return param_arena_.data<float>(); }
  float* grad_data() { return grad_arena_.data<float>(); }
  float* momentum_data() { return momentum_arena_.data<float>(); }
  // Buffers: BatchNorm running_mean and running_var. num_batches_tracked is the same for every
  // BatchNorm of a model (each training forward uses all of them): batches_tracked().
  const std::vector<ArenaEntry>& buffers() const { return buffers_; }
  int64_t buffer_count() const { return buffer_count_; }
  float* buffer_data() { return buffer_arena_.data<float>(); }
  int64_t batches_tracked() const { return batches_tracked_; }
  void set_batches_tracked(int64_t n) { batches_tracked_ = n; }
  // Moves the parameter, gradient and momentum arenas into memory the caller owns and keeps
  // alive while the model is used: param_count() floats each, 64-byte aligned, on the
  // backend's device (Note [Shared update]). copy_values: copy the current parameters and
  // momentum there (false: another process has written them). The gradients start at zero.
  void bind_arenas(float* params, float* grads, float* momentum, bool copy_values);
  // Weight-decay runs of the parameter arena, for Backend::sgd_update.
  std::vector<ParamSpan> decay_spans() const;

  // PyTorch's default initialisation (kaiming-uniform(a=sqrt(5)) for conv and linear weights,
  // uniform(+-1/sqrt(fan_in)) for biases, BatchNorm weight 1 and bias 0), from `seed`.
  void init_parameters(uint64_t seed);

  // x: (N, H, W, C) on the backend's device -> logits (N, classes), valid until the next
  // forward. training: BatchNorm uses batch statistics and keeps what backward needs.
  const Tensor& forward(const Tensor& x, bool training);
  // dlogits: (N, classes). Writes every parameter gradient into the gradient arena (adds to it
  // when accumulate) and calls on_ready(index) as each one becomes final.
  void backward(const Tensor& dlogits, bool accumulate, const GradReadyFn& on_ready = {});

  // Copies host data into (or out of) the arena entry called `name`; throws naming the entry
  // when absent or the size differs.
  void set_param(const std::string& name, const std::vector<float>& host);
  std::vector<float> get_param(const std::string& name);
  std::vector<float> get_grad(const std::string& name);
  std::string summary() const;  // layers, shapes, parameter count

 private:
  void point_param_slots();  // the layers' parameter slots at the current arenas

  std::string name_;
  Backend& backend_;
  struct Impl;
  std::unique_ptr<Impl> impl_;  // the layer graph and the slots bound to the arenas
  Shape input_;
  int num_classes_;
  std::vector<ArenaEntry> params_, buffers_;
  int64_t param_count_ = 0, buffer_count_ = 0;
  Tensor param_arena_, grad_arena_, momentum_arena_, buffer_arena_;
  int64_t batches_tracked_ = 0;
};

// The model zoo: "lenet", "resnet20", "resnet56" (and, with the CUDA issue, "resnet18",
// "resnet50"). input_hwc and classes come from the data.
std::unique_ptr<Model> make_model(const std::string& name, Backend& backend, const Shape& input_hwc,
                                  int num_classes);
std::vector<std::string> model_names();

}  // namespace ddpv
