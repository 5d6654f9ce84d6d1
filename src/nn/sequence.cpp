// Sequence: forward and backward through a chain of layers, chains of them fused by the backend.
#include "nn/sequence.hpp"

#include <algorithm>

#include "ddpv/nn/layer_profile.hpp"
#include "nn/fusable.hpp"

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
  fuse_chains(backend);
  size_gradients();
  return s;
}

// The chains (Note [Fused blocks]): the longest from each convolution, conv -> [batchnorm] ->
// [relu]
// -> [max pool], or conv -> batchnorm -> + residual -> relu at the end of a residual block's
// main branch (the ReLU is the block's), goes to the backend as one op; where it declines the
// residual add, the chain goes again without it. A chain the backend declines runs its layers
// one by one. The block's op asks for the input gradient to be added (Note [Input gradient
// added]) only for the first layer, and only where the gradient dy that may share dx's memory
// is read before the convolution adds to dx: by a later layer's backward, or the BatchNorm's.
void Sequence::fuse_chains(Backend& backend) {
  fused_.clear();
  fused_of_.assign(layers_.size(), -1);
  const size_t count = layers_.size();
  auto part = [&](size_t k) { return k < count ? block_part(*layers_[k]) : BlockPart{}; };
  for (size_t i = 0; i < count; ++i) {
    const BlockPart conv = part(i);
    if (conv.kind != BlockPart::kConv) continue;
    FusedBlockConfig cfg;
    cfg.conv = *conv.conv;
    size_t j = i;
    BlockPart bn;
    if (part(j + 1).kind == BlockPart::kBatchNorm) {
      bn = part(++j);
      cfg.batch_norm = true;
      cfg.bn = *bn.bn;
    }
    if (cfg.batch_norm && want_residual_ && j + 1 == count) {
      cfg.add_residual = true;
      cfg.relu = true;
    } else if (part(j + 1).kind == BlockPart::kRelu) {
      ++j;
      cfg.relu = true;
      if (part(j + 1).kind == BlockPart::kMaxPool) {
        cfg.max_pool = true;
        cfg.pool = *part(++j).pool;
      }
    }
    if (j == i) continue;  // a convolution alone: nothing to fuse
    cfg.add_input_grad = want_add_dx_ && i == 0 && (j + 1 < count || cfg.batch_norm);
    std::unique_ptr<FusedBlockOp> op = backend.fused_block(cfg);
    if (op == nullptr && cfg.add_residual) {
      cfg.add_residual = cfg.relu = false;
      op = backend.fused_block(cfg);
    }
    if (op == nullptr) {
      i = j;
      continue;
    }
    Fused f;
    f.first = i;
    f.last = j;
    f.residual = cfg.add_residual;
    f.w = conv.weight;
    f.b = conv.bias;
    f.gamma = bn.weight;
    f.beta = bn.bias;
    f.mean = bn.running_mean;
    f.var = bn.running_var;
    f.kind = kinds_[i] + (cfg.batch_norm ? " + batchnorm" : "") +
             (cfg.add_residual ? " + shortcut" : "") + (cfg.relu ? " + relu" : "") +
             (cfg.max_pool ? " + maxpool" : "");
    for (size_t k = i; k <= j; ++k) {
      auto* layer = dynamic_cast<Fusable*>(layers_[k].get());
      const BlockPart::Kind kind = part(k).kind;
      layer->join_block(kind == BlockPart::kConv        ? op->describe_conv()
                        : kind == BlockPart::kBatchNorm ? op->describe_batch_norm()
                        : kind == BlockPart::kMaxPool   ? op->describe_pool()
                                                        : std::string());
      fused_of_[k] = static_cast<int>(fused_.size());
    }
    f.op = std::move(op);
    fused_.push_back(std::move(f));
    i = j;
  }
}

FusedBlockParams Sequence::Fused::params() const {
  FusedBlockParams p;
  p.w = w->value;
  p.dw = w->grad;
  if (b != nullptr) {
    p.b = b->value;
    p.db = b->grad;
  }
  if (gamma != nullptr) {
    p.gamma = gamma->value;
    p.beta = beta->value;
    p.dgamma = gamma->grad;
    p.dbeta = beta->grad;
    p.running_mean = mean->value;
    p.running_var = var->value;
  }
  return p;
}

// Note [Pooled activations]: a fused block writes only its last layer's output (a convolution
// that computes its max pooling writes only the pooling's: lenet at batch 64 keeps neither
// conv1's full output, 6.4 MB, nor its ReLU's), keeping in its own `saved` tensor what its
// backward reads, and the two gradient buffers (Note [Ping-pong gradients]) hold the largest
// gradient a layer or block writes for the one before it: the input of each one after the
// first (the first writes the caller's dx). The gradients inside fused blocks go through one
// scratch tensor, shared as the buffers are.
void Sequence::size_gradients() {
  grads_ = std::make_shared<GradientBuffers>();
  grads_->scratch = inner_->scratch;  // one for this sequence and its blocks' branches
  FusedScratch& scratch = *grads_->scratch;
  for (size_t k = 0; k < layers_.size(); ++k) {
    const int f = fused_of_[k];
    if (f >= 0 && fused_[f].first != k) continue;
    if (k > 0)
      grads_->per_sample = std::max(grads_->per_sample, layers_[k - 1]->out_shape().numel());
    if (f >= 0)
      scratch.per_sample = std::max(scratch.per_sample, fused_[f].op->scratch_per_sample());
  }
}

