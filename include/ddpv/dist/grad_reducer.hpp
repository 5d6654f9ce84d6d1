// GradReducer: allreduces the gradient arena bucket by bucket as backward finishes them, so
// communication overlaps the rest of backward.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ddpv/dist/bucket_plan.hpp"
#include "ddpv/dist/communicator.hpp"
#include "ddpv/nn/model.hpp"

namespace ddpv {

struct GradReducerOptions {
  // Launch each bucket as soon as it is ready during backward; false (--no-overlap) launches
  // all buckets after backward, in wait().
  bool overlap = true;
  // The type gradients travel in: kF32, or kBF16 (--reduce-dtype bf16, Note [bf16 reduction]),
  // which needs `backend` for the casts and the bf16 copy of the arena.
  CommType reduce_type = CommType::kF32;
  Backend* backend = nullptr;
};

// Use per step (see Note [Folded averaging] for the scale):
//   reducer.set_sync(micro_step == accum_steps - 1);
//   model.backward(dlogits, accumulate, reducer.ready_fn());
//   reducer.wait();
//   sgd.grad_scale = reducer.grad_scale() / accum_steps;  backend.sgd_update(...)
//
// Note [Bucket order]: a bucket whose pending count reaches zero is launched only after every
// bucket before it in the plan, so all ranks issue the same collectives in the same order even
// when their backward passes report tensors in different orders. A collective launched out of
// order on one rank would pair with a different bucket on another: a hang or wrong sums.
//
// Note [bf16 reduction]: with reduce_type kBF16 a ready bucket is rounded to bf16 into the
// reducer's own copy of the arena and that copy is summed, halving the bytes on the wire; wait()
// turns the sums back into f32 in the gradient arena, so the optimizer is unchanged. The cost
// is precision: bf16 keeps 8 significant bits, so each gradient is rounded once (relative
// error <= 2^-8) and each of the P - 1 additions of a world of P ranks rounds again; the sum
// is within P * 2^-8 of the sum of the gradients' magnitudes. That is what mixed-precision
// training tolerates; fp32 stays the default.
//
// Note [Folded averaging]: buckets are summed, not averaged; the 1/world_size factor is folded
// into the optimizer's grad_scale, which costs nothing there, whereas averaging would cost an
// extra pass over the arena with MPI (NCCL's ncclAvg is free, but one rule for both keeps the
// trainer simple and the results identical).
class GradReducer {
 public:
  // grad_arena: the model's gradient arena (plan.total_count() floats on comm's device); it
  // must outlive the reducer.
  GradReducer(BucketPlan plan, Communicator& comm, float* grad_arena,
              GradReducerOptions options = {});
  ~GradReducer();  // waits for launched buckets; never throws
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Whether the coming backward communicates. With gradient accumulation over K micro-batches
  // only the last one does: set_sync(false) before the others, and their mark_ready and wait
  // do nothing. Changing it in the middle of a backward throws.
  void set_sync(bool sync);
  bool sync() const { return sync_; }

  // Called by Model::backward when the gradient of params()[param_index] is final.
  void mark_ready(int param_index);
  // The callback for Model::backward: forwards to mark_ready (empty when nothing is needed).
  GradReadyFn ready_fn();
  // Returns when every bucket is reduced (launching any not yet launched, e.g. with
  // overlap off, and reducing the last one in place: Note [The last bucket blocks]), then readies
  // the reducer for the next backward. Rethrows a failed collective.
  void wait();

  // Multiply reduced gradients by this to get the average (Note [Folded averaging]).
  float grad_scale() const { return 1.0f / static_cast<float>(comm_.size()); }
  const BucketPlan& plan() const { return plan_; }
  int buckets_launched() const { return next_launch_; }

 private:
  void launch_ready_buckets();
  void launch(int bucket, bool blocking);
  void reset();

  BucketPlan plan_;
  Communicator& comm_;
  float* grad_;
  GradReducerOptions options_;
  bool sync_ = true;
  bool in_backward_ = false;       // a mark_ready arrived since the last wait()
  std::vector<int> pending_;       // per bucket: tensors not yet ready
  std::vector<char> param_ready_;  // per tensor: reported in this backward
  int next_launch_ = 0;            // buckets [0, next_launch_) are launched
  std::vector<std::unique_ptr<CommWork>> work_;
  Tensor reduced_;  // the bf16 copy of the arena (Note [bf16 reduction]); empty for f32
};

// Start of training: every rank takes rank 0's parameters and buffers, so all start equal even
// without a shared seed.
void broadcast_parameters(Model& model, Communicator& comm, int root = 0);
// Averages BatchNorm running statistics over ranks (before evaluation and checkpoints).
// num_batches_tracked is the same on every rank, and averaging leaves it exact.
void average_buffers(Model& model, Communicator& comm);
// A 64-bit hash of the parameter and buffer arenas' bytes (copied to the host), for checking
// that ranks hold bit-identical models.
uint64_t model_hash(Model& model);
uint64_t hash_bytes(const void* data, size_t bytes, uint64_t seed = 0);

}  // namespace ddpv
