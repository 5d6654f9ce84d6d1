// Trainer: the training loop of ddpv-train — data, forward, loss, backward with bucketed
// gradient allreduce, the fused optimizer step, evaluation, checkpoints and metrics.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddpv/train/options.hpp"

namespace ddpv {

class World;

// Note [Rank times]: in synchronous data parallelism every rank waits at each step's gradient
// exchange for the slowest, so one slow rank (a busy or throttled node, a core shared with
// another job) sets the pace of the whole job, and the others' time shows up as waiting. Each
// rank times the part of its training loop it spent waiting for its peers' gradients (the
// allreduce's wait, or the shared update's barriers and claims) and for its loader; the rest
// is its own work ("busy"). At the end of each epoch and of the run the ranks pool these, and
// rank 0 reports the spread and the busiest rank with its host: the straggler, when there is
// one. CPU backend only: on a GPU the host's timers see launches, and the device's work lands
// in the waits.
struct RankTimes {
  double busy_s = 0;       // time in the training loop not spent waiting for peers or data
  double comm_wait_s = 0;  // waiting for the other ranks' gradients
  double data_wait_s = 0;  // waiting for the loader
};

// Where the ranks' busy times lie: the least, the median, the most, and which rank had the
// most (the lowest such rank); above_others is how much longer it was busy than the median of
// the other ranks, as a share of that median (0 for one rank, or when that median is 0).
struct RankSpread {
  double min_s = 0, median_s = 0, max_s = 0;
  int busiest = 0;
  double above_others = 0;
};
RankSpread rank_spread(const std::vector<RankTimes>& ranks);
// Whether the busiest rank held the others back over a stretch of `steps` steps: busy at least
// 10% longer than the others' median, over at least 50 steps.
bool is_straggler(const RankSpread& spread, int64_t steps);

// What the ranks' timers say over a stretch of training: a run, or an epoch of it.
struct RankReport {
  std::vector<RankTimes> by_rank;  // empty on the CUDA backend
  RankSpread spread;               // rank_spread(by_rank)
  std::string busiest_host;        // the host of spread.busiest
  bool straggler = false;          // the busiest rank held the others back
  // --balance (Note [Balanced batches]): the split of the global batch by rank at the end, and
  // how many times it changed; empty and 0 without.
  std::vector<int64_t> batch_split;
  int split_changes = 0;
  // --balance: each rank's speed as the balancer last saw it (samples per busy second, the
  // newest window weighing half); empty before its first decision and with a fixed split.
  std::vector<double> rank_speed;
};
// "rank 1 on node17 was busy 33% longer than the other ranks' median, and every step they
// waited for it": the straggler warning's text, for the epoch's and the run's.
std::string straggler_text(const RankReport& ranks);

struct TrainSummary {
  int64_t steps = 0;          // optimizer steps since the start of training (resumes included)
  int64_t epochs = 0;         // epochs completed
  double images_per_s = 0;    // global training throughput of this run
  double train_loss = 0;      // mean over the last epoch (or the part of it this run saw)
  double train_acc = 0;
  double val_loss = 0, val_acc = 0;  // of the last evaluation (NaN when none)
  double val_top5 = 0;               // --eval-only: the top-5 accuracy
  std::string val_split;             // the split evaluated ("" when none)
  int64_t val_images = 0;            // --eval-only: the images evaluated
  double elapsed_s = 0;       // wall time of this run
  double comm_wait_s = 0;     // waiting for gradient allreduces (rank 0)
  double data_wait_s = 0;     // waiting for the loader (rank 0)
  int world_size = 1;
  int64_t global_batch = 0;
  bool stopped_by_signal = false;
  int stop_signal = 0;
  std::string last_checkpoint;  // "" when none was written
  RankReport ranks;             // over this run (Note [Rank times])
};

// Thrown on every rank at once when the loss becomes NaN or Inf (the ranks agree on it in the
// step's allreduce), so ddpv-train ends all ranks together with one message and exit code 1.
class TrainingDiverged : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Thrown on every rank at once when a run cannot start as asked: its resume was refused (the
// checkpoint is damaged or another model's, none in the directory verifies, or the options
// differ from the checkpoint's run; Note [Resume checks]). ddpv-train prints the message once
// and exits with exit_code(): 2 for options that differ, 1 otherwise.
class StartRefused : public std::runtime_error {
 public:
  StartRefused(const std::string& what, int exit_code)
      : std::runtime_error(what), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

class Trainer {
 public:
  // Builds the backend, the model, the communicator and the data sources; validates the store;
  // resumes from a checkpoint when asked. Throws ddpv::Error naming what is wrong.
  Trainer(const TrainOptions& options, World& world);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  TrainSummary run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddpv
