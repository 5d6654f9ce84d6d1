// Layer helpers shared by every layer: input checks, buffers, descriptions.
#include "ddpv/nn/layers.hpp"

namespace ddpv {

Shape batch_shape(int64_t n, const Shape& per_sample) {
  std::vector<int64_t> d{n};
  d.insert(d.end(), per_sample.dims().begin(), per_sample.dims().end());
  return Shape(std::move(d));
}

// Note [Grow-only activations]: a batch smaller than the one before (an epoch's last step,
// where the rank's shard does not divide by the batch size; evaluation's last batch) used to
// reallocate every activation and gradient buffer it met, zero-filled on fresh pages, and the
// next full batch to reallocate them all again: four times an epoch in `make bench`'s
// Fashion-MNIST runs, page faults and all. A tensor's storage now only grows: a shape that
// fits takes a view of the storage from its start. `model_bench --batch 64 --batch-change 48`
// (a step of 48 after 64, then of 64 after 48) shows what that saves: both steps after a
// change took half as long or less than before, for lenet and resnet20 alike, with the steady
// step of 64 unchanged, so an epoch's short last step no longer costs a round of page faults
// (docs/architecture.md, "Memory between layers").
void ensure_tensor(Tensor& t, const Shape& shape, Backend& backend, DType dtype) {
  if (t.owns_memory() && t.shape() == shape && t.dtype() == dtype) return;
  if (t.owns_memory() && t.dtype() == dtype &&
      static_cast<size_t>(shape.numel()) * dtype_size(dtype) <= t.capacity()) {
    t = t.fit(shape);  // Note [Grow-only activations]
    return;
  }
  t = Tensor::empty(shape, dtype, backend.allocator());
}

void ensure_tensor(Tensor& t, const Shape& shape, Backend& backend) {
  ensure_tensor(t, shape, backend, backend.activation_dtype());
}

void Layer::check_input(const Tensor& x) const {
  const Shape& s = x.shape();
  // f32 (the model's input) or the backend's activation dtype (Note [Activation dtype]).
  const DType act = backend_ != nullptr ? backend_->activation_dtype() : DType::kF32;
  bool ok = s.rank() == in_.rank() + 1 && (x.dtype() == DType::kF32 || x.dtype() == act);
  for (int i = 0; ok && i < in_.rank(); ++i) ok = s[i + 1] == in_[i];
  if (!ok) {
    std::string expected = "(N";
    for (int64_t d : in_.dims()) expected += ", " + std::to_string(d);
    DDPV_FAIL("layer ", name_, ": expected an f32", act == DType::kF32 ? "" : " or bf16", " input ",
              expected, "), got ", x.str());
  }
}

void Layer::setup_image_input(Backend& backend, const Shape& in) {
  DDPV_CHECK(in.rank() == 3, "layer ", name_, ": needs an (H, W, C) input, got ", in.str());
  backend_ = &backend;
  in_ = in;
}

std::string Layer::describe() const {
  return name_ + ": " + in_.str() + " -> " + out_.str();
}

}  // namespace ddpv
