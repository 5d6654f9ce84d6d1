// WeightedLayer: the part Conv2d and Linear share — a weight, an optional bias, and an op with
// the signature forward(n, x, w, b, y) / backward(n, x, w, dy, dx, dw, db, accumulate).
#pragma once

#include <memory>

#include "ddpv/nn/layers.hpp"

namespace ddpv {

template <typename Op>
class WeightedLayer : public Layer {
 public:
  WeightedLayer(const std::string& name, bool bias) : Layer(name), has_bias_(bias) {}

  // Forward order weight then bias, so the arena (reverse order) holds the bias first, as
  // backward reports it.
  void collect(std::vector<ParamSlot*>& params, std::vector<ParamSlot*>&) override {
    params.push_back(&weight_);
    if (has_bias_) params.push_back(&bias_);
  }

  void forward(const Tensor& x, Tensor& y, bool) override {
    check_input(x);
    op_->forward(static_cast<int>(x.shape()[0]), cact(x), weight_.value,
                 has_bias_ ? bias_.value : nullptr, mact(y));
  }

  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx, bool accumulate,
                const GradReadyFn& ready) override {
    op_->backward(static_cast<int>(x.shape()[0]), cact(x), weight_.value, cact(dy),
                  dx ? mact(*dx) : MutAct(), weight_.grad, has_bias_ ? bias_.grad : nullptr,
                  accumulate);
    if (has_bias_) report(bias_, ready);
    report(weight_, ready);
  }

 protected:
  // Names and initialises both slots: weight (decayed) and bias (not decayed).
  void declare(const Shape& weight_shape, int64_t bias_count, Init weight_init, int64_t fan_in,
               int64_t fan_out) {
    weight_ = {name_ + ".weight", weight_shape, true, weight_init, fan_in, fan_out};
    bias_ = {name_ + ".bias", Shape{bias_count}, false, Init::kUniformFanIn, fan_in, fan_out};
  }

  bool has_bias_;
  std::unique_ptr<Op> op_;
  ParamSlot weight_, bias_;
};

}  // namespace ddpv