void Sequence::share_gradient_buffers(const std::shared_ptr<GradientBuffers>& buffers) {
  buffers->per_sample = std::max(buffers->per_sample, grads_->per_sample);
  buffers->scratch->per_sample =
      std::max(buffers->scratch->per_sample, grads_->scratch->per_sample);
  inner_->scratch = buffers->scratch;  // Note [Fused blocks]: one scratch for the model
  grads_ = buffers;
}

bool Sequence::adds_input_grad() const {
  return !fused_.empty() && fused_.front().first == 0 && fused_.front().op->adds_input_grad();
}

bool Sequence::adds_residual() const {
  return !fused_.empty() && fused_.back().residual && fused_.back().last + 1 == layers_.size();
}

void Sequence::collect(std::vector<ParamSlot*>& params, std::vector<ParamSlot*>& buffers) {
  for (auto& layer : layers_) layer->collect(params, buffers);
}

const Tensor& Sequence::forward(const Tensor& x, bool training) {
  return run_forward(x, training, nullptr, nullptr);
}

void Sequence::forward_add_relu(const Tensor& x, const Tensor& other, Tensor& y, bool training) {
  DDPV_CHECK(adds_residual(), "forward_add_relu on a sequence that adds no residual (internal)");
  run_forward(x, training, &other, &y);
}

const Tensor& Sequence::run_forward(const Tensor& x, bool training, const Tensor* other,
                                    Tensor* y) {
  const int64_t n = x.shape()[0];
  const Tensor* in = &x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (fused_of_[i] >= 0) {  // Note [Fused blocks]
      Fused& f = fused_[fused_of_[i]];
      Tensor& out = acts_[f.last];
      if (f.residual) {  // Note [BatchNorm + residual]: written into the block's output
        DDPV_CHECK(other != nullptr, "a fused block that adds the residual got none (internal)");
        out = Tensor::wrap(y->raw(), y->shape(), y->dtype(), y->device());
      } else {
        ensure_tensor(out, batch_shape(n, layers_[f.last]->out_shape()), *backend_);
      }
      const int64_t saved = f.op->saved_per_sample();
      if (saved > 0) ensure_tensor(f.saved, Shape{n * saved}, *backend_, DType::kF32);
      layers_[i]->check_input(*in);
      ProfileScope timed(backend_, layers_[i]->name(), f.kind, ProfilePhase::kForward);
      f.op->forward(static_cast<int>(n), training, cact(*in), f.params(),
                    f.residual ? cact(*other) : ConstAct(),
                    saved > 0 ? f.saved.data<float>() : nullptr, mact(out));
      in = &out;
      i = f.last;
      continue;
    }
    ensure_tensor(acts_[i], batch_shape(n, layers_[i]->out_shape()), *backend_);
    const bool leaf = !layers_[i]->is_block();
    ProfileScope timed(leaf ? backend_ : nullptr, layers_[i]->name(), kinds_[i],
                       ProfilePhase::kForward);
    layers_[i]->forward(*in, acts_[i], training);
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
  FusedScratch& scratch = *grads_->scratch;
  if (scratch.per_sample > 0)
    ensure_tensor(scratch.t, Shape{n * scratch.per_sample}, *backend_, DType::kF32);
  Tensor upstream = dy;
  int next = 0;
  for (size_t k = layers_.size(); k-- > 0;) {
    const int fi = fused_of_[k];
    const size_t first = fi >= 0 ? fused_[fi].first : k;
    const Tensor& in = first == 0 ? x : acts_[first - 1];
    Tensor view;
    Tensor* down = nullptr;
    if (first == 0) {
      down = dx;
    } else {
      view = Tensor::wrap(grads_->buf[next].raw(), in.shape(), backend_->activation_dtype(),
                          in.device());
      down = &view;
    }
    if (fi >= 0) {  // Note [Fused blocks]
      Fused& f = fused_[fi];
      {
        ProfileScope timed(backend_, layers_[first]->name(), f.kind, ProfilePhase::kBackward);
        const bool saved = f.op->saved_per_sample() > 0;
        f.op->backward(static_cast<int>(n), cact(in), f.params(),
                       saved ? f.saved.data<float>() : nullptr, cact(acts_[f.last]), cact(upstream),
                       scratch.per_sample > 0 ? scratch.t.data<float>() : nullptr,
                       down ? mact(*down) : MutAct(), accumulate);
      }
      // In the order the layers report them one by one: the BatchNorm's, then the convolution's.
      if (ready) {
        for (const ParamSlot* p : {f.beta, f.gamma, f.b, f.w})
          if (p != nullptr) ready(p->index);
      }
      k = first;
    } else {
      const bool leaf = !layers_[k]->is_block();
      ProfileScope timed(leaf ? backend_ : nullptr, layers_[k]->name(), kinds_[k],
                         ProfilePhase::kBackward);
      layers_[k]->backward(in, acts_[k], upstream, down, accumulate, ready);
    }
    if (first > 0) {
      upstream = view;
      next ^= 1;
    }
  }
}

}  // namespace ddpv
