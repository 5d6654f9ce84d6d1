// MpiCommunicator: the CPU backend's collectives, issued by a communication thread (or as
// non-blocking MPI calls) on a private duplicate of the world communicator.
#include <array>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "ddpv/core/dtype.hpp"
#include "ddpv/core/log.hpp"
#include "ddpv/dist/communicator.hpp"
#include "ddpv/dist/stall_watch.hpp"
#include "dist/mpi_check.hpp"
#include "dist/mpi_wait.hpp"

namespace ddpv {
namespace {

MPI_Datatype mpi_type(CommType t) {
  switch (t) {
    case CommType::kF32:
      return MPI_FLOAT;
    case CommType::kF64:
      return MPI_DOUBLE;
    case CommType::kI32:
      return MPI_INT32_T;
    case CommType::kI64:
      return MPI_INT64_T;
    case CommType::kBF16:
      return MPI_UINT16_T;  // Note [bf16 over MPI]
  }
  return MPI_DATATYPE_NULL;
}

// Note [bf16 over MPI]: MPI has no bf16 type, so bf16 buffers travel as MPI_UINT16_T with our
// own reduction operators. Each adds (or compares) in f32 and rounds the result to nearest
// even, as NCCL does for ncclBfloat16. Both are commutative, and IEEE addition is too, so every
// rank ends with the same bits whatever the reduction tree.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

void bf16_max(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    if (bf16_to_f32(a[i]) > bf16_to_f32(b[i])) b[i] = a[i];
  }
}

// The two operators are made once per process, on first use (after MPI_Init, since a
// communicator exists), and live until MPI_Finalize frees them.
MPI_Op mpi_bf16_op(ReduceOp op) {
  static const std::array<MPI_Op, 2> ops = [] {
    std::array<MPI_Op, 2> made{MPI_OP_NULL, MPI_OP_NULL};
    DDPV_MPI_CHECK(MPI_Op_create(&bf16_sum, /*commute=*/1, &made[0]));
    DDPV_MPI_CHECK(MPI_Op_create(&bf16_max, /*commute=*/1, &made[1]));
    return made;
  }();
  return op == ReduceOp::kMax ? ops[1] : ops[0];
}

MPI_Op mpi_op(ReduceOp op, CommType type) {
  if (type == CommType::kBF16) return mpi_bf16_op(op);
  return op == ReduceOp::kMax ? MPI_MAX : MPI_SUM;
}

int checked_count(int64_t count) {
  DDPV_CHECK(count >= 0 && count <= INT32_MAX, "collective of ", count,
             " elements: more than one MPI call can carry");
  return static_cast<int>(count);
}

void check_op(CommType type, ReduceOp op) {
  DDPV_CHECK(op != ReduceOp::kAvg || type == CommType::kF32 || type == CommType::kF64 ||
                 type == CommType::kBF16,
             "allreduce average is defined for floating types only");
}

// MPI has no average: sum, then divide. Dividing (not multiplying by 1/size) keeps an average
// of equal values exact, e.g. num_batches_tracked in average_buffers.
void divide(void* data, int64_t count, CommType type, int size) {
  if (type == CommType::kBF16) {
    uint16_t* p = static_cast<uint16_t*>(data);
    const float d = static_cast<float>(size);
    for (int64_t i = 0; i < count; ++i) p[i] = f32_to_bf16(bf16_to_f32(p[i]) / d);
  } else if (type == CommType::kF32) {
    float* p = static_cast<float*>(data);
    const float d = static_cast<float>(size);
    for (int64_t i = 0; i < count; ++i) p[i] /= d;
  } else {
    double* p = static_cast<double*>(data);
    for (int64_t i = 0; i < count; ++i) p[i] /= size;
  }
}

void run_allreduce(MPI_Comm comm, int size, void* data, int64_t count, CommType type, ReduceOp op) {
  DDPV_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, checked_count(count), mpi_type(type),
                               mpi_op(op, type), comm));
  if (op == ReduceOp::kAvg) divide(data, count, type, size);
}

