// Trainer::Impl: the state of a training run, shared by trainer.cpp (set-up and the step loop)
// and trainer_state.cpp (evaluation, checkpoints, resume, reporting).
#pragma once

#include <memory>
#include <optional>

#include "ddpv/backend/backend.hpp"
#include "ddpv/core/clock.hpp"
#include "ddpv/data/image_store.hpp"
#include "ddpv/dist/communicator.hpp"
#include "ddpv/dist/shared_update.hpp"
#include "ddpv/dist/world.hpp"
#include "ddpv/nn/layer_profile.hpp"
#include "ddpv/nn/model.hpp"
#include "ddpv/train/checkpoint.hpp"
#include "ddpv/train/metrics.hpp"
#include "ddpv/train/schedule.hpp"
#include "ddpv/train/trainer.hpp"
#include "train/balancer.hpp"
#include "train/batch_source.hpp"
#include "train/console.hpp"
#include "train/device_feed.hpp"
#include "train/gradient_path.hpp"

namespace ddpv {

// Sums over all ranks of one stretch of training steps.
struct StepTotals {
  double loss_sum = 0, correct = 0, samples = 0;
  void add(double l, double c, double n) {
    loss_sum += l;
    correct += c;
    samples += n;
  }
  double loss() const { return samples > 0 ? loss_sum / samples : 0; }
  double acc() const { return samples > 0 ? correct / samples : 0; }
};

// Where the run is: what a checkpoint records and a resume restores.
struct Position {
  int64_t epoch = 0;       // the current epoch (epochs completed before it)
  int64_t epoch_step = 0;  // optimizer steps done in the current epoch
  int64_t step = 0;        // optimizer steps since the start of training
  int64_t steps_per_epoch = 0;
  int64_t run_start_step = 0;  // the step this run (process) began at: 0, or a resume's
};

// Where the batches come from, and the shape of what they hold.
struct DataPath {
  std::unique_ptr<ImageStore> store;  // null with --synthetic
  SourceShape shape;
  std::unique_ptr<BatchSource> train_source, val_source;
  std::string val_split;  // the split evaluated (--val-split resolved); "" for none
  // Batches on the device (Note [Two slots]); the upload streams are null on CPU.
  std::unique_ptr<UploadStream> train_uploads, val_uploads;
  std::unique_ptr<DeviceFeed> train_feed, val_feed;
};

// What this run has measured: the summary's throughput (Note [Steady throughput]) and this
// rank's figures in the rank report (Note [Rank times]).
struct Timing {
  Clock::time_point run_start;
  double train_seconds = 0, data_wait = 0, comm_wait = 0;
  // Note [Injected busy time]: this rank's seconds per image from --test-busy-per-image, and
  // what they have added to its busy time so far.
  double busy_per_image = 0, injected_busy = 0;
  double warm_images = -1, paused = 0, paused_at_warm = 0, paused_at_end = 0;
  Clock::time_point warm_start, train_end;
  double images = 0;  // global samples trained on in this run
  Clock::time_point log_start;
};

struct Trainer::Impl {
  Impl(const TrainOptions& options, World& world);

  // set-up (trainer.cpp)
  void open_data();
  void make_feeds();
  void build_model();
  void connect();      // the communicator; every rank takes rank 0's model and position
  void make_update();  // the gradient path: the shared update or the reducer
  // the loop (trainer.cpp)
  TrainSummary run();
  void train_step();
  bool micro_batch(int k, StepTotals& mine);  // false: the loss was not finite
  double update();                            // returns the step's learning rate
  void agree(bool finite, const StepTotals& mine, double lr);
  [[noreturn]] void throw_diverged(const std::string& what) const;  // on every rank at once
  int64_t global_batch() const { return o.batch_size * world.size() * o.accum_steps; }
  // checkpoints and resume (trainer_checkpoint.cpp)
  std::string save(const char* why);
  void resume();  // on every rank: rank 0 loads, all hear its verdict (Note [Resume verdict])
  void resume_on_root();
  CheckpointMeta run_meta() const;  // what a checkpoint of this run records
  // evaluation, reporting (trainer_state.cpp)
  // The loss, top-1 and top-5 accuracy over the whole evaluation split (top-5: the label among
  // the five largest logits; 1 when there are at most five classes).
  void evaluate(double* loss, double* acc, double* top5 = nullptr);
  TrainSummary evaluate_only();  // --eval-only
  void log_step(double lr, double step_loss, double step_acc);
  void log_epoch(double val_loss, double val_acc, const RankReport& ranks);
  TrainSummary finish();
  // Note [Rank times]: this rank's figures so far, and all ranks' since `mark`, over `steps`
  // steps (a collective; an empty report on the CUDA backend, where nothing is pooled).
  RankTimes my_times() const;
  RankReport pool_rank_times(const RankTimes& mark, int64_t steps) const;

  TrainOptions o;
  World& world;
  LayerProfile profile;  // --profile-layers: the backend's (Note [Layer profile]); outlives it
  std::unique_ptr<Backend> backend;
  DataPath data;
  // Note [Shared update]; null where it does not apply. Declared before the model, whose arenas
  // it may hold, so that it outlives it.
  std::unique_ptr<SharedUpdate> shared;
  std::unique_ptr<Model> model;
  std::unique_ptr<Communicator> comm;
  // Note [One gradient path]; after the communicator and the model, which a reducer uses.
  std::unique_ptr<GradientPath> gradients;
  std::unique_ptr<SoftmaxCrossEntropyOp> loss_op;
  std::vector<ParamSpan> spans;
  SgdConfig sgd;
  std::optional<LrSchedule> schedule;
  Tensor dlogits;
  // Note [Balanced batches]: with --balance or --batch-split on more than one rank (balanced());
  // it decides only under --balance. The busy seconds and samples of this rank since the
  // balancer's last decision.
  std::optional<BatchBalancer> balancer;
  double balance_busy = 0, balance_samples = 0;
  void balance_step();

  Position pos;
  bool stop = false;
  int stop_signal = 0;

  Timing timing;
  // Note [Steady throughput]: the first steps of a run build oneDNN primitives and touch fresh
  // memory, so the summary's images_per_s counts from the end of step kWarmupSteps of the run
  // (when the run has at least 2 * kWarmupSteps steps), less evaluation and checkpoint pauses;
  // images_per_s_all keeps the whole run.
  static constexpr int64_t kWarmupSteps = 5;
  static constexpr double kNoTimeout = 1e9;  // --comm-timeout 0: seconds that never come
  StepTotals epoch_totals, log_totals;
  double last_val_loss, last_val_acc;
  std::string last_checkpoint;
  int64_t last_checkpoint_step = -1;
  VerifiedFiles verified_files;  // rank 0: checkpoints checked in this run (Note [Pruning])

  MetricsWriter metrics;
  ProgressBar bar;
};

}  // namespace ddpv
