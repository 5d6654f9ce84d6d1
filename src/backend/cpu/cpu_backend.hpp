// Factory of the CPU backend (oneDNN); private to the backend registry.
#pragma once

#include <memory>

#include "ddpv/backend/backend.hpp"

namespace ddpv {

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options);

}  // namespace ddpv