// Note [Communication thread]: two ways to overlap MPI collectives with backward on CPU.
//  - kThread: a thread issues blocking collectives from a FIFO, so a collective advances while
//    the main thread computes. Collectives stay in launch order (one FIFO, one issuing thread)
//    on their own communicator, so they never interleave with the main thread's MPI calls
//    (this needs MPI_THREAD_MULTIPLE, Note [MPI thread level]). Blocking calls wait for the
//    FIFO to drain and then run on the caller's thread, saving the hand-off.
//  - kNonBlocking: MPI_Iallreduce from the caller. With Open MPI a non-blocking collective
//    advances only inside MPI calls, so the reducer calls progress() (an MPI_Test) each time
//    backward reports a tensor.
// Measured (docs/performance.md, "Distributed"): the thread's collectives are Open MPI's tuned
// blocking ones, much faster than libnbc's MPI_Iallreduce from 1 to 64 MiB. But Open MPI
// waits by polling, and on a CPU node whose cores all compute, a communication thread that
// wakes up and polls for a late peer takes cycles from backward: resnet20 steps on 2 ranks
// were equal within noise with two buckets and far slower with one bucket per tensor than
// with non-blocking collectives, whose polling is one MPI_Test per tensor.
// kNonBlocking is therefore the default; kThread is for nodes with a spare core per rank,
// where its faster collectives and real progress pay off.
struct Queue {
  struct Job {
    void* data;
    int64_t count;
    CommType type;
    ReduceOp op;
  };
  MPI_Comm comm = MPI_COMM_NULL;
  int size = 1;
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<Job> jobs;
  uint64_t issued = 0, completed = 0;  // jobs complete in FIFO order
  std::exception_ptr error;            // the first failure; the communicator is unusable after
  bool stop = false;

  void run() {
    for (;;) {
      Job job{};
      {
        std::unique_lock lock(mutex);
        cv.wait(lock, [&] { return stop || !jobs.empty(); });
        if (jobs.empty()) return;
        job = jobs.front();
        jobs.pop_front();
      }
      std::exception_ptr failure;
      try {
        arrive(comm);  // Note [Waiting without spinning]: no spin while ranks are late
        run_allreduce(comm, size, job.data, job.count, job.type, job.op);
      } catch (...) {
        failure = std::current_exception();
      }
      {
        std::lock_guard lock(mutex);
        if (failure && !error) error = failure;
        ++completed;
      }
      cv.notify_all();
    }
  }

  // Waits until job `seq` (1-based) has completed; rethrows the first failure. Both sides
  // sleep on the condition variable rather than spin: ranks share cores on a CPU node, and a
  // spinning thread takes cycles from backward (a spin of 50 us on both sides was tried and
  // made the 1 MiB round trip no faster under load).
  void wait_for(uint64_t seq) {
    std::unique_lock lock(mutex);
    cv.wait(lock, [&] { return completed >= seq; });
    if (error) std::rethrow_exception(error);
  }
};

class ThreadWork final : public CommWork {
 public:
  ThreadWork(std::shared_ptr<Queue> q, uint64_t seq, StallWatch* watch)
      : q_(std::move(q)), seq_(seq), watch_(watch) {}
  ~ThreadWork() override {
    if (waited_) return;
    try {
      q_->wait_for(seq_);
    } catch (const std::exception& e) {
      DDPV_WARN("collective failed and was never waited on: ", e.what());
    }
  }
  void wait() override {
    waited_ = true;
    WaitScope scope(watch_);
    q_->wait_for(seq_);
  }

 private:
  std::shared_ptr<Queue> q_;
  uint64_t seq_;
  StallWatch* watch_;
  bool waited_ = false;
};

// A non-blocking collective; the communicator keeps the request too, to progress it.
class RequestWork final : public CommWork {
 public:
  RequestWork(std::shared_ptr<MPI_Request> req, void* data, int64_t count, CommType type,
              ReduceOp op, int size, StallWatch* watch)
      : req_(std::move(req)),
        data_(data),
        count_(count),
        type_(type),
        op_(op),
        size_(size),
        watch_(watch) {}
  ~RequestWork() override {
    if (!waited_ && *req_ != MPI_REQUEST_NULL) MPI_Wait(req_.get(), MPI_STATUS_IGNORE);
  }
  void wait() override {
    if (waited_) return;
    waited_ = true;
    WaitScope scope(watch_);
    wait_request(req_.get(), "MPI_Iallreduce");  // Note [Waiting without spinning]
    if (op_ == ReduceOp::kAvg) divide(data_, count_, type_, size_);
  }

 private:
  std::shared_ptr<MPI_Request> req_;
  void* data_;
  int64_t count_;
  CommType type_;
  ReduceOp op_;
  int size_;
  StallWatch* watch_;
  bool waited_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(const World& world, MpiProgress progress)
      : q_(std::make_shared<Queue>()), progress_(progress), watch_(world.stall_watch()) {
    DDPV_MPI_CHECK(MPI_Comm_dup(mpi_world_comm(world), &q_->comm));
    DDPV_MPI_CHECK(MPI_Comm_set_errhandler(q_->comm, MPI_ERRORS_RETURN));
    DDPV_MPI_CHECK(MPI_Comm_rank(q_->comm, &rank_));
    q_->size = world.size();
    if (progress_ == MpiProgress::kThread) {
      worker_ = std::thread([q = q_] { q->run(); });
    }
  }

