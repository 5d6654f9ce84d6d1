// The resume checks of Note [Resume checks]: the checkpoint's run against the new options.
#include "train/resume_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

namespace ddpv {
namespace {

// "0.05", "1e-05": exact enough to tell two different values apart.
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

// The "key = value" lines of a checkpoint's options attribute.
std::map<std::string, std::string> parse_options(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find(" = ");
    if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 3);
  }
  return out;
}

double to_double(const std::map<std::string, std::string>& kv, const char* key) {
  const auto it = kv.find(key);
  return it == kv.end() ? 0.0 : std::strtod(it->second.c_str(), nullptr);
}

// A format 1 checkpoint's values, from its options text (printed with 6 significant digits,
// so its floating-point values compare to that precision).
CheckpointMeta from_options(const CheckpointMeta& m, const RunPlan& now) {
  CheckpointMeta r = m;
  const auto kv = parse_options(m.options);
  r.batch_size = static_cast<int64_t>(to_double(kv, "batch-size"));
  r.accum_steps = std::max<int64_t>(1, static_cast<int64_t>(to_double(kv, "accum-steps")));
  r.lr = to_double(kv, "lr");
  r.lr_schedule = kv.count("lr-schedule") ? kv.at("lr-schedule") : "";
  r.warmup_epochs = to_double(kv, "warmup-epochs");
  // Its schedule's length is known only in the new run's epochs, so only with the same batch.
  r.schedule_steps = 0;
  if (m.global_batch == now.global_batch() && now.steps_per_epoch > 0) {
    const auto epochs = static_cast<int64_t>(to_double(kv, "epochs"));
    const auto max_steps = static_cast<int64_t>(to_double(kv, "max-steps"));
    r.schedule_steps = now.steps_per_epoch * epochs;
    if (max_steps > 0) r.schedule_steps = std::min(r.schedule_steps, max_steps);
  }
  return r;
}

bool same(double a, double b, bool rounded) {
  return rounded ? std::fabs(a - b) <= 1e-5 * std::max(std::fabs(a), std::fabs(b)) : a == b;
}

}  // namespace

std::string batch_text(int64_t world_size, int64_t batch_size, int64_t accum_steps) {
  std::string s = std::to_string(world_size) + (world_size == 1 ? " rank" : " ranks");
  if (batch_size > 0) s += " x --batch-size " + std::to_string(batch_size);
  if (accum_steps > 1) s += " x --accum-steps " + std::to_string(accum_steps);
  return s;
}

std::vector<std::string> resume_differences(const CheckpointMeta& old, const RunPlan& now) {
  const bool v1 = old.accum_steps == 0;  // format 1: no run attributes
  const CheckpointMeta m = v1 ? from_options(old, now) : old;
  std::vector<std::string> d;
  if (m.global_batch != now.global_batch()) {
    d.push_back("global batch " + std::to_string(m.global_batch) + " -> " +
                std::to_string(now.global_batch()) + " (" +
                batch_text(m.world_size, m.batch_size, m.accum_steps) + " -> " +
                batch_text(now.world_size, now.batch_size, now.accum_steps) + ")");
  }
  if (m.accum_steps != now.accum_steps)
    d.push_back("--accum-steps " + std::to_string(m.accum_steps) + " -> " +
                std::to_string(now.accum_steps));
  if (!same(m.lr, now.lr, v1)) d.push_back("--lr " + num(m.lr) + " -> " + num(now.lr));
  const std::string schedule = choice_name(now.lr_schedule);
  if (!m.lr_schedule.empty() && m.lr_schedule != schedule)
    d.push_back("--lr-schedule " + m.lr_schedule + " -> " + schedule);
  if (!same(m.warmup_epochs, now.warmup_epochs, v1))
    d.push_back("--warmup-epochs " + num(m.warmup_epochs) + " -> " + num(now.warmup_epochs));
  if (now.lr_schedule != LrShape::kConstant && m.schedule_steps > 0 &&
      m.schedule_steps != now.schedule_steps)
    d.push_back("schedule length " + std::to_string(m.schedule_steps) + " -> " +
                std::to_string(now.schedule_steps) + " steps (--epochs, --max-steps)");
  return d;
}

}  // namespace ddpv
