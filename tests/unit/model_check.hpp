// What the model tests (nn_model_test.cpp, nn_memory_test.cpp) share: a one-thread CPU
// backend, the loss gradient a training step hands Model::backward, and errors relative to the
// largest entry.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "ddpv/backend/backend.hpp"
#include "ddpv/core/tensor.hpp"
#include "support/test_support.hpp"

namespace ddpv::test {

inline std::unique_ptr<Backend> cpu() {
  BackendOptions o;
  o.threads = 1;
  return make_backend(o);
}

// The gradient of the summed cross-entropy of logits (N, classes) against labels ys: what a
// training step hands Model::backward.
inline Tensor loss_gradient(Backend& be, const Tensor& logits, const std::vector<int32_t>& ys) {
  const int n = static_cast<int>(logits.shape()[0]), classes = static_cast<int>(logits.shape()[1]);
  auto loss = be.softmax_cross_entropy(classes);
  Tensor dl = Tensor::empty(Shape{n, classes}, DType::kF32);
  loss->forward(n, logits.data<float>(), ys.data());
  loss->backward(n, ys.data(), dl.data<float>(), 1.0f);
  return dl;
}

// got against want, each error relative to want's largest entry: the Winograd convolutions'
// rounding follows the magnitude of a whole tile, not of each entry.
inline double error_of_largest(const std::vector<float>& got, const std::vector<float>& want) {
  float largest = 0;
  for (float v : want) largest = std::max(largest, std::abs(v));
  return max_rel_error(got, want, largest);
}

}  // namespace ddpv::test
