// Per-layer timing of training steps (Note [Layer profile]).
#include "ddpv/nn/layer_profile.hpp"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "ddpv/backend/backend.hpp"

namespace ddpv {

void LayerProfile::reset() {
  entries_.clear();
  steps_ = 0;
}

void LayerProfile::add(const std::string& name, const std::string& kind, ProfilePhase phase,
                       double seconds) {
  auto [it, fresh] = entries_.try_emplace(name);
  Entry& e = it->second;
  if (fresh) {
    e.kind = kind;
    e.order = static_cast<int>(entries_.size());
  }
  switch (phase) {
    case ProfilePhase::kForward:
      e.forward += seconds;
      break;
    case ProfilePhase::kBackward:
      e.backward += seconds;
      break;
    case ProfilePhase::kOther:
      e.other += seconds;
      break;
  }
}

std::string LayerProfile::report() const {
  if (steps_ == 0 || entries_.empty()) return "layer profile: no step was timed\n";
  const double per = 1e3 / static_cast<double>(steps_);  // seconds in total -> ms per step
  std::vector<std::pair<std::string, const Entry*>> rows;
  double total = 0;
  std::map<std::string, std::pair<double, double>> kinds;  // kind -> forward, the rest
  for (const auto& [name, e] : entries_) {
    rows.emplace_back(name, &e);
    total += e.forward + e.backward + e.other;
    auto& k = kinds[e.kind];
    k.first += e.forward;
    k.second += e.backward + e.other;
  }
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    const double ta = a.second->forward + a.second->backward + a.second->other;
    const double tb = b.second->forward + b.second->backward + b.second->other;
    return ta != tb ? ta > tb : a.second->order < b.second->order;
  });
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line,
                "layer profile: %ld steps, %.2f ms per step timed (Note [Layer profile])\n", steps_,
                total * per);
  out += line;
  std::snprintf(line, sizeof line, "  %-28s %-26s %9s %9s %9s %7s\n", "name", "kind", "fwd ms",
                "bwd ms", "other ms", "share");
  out += line;
  for (const auto& [name, e] : rows) {
    const double t = e->forward + e->backward + e->other;
    std::snprintf(line, sizeof line, "  %-28s %-26s %9.3f %9.3f %9.3f %6.1f%%\n", name.c_str(),
                  e->kind.c_str(), e->forward * per, e->backward * per, e->other * per,
                  100.0 * t / total);
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-28s %-26s %9s %19s\n", "by kind", "", "fwd ms",
                "bwd + other ms");
  out += line;
  std::vector<std::pair<std::string, std::pair<double, double>>> by(kinds.begin(), kinds.end());
  std::sort(by.begin(), by.end(), [](const auto& a, const auto& b) {
    return a.second.first + a.second.second > b.second.first + b.second.second;
  });
  for (const auto& [kind, t] : by) {
    std::snprintf(line, sizeof line, "  %-28s %-26s %9.3f %19.3f %6.1f%%\n", "", kind.c_str(),
                  t.first * per, t.second * per, 100.0 * (t.first + t.second) / total);
    out += line;
  }
  return out;
}

ProfileScope::ProfileScope(Backend* backend, const std::string& name, const std::string& kind,
                           ProfilePhase phase) {
  LayerProfile* profile = backend ? backend->profile() : nullptr;
  if (profile == nullptr || !profile->enabled()) return;
  backend_ = backend;
  profile_ = profile;
  name_ = &name;
  kind_ = &kind;
  phase_ = phase;
  backend_->synchronize();
  start_ = std::chrono::steady_clock::now();
}

ProfileScope::~ProfileScope() {
  if (backend_ == nullptr) return;
  try {
    backend_->synchronize();
  } catch (...) {  // a failed device: the next operation reports it, not a destructor
    return;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  profile_->add(*name_, *kind_, phase_, s);
}

}  // namespace ddpv
