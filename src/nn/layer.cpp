// Layer helpers shared by every layer: input checks, buffers, descriptions.
#include "ddpv/nn/layers.hpp"

namespace ddpv {

Shape batch_shape(int64_t n, const Shape& per_sample) {
  std::vector<int64_t> d{n};
  d.insert(d.end(), per_sample.dims().begin(), per_sample.dims().end());
  return Shape(std::move(d));
}

void ensure_tensor(Tensor& t, const Shape& shape, Backend& backend) {
  if (t.owns_memory() && t.shape() == shape) return;
  t = Tensor::empty(shape, DType::kF32, backend.allocator());
}

void Layer::check_input(const Tensor& x) const {
  const Shape& s = x.shape();
  bool ok = s.rank() == in_.rank() + 1 && x.dtype() == DType::kF32;
  for (int i = 0; ok && i < in_.rank(); ++i) ok = s[i + 1] == in_[i];
  if (!ok) {
    std::string expected = "(N";
    for (int64_t d : in_.dims()) expected += ", " + std::to_string(d);
    DDPV_FAIL("layer ", name_, ": expected an f32 input ", expected, "), got ", x.str());
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
