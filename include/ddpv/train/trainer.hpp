// Trainer: the training loop of ddpv-train — data, forward, loss, backward with bucketed
// gradient allreduce, the fused optimizer step, evaluation, checkpoints and metrics.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "ddpv/train/options.hpp"

namespace ddpv {

class World;

struct TrainSummary {
  int64_t steps = 0;          // optimizer steps since the start of training (resumes included)
  int64_t epochs = 0;         // epochs completed
  double images_per_s = 0;    // global training throughput of this run
  double train_loss = 0;      // mean over the last epoch (or the part of it this run saw)
  double train_acc = 0;
  double val_loss = 0, val_acc = 0;  // of the last evaluation (NaN when none)
  double elapsed_s = 0;       // wall time of this run
  double comm_wait_s = 0;     // waiting for gradient allreduces (rank 0)
  double data_wait_s = 0;     // waiting for the loader (rank 0)
  int world_size = 1;
  int64_t global_batch = 0;
  bool stopped_by_signal = false;
  int stop_signal = 0;
  std::string last_checkpoint;  // "" when none was written
};

// Thrown on every rank at once when the loss becomes NaN or Inf (the ranks agree on it in the
// step's allreduce), so ddpv-train ends all ranks together with one message and exit code 1.
class TrainingDiverged : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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
