// Model: arenas in reverse layer order, initialisation, forward and backward.
#include "ddpv/nn/model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>

#include "ddpv/core/rng.hpp"
#include "ddpv/nn/layers.hpp"
#include "nn/sequence.hpp"

namespace ddpv {

struct Model::Impl {
  Sequence seq;
  std::vector<ParamSlot*> param_slots, buffer_slots;  // forward order
  Tensor input;                                       // the last forward's x
  int input_block = 0;   // the first layer's input layout (Note [Blocked activations])
  Tensor blocked_input;  // x in that layout, when it is not NHWC
};

namespace {

// Lays `slots` out back to front (Note [Reverse layer order]), each on a 64-byte boundary
// (Note [Aligned entries]), and returns the arena entries.
std::vector<ArenaEntry> lay_out_reversed(const std::vector<ParamSlot*>& slots, int64_t* total) {
  std::vector<ArenaEntry> entries;
  int64_t offset = 0;
  for (auto it = slots.rbegin(); it != slots.rend(); ++it) {
    ParamSlot* s = *it;
    s->index = static_cast<int>(entries.size());
    const int64_t count = s->shape.numel();
    const int64_t extent = (count + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
    entries.push_back({s->name, s->shape, offset, count, extent, s->decay});
    offset += extent;
  }
  *total = offset;
  return entries;
}

std::vector<float> initial_values(const ParamSlot& s, uint64_t key) {
  std::vector<float> v(static_cast<size_t>(s.shape.numel()));
  Rng rng(key);
  switch (s.init) {
    case Init::kZeros:
      break;
    case Init::kOnes:
      std::fill(v.begin(), v.end(), 1.0f);
      break;
    case Init::kUniformFanIn: {
      const float bound = 1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(s.fan_in, 1)));
      for (auto& x : v) x = (2.0f * rng.uniform() - 1.0f) * bound;
      break;
    }
    case Init::kNormalFanOut: {
      const float stddev = std::sqrt(2.0f / static_cast<float>(std::max<int64_t>(s.fan_out, 1)));
      for (auto& x : v) x = rng.normal() * stddev;
      break;
    }
  }
  return v;
}

}  // namespace

Model::Model(std::string name, Backend& backend, std::vector<std::unique_ptr<Layer>> layers,
             const Shape& input_hwc, int num_classes)
    : name_(std::move(name)),
      backend_(backend),
      impl_(std::make_unique<Impl>()),
      input_(input_hwc),
      num_classes_(num_classes) {
  for (auto& l : layers) impl_->seq.add(std::move(l));
  const Shape out = impl_->seq.setup(backend, input_hwc);
  impl_->input_block = input_hwc.rank() == 3
                           ? block_for(static_cast<int>(input_hwc[2]), backend.activation_block())
                           : 0;
  DDPV_CHECK(out == Shape{num_classes}, "model ", name_, ": produces ", out.str(),
             " per sample, expected (", num_classes, ") logits");
  impl_->seq.collect(impl_->param_slots, impl_->buffer_slots);
  params_ = lay_out_reversed(impl_->param_slots, &param_count_);
  buffers_ = lay_out_reversed(impl_->buffer_slots, &buffer_count_);
  Allocator* alloc = backend.allocator();
  param_arena_ = Tensor::empty(Shape{param_count_}, DType::kF32, alloc);
  grad_arena_ = Tensor::empty(Shape{param_count_}, DType::kF32, alloc);
  momentum_arena_ = Tensor::empty(Shape{param_count_}, DType::kF32, alloc);
  buffer_arena_ = Tensor::empty(Shape{std::max<int64_t>(buffer_count_, 1)}, DType::kF32, alloc);
  point_param_slots();
  for (ParamSlot* s : impl_->buffer_slots) s->value = buffer_data() + buffers_[s->index].offset;
  init_parameters(0);
}

Model::~Model() = default;

void Model::point_param_slots() {
  for (ParamSlot* s : impl_->param_slots) {
    s->value = param_data() + params_[s->index].offset;
    s->grad = grad_data() + params_[s->index].offset;
  }
}

void Model::bind_arenas(float* params, float* grads, float* momentum, bool copy_values) {
  for (const float* a : {params, grads, momentum})
    DDPV_CHECK(a != nullptr && reinterpret_cast<uintptr_t>(a) % 64 == 0, "model ", name_,
               ": arenas must be 64-byte aligned memory");
  const size_t bytes = static_cast<size_t>(param_count_) * sizeof(float);
  const Device d = backend_.device();
  if (copy_values) {
    backend_.copy(params, d, param_data(), d, bytes);
    backend_.copy(momentum, d, momentum_data(), d, bytes);
  }
  backend_.fill(param_count_, 0.0f, grads);
  const Shape shape{param_count_};
  param_arena_ = Tensor::wrap(params, shape, DType::kF32, d);
  grad_arena_ = Tensor::wrap(grads, shape, DType::kF32, d);
  momentum_arena_ = Tensor::wrap(momentum, shape, DType::kF32, d);
  point_param_slots();
  backend_.synchronize();
}

