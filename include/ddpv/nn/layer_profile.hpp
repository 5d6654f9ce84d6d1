// Per-layer timing of training steps (ddpv-train --profile-layers): where a step's time goes,
// layer by layer, on any backend.
#pragma once

#include <chrono>
#include <map>
#include <string>

namespace ddpv {

class Backend;

// Which column of the profile a timed scope adds to: a layer's forward or backward, or one of
// the trainer's own phases.
enum class ProfilePhase { kForward, kBackward, kOther };

// Note [Layer profile]: with profiling on, each leaf layer's forward and backward (and each
// residual block's own additions) is timed between two synchronizations of the backend, so a
// GPU's queued work is charged to the layer that queued it. The synchronizations cost a GPU
// its overlap of launches with compute, and the comm stream its overlap with backward: a
// profiled run is slower than an unprofiled one, and its per-layer times add up to more than
// the unprofiled step. The profile says where the time goes, not how fast the run is.
// A profile is off until enable(); the trainer owns one and hands it to its backend
// (Backend::set_profile), where every ProfileScope of that backend's layers finds it.
class LayerProfile {
 public:
  void enable(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  void reset();  // forget what was timed
  void add_step() { ++steps_; }

  // What `name` (a layer's name, or a phase such as "loss") of kind `kind` ("conv 3x3/1",
  // "batchnorm", ...) took in `phase`.
  void add(const std::string& name, const std::string& kind, ProfilePhase phase, double seconds);

  // A table, per step: every entry by forward + backward time, then the totals per kind.
  std::string report() const;

 private:
  struct Entry {
    std::string kind;
    int order = 0;  // first-seen order: ties in the table keep it
    double forward = 0, backward = 0, other = 0;
  };
  bool enabled_ = false;
  long steps_ = 0;
  std::map<std::string, Entry> entries_;
};

// Times a scope into the backend's profile when it has one and it is enabled (nothing
// otherwise): synchronizes the backend at both ends (Note [Layer profile]).
class ProfileScope {
 public:
  ProfileScope(Backend* backend, const std::string& name, const std::string& kind,
               ProfilePhase phase);
  ~ProfileScope();
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  Backend* backend_ = nullptr;  // null: profiling is off
  LayerProfile* profile_ = nullptr;
  const std::string* name_ = nullptr;
  const std::string* kind_ = nullptr;
  ProfilePhase phase_ = ProfilePhase::kOther;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace ddpv
