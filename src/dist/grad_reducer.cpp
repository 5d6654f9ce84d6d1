// GradReducer: pending counts per bucket, launches in plan order (Note [Bucket order]).
#include "ddpv/dist/grad_reducer.hpp"

#include "ddpv/backend/backend.hpp"
#include "ddpv/core/error.hpp"
#include "ddpv/core/log.hpp"

namespace ddpv {

GradReducer::GradReducer(BucketPlan plan, Communicator& comm, float* grad_arena,
                         GradReducerOptions options)
    : plan_(std::move(plan)), comm_(comm), grad_(grad_arena), options_(options) {
  DDPV_CHECK(grad_ != nullptr || plan_.total_count() == 0, "GradReducer needs a gradient arena");
  DDPV_CHECK(options_.reduce_type == CommType::kF32 || options_.reduce_type == CommType::kBF16,
             "gradients are reduced in f32 or bf16, not in a type of ",
             comm_type_size(options_.reduce_type), " bytes");
  if (options_.reduce_type == CommType::kBF16) {
    DDPV_CHECK(options_.backend != nullptr, "a bf16 gradient reduction needs the backend");
    reduced_ =
        Tensor::empty(Shape{plan_.total_count()}, DType::kBF16, options_.backend->allocator());
  }
  reset();
}

GradReducer::~GradReducer() {
  // Launched buckets write into the arena: let them finish before anyone frees it.
  for (auto& w : work_) {
    try {
      if (w) w->wait();
    } catch (const std::exception& e) {
      DDPV_WARN("gradient allreduce failed during shutdown: ", e.what());
    }
  }
}

void GradReducer::reset() {
  pending_.resize(plan_.buckets().size());
  for (size_t b = 0; b < pending_.size(); ++b)
    pending_[b] = static_cast<int>(plan_.buckets()[b].params.size());
  param_ready_.assign(static_cast<size_t>(plan_.num_params()), 0);
  next_launch_ = 0;
  in_backward_ = false;
  work_.clear();
}

void GradReducer::set_sync(bool sync) {
  DDPV_CHECK(!in_backward_,
             "GradReducer::set_sync called during a backward pass; call it "
             "before Model::backward");
  sync_ = sync;
}

GradReadyFn GradReducer::ready_fn() {
  if (!sync_) return {};
  return [this](int index) { mark_ready(index); };
}

void GradReducer::mark_ready(int param_index) {
  if (!sync_) return;
  const int b = plan_.bucket_of(param_index);  // checks the range
  char& seen = param_ready_[static_cast<size_t>(param_index)];
  DDPV_CHECK(!seen, "gradient of parameter ", param_index, " reported twice in one backward");
  seen = 1;
  in_backward_ = true;
  --pending_[static_cast<size_t>(b)];
  if (options_.overlap) {
    launch_ready_buckets();
    comm_.progress();
  }
}

// Note [The last bucket blocks]: the last bucket in plan order holds the first layers'
// gradients, which backward finishes last, so nothing is left for it to overlap with. wait()
// reduces it with the communicator's blocking allreduce once the launched buckets are done.
// With MPI that is Open MPI's tuned MPI_Allreduce, faster than libnbc's MPI_Iallreduce +
// MPI_Wait for lenet's 1.7 MiB on 2 ranks with cold buffers, and measurably faster for 2-rank
// lenet, whose gradients are all one bucket (docs/performance.md, "Distributed"). A blocking
// NCCL allreduce is its launch + wait, as before.
void GradReducer::launch_ready_buckets() {
  while (next_launch_ < plan_.size() - 1 && pending_[static_cast<size_t>(next_launch_)] == 0) {
    launch(next_launch_, /*blocking=*/false);
  }
}

void GradReducer::launch(int bucket, bool blocking) {
  const Bucket& bk = plan_.buckets()[static_cast<size_t>(bucket)];
  next_launch_ = bucket + 1;
  void* data = grad_ + bk.offset;
  CommType type = CommType::kF32;
  if (options_.reduce_type == CommType::kBF16) {  // Note [bf16 reduction]
    uint16_t* half = static_cast<uint16_t*>(reduced_.raw()) + bk.offset;
    options_.backend->cast_to_bf16(bk.count, grad_ + bk.offset, half);
    data = half;
    type = CommType::kBF16;
  }
  if (blocking) {
    comm_.allreduce(data, bk.count, type, ReduceOp::kSum);  // Note [Folded averaging]
  } else {
    work_.push_back(comm_.allreduce_async(data, bk.count, type, ReduceOp::kSum));
  }
}

void GradReducer::wait() {
  if (!sync_) return;
  // With overlap every bucket but the last normally went out during backward. Buckets still
  // pending here hold tensors backward never reported (a layer without gradient-ready calls, or
  // overlap off): backward has returned, so their gradients are final and go out now, in plan
  // order, and the last one blocks (Note [The last bucket blocks]).
  const int last = plan_.size() - 1;
  while (next_launch_ < last) launch(next_launch_, /*blocking=*/false);
  std::exception_ptr failure;
  for (auto& w : work_) {
    try {
      w->wait();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  // After a failure this rank skips the last collective and rethrows; the error reaches the
  // top-level catch, whose abort_job ends every rank, so no peer waits on it for long.
  if (!failure && next_launch_ == last) {
    try {
      launch(last, /*blocking=*/true);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  reset();
  if (failure) std::rethrow_exception(failure);
  if (options_.reduce_type == CommType::kBF16) {
    const auto* sums = static_cast<const uint16_t*>(reduced_.raw());
    options_.backend->cast_from_bf16(plan_.total_count(), sums, grad_);
  }
}

}  // namespace ddpv
