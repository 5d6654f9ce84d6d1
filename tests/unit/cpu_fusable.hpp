// For the tests of the CPU kernels' fusions: the CPU backend's ops with what their kernels can
// take in from their neighbours (src/backend/cpu/cpu_ops.hpp), which only its fused blocks ask
// for (Note [Fused blocks]); the backend hands them out as plain ops.
#pragma once

#include <memory>

#include "backend/cpu/cpu_ops.hpp"

namespace ddpv::test {

// `made` (an op of the CPU backend) as the CPU's own type T; null where it is not one.
template <class T, class U>
std::unique_ptr<T> as_fusable(std::unique_ptr<U> made) {
  T* op = dynamic_cast<T*>(made.get());
  if (op != nullptr) made.release();
  return std::unique_ptr<T>(op);
}

}  // namespace ddpv::test
