// Private: what the checkpoint writer (checkpoint.cpp) and reader (checkpoint_read.cpp) share:
// names of the layout in docs/checkpoint-format.md, and host copies of the model's arenas.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ddpv/nn/model.hpp"

namespace ddpv::ckpt {

inline constexpr const char* kFormat = "ddpvision-checkpoint";
inline constexpr const char* kTrackedSuffix = ".num_batches_tracked";

bool ends_with(const std::string& s, const std::string& suffix);
// "bn1" for "bn1.running_mean": every BatchNorm has exactly one running_mean buffer.
std::vector<std::string> batchnorm_prefixes(const Model& model);

// Host copies of the three arenas, in arena order.
struct HostArenas {
  std::vector<float> params, momentum, buffers;
  int64_t batches_tracked = 0;
};
HostArenas copy_to_host(Model& model);
// Copies `host` into the model's arenas and its batches_tracked.
void copy_to_model(const HostArenas& host, Model& model);

}  // namespace ddpv::ckpt