std::vector<ParamSpan> Model::decay_spans() const {
  std::vector<ParamSpan> spans;  // each entry's padding goes with it: the spans tile the arena
  for (const auto& e : params_) {
    if (!spans.empty() && spans.back().decay == e.decay) {
      spans.back().count += e.extent;
    } else {
      spans.push_back({e.offset, e.extent, e.decay});
    }
  }
  return spans;
}

int64_t Model::num_parameters() const {
  int64_t n = 0;
  for (const auto& e : params_) n += e.count;
  return n;
}

void Model::init_parameters(uint64_t seed) {
  // Each tensor draws from its own key (seed, forward position), so adding a layer at the end
  // does not change the initial values of the others.
  backend_.fill(param_count_, 0.0f, param_data());  // the padding (Note [Aligned entries])
  backend_.fill(buffer_count_, 0.0f, buffer_data());
  uint64_t k = 0;
  for (auto* slots : {&impl_->param_slots, &impl_->buffer_slots}) {
    for (ParamSlot* s : *slots) {
      const std::vector<float> v = initial_values(*s, derive_key(seed, 0x1417, k++));
      backend_.copy(s->value, backend_.device(), v.data(), Device::kCpu, v.size() * sizeof(float));
    }
  }
  backend_.fill(param_count_, 0.0f, grad_data());
  backend_.fill(param_count_, 0.0f, momentum_data());
  batches_tracked_ = 0;
  backend_.synchronize();
}

const Tensor& Model::forward(const Tensor& x, bool training) {
  DDPV_CHECK(x.device() == backend_.device(), "model ", name_, ": input is on ",
             device_name(x.device()), " but the model runs on ", device_name(backend_.device()));
  impl_->input = x;
  if (training) ++batches_tracked_;
  if (impl_->input_block != 0) {  // the loader's NHWC, in the layers' layout
    DDPV_CHECK(x.shape().rank() == 4 && x.shape()[1] == input_[0] && x.shape()[2] == input_[1] &&
                   x.shape()[3] == input_[2],
               "model ", name_, ": expected an input (N, ", input_[0], ", ", input_[1], ", ",
               input_[2], "), got ", x.str());
    ensure_tensor(impl_->blocked_input, x.shape(), backend_);
    backend_.relayout(static_cast<int>(x.shape()[0]), static_cast<int>(input_[0]),
                      static_cast<int>(input_[1]), static_cast<int>(input_[2]), 0,
                      impl_->input_block, cact(x), mact(impl_->blocked_input));
    impl_->input = impl_->blocked_input;
  }
  return impl_->seq.forward(impl_->input, training);
}

void Model::backward(const Tensor& dlogits, bool accumulate, const GradReadyFn& on_ready) {
  DDPV_CHECK(impl_->input.defined() && impl_->input.numel() > 0, "model ", name_,
             ": backward called before forward");
  DDPV_CHECK(dlogits.shape() == Shape({impl_->input.shape()[0], num_classes_}), "model ", name_,
             ": logit gradient ", dlogits.shape().str(), " does not match the batch");
  impl_->seq.backward(impl_->input, dlogits, nullptr, accumulate, on_ready);
}

namespace {
const ArenaEntry* find_entry(const std::vector<ArenaEntry>& entries, const std::string& name) {
  for (const auto& e : entries)
    if (e.name == name) return &e;
  return nullptr;
}
}  // namespace

void Model::set_param(const std::string& name, const std::vector<float>& host) {
  const ArenaEntry* e = find_entry(params_, name);
  float* base = param_data();
  if (e == nullptr) {
    e = find_entry(buffers_, name);
    base = buffer_data();
  }
  DDPV_CHECK(e != nullptr, "model ", name_, " has no parameter or buffer named '", name, "'");
  DDPV_CHECK(static_cast<int64_t>(host.size()) == e->count, "parameter ", name, " has ", e->count,
             " values ", e->shape.str(), ", got ", host.size());
  backend_.copy(base + e->offset, backend_.device(), host.data(), Device::kCpu,
                host.size() * sizeof(float));
}

std::vector<float> Model::get_param(const std::string& name) {
  const ArenaEntry* e = find_entry(params_, name);
  const float* base = param_data();
  if (e == nullptr) {
    e = find_entry(buffers_, name);
    base = buffer_data();
  }
  DDPV_CHECK(e != nullptr, "model ", name_, " has no parameter or buffer named '", name, "'");
  std::vector<float> v(static_cast<size_t>(e->count));
  backend_.copy(v.data(), Device::kCpu, base + e->offset, backend_.device(), v.size() * 4);
  backend_.synchronize();
  return v;
}

std::vector<float> Model::get_grad(const std::string& name) {
  const ArenaEntry* e = find_entry(params_, name);
  DDPV_CHECK(e != nullptr, "model ", name_, " has no parameter named '", name, "'");
  std::vector<float> v(static_cast<size_t>(e->count));
  backend_.copy(v.data(), Device::kCpu, grad_data() + e->offset, backend_.device(), v.size() * 4);
  backend_.synchronize();
  return v;
}

std::string Model::summary() const {
  std::ostringstream os;
  os << name_ << " on " << backend_.name() << ", input " << input_.str() << ", " << num_classes_
     << " classes, " << num_parameters() << " parameters\n";
  for (const auto& l : impl_->seq.layers()) os << "  " << l->describe() << "\n";
  return os.str();
}

}  // namespace ddpv
