// Private: what a resumed run must continue unchanged, and the words for what differs
// (Note [Resume checks]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ddpv/train/checkpoint.hpp"
#include "ddpv/train/schedule.hpp"

namespace ddpv {

// The run a checkpoint continues into, from the new options.
struct RunPlan {
  int64_t world_size = 1, batch_size = 0, accum_steps = 1;
  double lr = 0;
  LrShape lr_schedule = LrShape::kCosine;
  double warmup_epochs = 0;
  int64_t schedule_steps = 0;   // the learning-rate schedule's total length in steps
  int64_t steps_per_epoch = 0;  // optimizer steps (for a format 1 checkpoint's schedule length)
  int64_t global_batch() const { return world_size * batch_size * accum_steps; }
};

// Note [Resume checks]: a resume continues the optimisation only when the global batch
// (ranks x --batch-size x --accum-steps), --accum-steps, --lr, --lr-schedule, --warmup-epochs
// and, for a schedule that is not constant, its length in steps (--epochs, --max-steps) are the
// checkpoint's: otherwise the learning rate jumps mid-run and samples are counted in other
// batches. The number of ranks may change with the global batch kept (2 x 16 -> 4 x 8): the
// sampler's order and the augmentation depend on the global batch only, so the run continues
// at the same sample. Returns one "old -> new" phrase per difference ("--lr 0.05 -> 0.1"), in
// that order; empty when the run continues as it was. A format 1 checkpoint, which lacks the
// attributes, is compared through its `options` text.
std::vector<std::string> resume_differences(const CheckpointMeta& old, const RunPlan& now);

// "ranks x --batch-size B[ x --accum-steps A]" of a plan or a checkpoint, for messages.
std::string batch_text(int64_t world_size, int64_t batch_size, int64_t accum_steps);

}  // namespace ddpv