  ~MpiCommunicator() override {
    bool busy = false;
    {
      std::lock_guard lock(q_->mutex);
      q_->stop = true;
      busy = q_->completed < q_->issued;
    }
    q_->cv.notify_all();
    const bool unwinding = std::uncaught_exceptions() > 0;
    if (worker_.joinable()) {
      // Unwinding with a collective in flight: its peers may never join it, so joining could
      // hang the rank that must report the error. The thread owns the queue through its
      // shared_ptr; abort_job ends the process.
      if (unwinding && busy) {
        worker_.detach();
      } else {
        worker_.join();
      }
    }
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (!finalized && !unwinding && !busy) MPI_Comm_free(&q_->comm);
  }

  int rank() const override { return rank_; }
  int size() const override { return q_->size; }
  Device device() const override { return Device::kCpu; }
  std::string name() const override {
    return progress_ == MpiProgress::kThread ? "mpi (communication thread)"
                                             : "mpi (non-blocking collectives)";
  }

  void broadcast(void* data, size_t bytes, int root) override {
    drain();
    DDPV_CHECK(bytes <= static_cast<size_t>(INT32_MAX), "broadcast of ", bytes,
               " bytes is larger than one MPI message");
    WaitScope scope(watch_);  // the whole collective: a rank may stop in the middle of it
    arrive(q_->comm);         // Note [Waiting without spinning]
    DDPV_MPI_CHECK(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, q_->comm));
  }

  void allreduce(void* data, int64_t count, CommType type, ReduceOp op) override {
    check_op(type, op);
    drain();
    WaitScope scope(watch_);  // the whole collective: a rank may stop in the middle of it
    arrive(q_->comm);         // Note [Waiting without spinning]
    run_allreduce(q_->comm, q_->size, data, count, type, op);
  }

  void barrier() override {
    drain();
    WaitScope scope(watch_);
    arrive(q_->comm);
  }

  std::unique_ptr<CommWork> allreduce_async(void* data, int64_t count, CommType type,
                                            ReduceOp op) override {
    check_op(type, op);
    checked_count(count);
    if (progress_ == MpiProgress::kNonBlocking) {
      auto req = std::make_shared<MPI_Request>(MPI_REQUEST_NULL);
      DDPV_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), mpi_type(type),
                                    mpi_op(op, type), q_->comm, req.get()));
      outstanding_.push_back(req);
      return std::make_unique<RequestWork>(req, data, count, type, op, q_->size, watch_);
    }
    uint64_t seq = 0;
    {
      std::lock_guard lock(q_->mutex);
      if (q_->error) std::rethrow_exception(q_->error);
      q_->jobs.push_back({data, count, type, op});
      seq = ++q_->issued;
    }
    q_->cv.notify_all();
    return std::make_unique<ThreadWork>(q_, seq, watch_);
  }

  // Non-blocking mode: an MPI call, so that launched collectives advance during backward.
  void progress() override {
    if (outstanding_.empty()) return;
    std::erase_if(outstanding_, [](const std::shared_ptr<MPI_Request>& r) {
      if (*r == MPI_REQUEST_NULL) return true;
      int done = 0;
      MPI_Test(r.get(), &done, MPI_STATUS_IGNORE);  // a failure resurfaces in wait()
      return done != 0;
    });
  }

 private:
  // Blocking calls run on the caller's thread once every launched collective has completed,
  // which keeps all collectives of this communicator in program order. In thread mode this is
  // a sync point whether or not anything is left to wait for, so that every rank counts it.
  void drain() {
    if (progress_ != MpiProgress::kThread) {
      outstanding_.clear();  // MPI orders collectives of one communicator by call order
      return;
    }
    uint64_t issued = 0;
    {
      std::lock_guard lock(q_->mutex);
      issued = q_->issued;
    }
    WaitScope scope(watch_);
    q_->wait_for(issued);
  }

  std::shared_ptr<Queue> q_;
  MpiProgress progress_;
  StallWatch* watch_;  // Note [Stall watchdog]; null in tools without one
  int rank_ = 0;
  std::thread worker_;
  std::vector<std::shared_ptr<MPI_Request>> outstanding_;  // kNonBlocking only
};

}  // namespace

std::span<const ChoiceWord<MpiProgress>> choices(MpiProgress) {
  static constexpr ChoiceWord<MpiProgress> kWords[] = {{"nonblocking", MpiProgress::kNonBlocking},
                                                       {"thread", MpiProgress::kThread}};
  return kWords;
}

std::unique_ptr<Communicator> make_mpi_communicator(const World& world, MpiProgress progress) {
  if (progress == MpiProgress::kThread && !world.thread_multiple()) {
    DDPV_WARN(
        "MPI grants no MPI_THREAD_MULTIPLE: using non-blocking collectives instead of a "
        "communication thread");
    progress = MpiProgress::kNonBlocking;  // Note [MPI thread level]
  }
  return std::make_unique<MpiCommunicator>(world, progress);
}

}  // namespace ddpv
