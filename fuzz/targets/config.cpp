// ddpv-train's --config file (`key = value` lines, Boost.Program_options) and the option checks
// that follow it: everything a user can write there either parses into valid options or is
// refused with a UsageError, the one line ddpv-train prints with exit 2.
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "ddpv/train/command_line.hpp"
#include "fuzz_support.hpp"

DDPV_FUZZ_TARGET(config) {
  std::istringstream text(std::string(reinterpret_cast<const char*>(data), size));
  const char* argv[] = {"ddpv-train"};
  try {
    const ddpv::CommandLine cl = ddpv::parse_command_line(1, argv, text);
    const ddpv::TrainOptions& o = cl.options;
    // What validation promises the trainer.
    if (cl.action == ddpv::CommandLine::kTrain &&
        (!std::isfinite(o.lr) || !std::isfinite(o.momentum) || !std::isfinite(o.weight_decay) ||
         o.batch_size <= 0 || o.accum_steps <= 0))
      std::abort();
  } catch (const ddpv::UsageError& e) {
    if (std::string(e.what()).empty()) std::abort();
  }
  return 0;
}
