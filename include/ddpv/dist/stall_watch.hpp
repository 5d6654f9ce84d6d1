// StallWatch: ends a job whose ranks stopped meeting, with one line naming the ranks that did
// not arrive, and makes sure one fault ends the job through one rank (Note [Stall watchdog] and
// Note [One abort] in src/dist/stall_watch.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddpv {

class World;

// What a rank is doing, as the watchdog's line names it.
enum class Phase : int8_t {
  kStartup,     // setting up: data, model, communicators, resume
  kData,        // waiting for its next batch from the loader
  kCompute,     // forward and backward
  kGradients,   // exchanging gradients (allreduce or shared update)
  kAgreement,   // the step's agreement (loss, stop request)
  kBalance,     // the batch balancer's figures
  kEvaluation,  // evaluating the validation split
  kCheckpoint,  // writing a checkpoint (rank 0) or waiting for it
  kReport,      // pooling the ranks' times at an epoch's end
  kFinish,      // the end of the run
};
const char* phase_name(Phase phase);

// A rank's account of itself, as it answers the watchdog of another rank.
struct RankStatus {
  int64_t seq = 0;   // sync points entered so far: equal on ranks waiting at the same one
  int64_t step = 0;  // the training step it is in
  Phase phase = Phase::kStartup;
  bool waiting = false;  // inside a sync point, waiting for other ranks
  double seconds = 0;    // in that wait, or else in that phase, so far
};

// Note [Stall verdict]: what the ranks answered (nullopt: no answer within the grace period),
// judged the same way by every rank that asks, so that they agree without talking again on who
// reports: the lowest rank among those waiting at the newest sync point.
struct StallVerdict {
  int reporter = 0;
  std::string line;  // "stall: no progress for 30 s (--comm-timeout) in the step agreement..."
};
StallVerdict judge_stall(const std::vector<std::optional<RankStatus>>& answers,
                         const std::vector<std::string>& hosts, double timeout_s);

class StallWatch {
 public:
  // The exit code of a job the watchdog ended: a transient fault (sysexits' EX_TEMPFAIL), after
  // which a resubmission with --resume auto may well succeed.
  static constexpr int kExitCode = 75;

  StallWatch();  // idle: counts sync points, ends the job by plain MPI_Abort
  ~StallWatch();
  StallWatch(const StallWatch&) = delete;
  StallWatch& operator=(const StallWatch&) = delete;

  // Collective over `world`: starts the watchdog thread and its side channel (a duplicate of
  // the world communicator), after which a sync point that lasts more than timeout_s seconds
  // ends the job. `program` starts every line it prints. Without MPI_THREAD_MULTIPLE the thread
  // cannot ask other ranks, and ends the job naming none of them.
  void start(const World& world, const std::string& program, double timeout_s);
  // Stops the thread and frees the side channel; collective, at the end of a run. Safe to call
  // when never started.
  void stop();
  bool active() const;

  // The main thread's state, read by the watchdog (a few relaxed stores each).
  void set_step(int64_t step);
  void set_phase(Phase phase);
  // A sync point: the calling (main) thread waits for other ranks between the two calls. Every
  // rank passes the same sync points in the same order, which is what lets the watchdog tell
  // who is missing (RankStatus::seq).
  void begin_wait();
  void end_wait();
  RankStatus status() const;

  // Ends the job after a fault on this rank: one line "<program>: rank R on HOST: <what>" and
  // MPI_Abort(code), unless another rank is already ending it for the same fault (Note [One
  // abort]). Callable from any thread.
  [[noreturn]] void abort(const std::string& program, const std::string& what, int code);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// begin_wait / end_wait for a scope; a null watch is allowed (tools, tests).
class WaitScope {
 public:
  explicit WaitScope(StallWatch* watch) : watch_(watch) {
    if (watch_ != nullptr) watch_->begin_wait();
  }
  ~WaitScope() {
    if (watch_ != nullptr) watch_->end_wait();
  }
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;

 private:
  StallWatch* watch_;
};

}  // namespace ddpv
