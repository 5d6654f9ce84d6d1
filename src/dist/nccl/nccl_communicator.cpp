// The NCCL communicator: collectives on GPU buffers, launched on a communication stream that is
// ordered after the backend's compute stream by events, with a watchdog for stuck collectives.
#include <errno.h>  // program_invocation_short_name

#include <atomic>
#include <memory>
#include <string>

#include "ddpv/backend/backend.hpp"
#include "ddpv/core/log.hpp"
#include "ddpv/dist/communicator.hpp"
#include "ddpv/dist/stall_watch.hpp"
#include "ddpv/dist/world.hpp"
#include "dist/communicator_factory.hpp"
#include "dist/nccl/collective_watchdog.hpp"
#include "dist/nccl/nccl_check.hpp"

namespace ddpv {
namespace {

constexpr double kDefaultTimeoutS = 600;  // --comm-timeout's default

// A CUDA event (timing disabled), destroyed with the object.
class CudaEvent {
 public:
  CudaEvent() { DDPV_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~CudaEvent() {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

ncclDataType_t nccl_type(CommType t) {
  switch (t) {
    case CommType::kF32:
      return ncclFloat32;
    case CommType::kF64:
      return ncclFloat64;
    case CommType::kI32:
      return ncclInt32;
    case CommType::kI64:
      return ncclInt64;
    case CommType::kBF16:
      return ncclBfloat16;
  }
  DDPV_FAIL("unknown CommType");
}

ncclRedOp_t nccl_op(ReduceOp op, CommType t) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kAvg:
      DDPV_CHECK(t == CommType::kF32 || t == CommType::kF64 || t == CommType::kBF16,
                 "allreduce: average is for floating types only");
      return ncclAvg;
  }
  DDPV_FAIL("unknown ReduceOp");
}

// A launched collective: wait() makes the compute stream wait for its completion event, so
// the host does not block (Note [Stream-ordered collectives]).
class NcclWork final : public CommWork {
 public:
  NcclWork(cudaStream_t compute, std::shared_ptr<CudaEvent> done, ncclComm_t comm)
      : compute_(compute), done_(std::move(done)), comm_(comm) {}
  ~NcclWork() override {
    if (waited_) return;
    try {
      wait();
    } catch (const std::exception& e) {
      DDPV_WARN("NCCL collective failed and was never waited on: ", e.what());
    }
  }
  void wait() override {
    if (waited_) return;
    waited_ = true;
    DDPV_CUDA_CHECK(cudaStreamWaitEvent(compute_, done_->get(), 0));
    ncclResult_t async = ncclSuccess;
    DDPV_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
    DDPV_NCCL_CHECK(async);
  }

 private:
  cudaStream_t compute_;
  std::shared_ptr<CudaEvent> done_;
  ncclComm_t comm_;
  bool waited_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const World& world, Backend& backend)
      : rank_(world.rank()),
        size_(world.size()),
        compute_(static_cast<cudaStream_t>(backend.native_stream())),
        watch_(world.stall_watch()) {
    DDPV_CHECK(backend.device() == Device::kCuda && compute_ != nullptr,
               "the NCCL communicator needs a CUDA backend (got ", backend.name(), ")");
    // The backend made its GPU current on this thread when it was created.
    DDPV_CUDA_CHECK(cudaGetDevice(&device_));
    ncclUniqueId id{};
    if (rank_ == 0) DDPV_NCCL_CHECK(ncclGetUniqueId(&id));
    world.broadcast_bytes(&id, sizeof id, 0);
    DDPV_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
    const ncclResult_t init = ncclCommInitRank(&comm_, size_, id, rank_);
    if (init != ncclSuccess) {
      (void)cudaStreamDestroy(comm_stream_);
      DDPV_FAIL("NCCL error ", ncclGetErrorString(init), " in ncclCommInitRank (", size_,
                " ranks, GPU ", device_, ")");
    }
    try {
      DDPV_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(int32_t)));
      DDPV_CUDA_CHECK(cudaMemsetAsync(barrier_buf_, 0, sizeof(int32_t), comm_stream_));
      const int device = device_;
      watchdog_ = std::make_unique<CollectiveWatchdog>(
          kDefaultTimeoutS, [this](const std::string& what) { on_hang(what); },
          [this] { return async_error(); }, [device] { (void)cudaSetDevice(device); });
    } catch (...) {
      release(true);
      throw;
    }
    int version = 0;
    (void)ncclGetVersion(&version);
    version_ = version;
  }

  ~NcclCommunicator() override {
    // During unwinding a peer may be gone: abort rather than wait for collectives to drain.
    release(std::uncaught_exceptions() > 0);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::kCuda; }
  std::string name() const override {
    return detail::concat("nccl ", version_ / 10000, ".", version_ / 100 % 100, ".", version_ % 100,
                          " (communication stream, watchdog)");
  }

  void broadcast(void* data, size_t bytes, int root) override {
    auto done = launch(detail::concat("broadcast of ", bytes, " bytes from rank ", root), [&] {
      DDPV_NCCL_CHECK(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, comm_stream_));
    });
    NcclWork(compute_, std::move(done), comm_).wait();
  }

  void allreduce(void* data, int64_t count, CommType type, ReduceOp op) override {
    allreduce_async(data, count, type, op)->wait();
  }

  // Unlike the others, a barrier blocks the host: every rank has reached it when it returns.
  void barrier() override {
    auto done = launch("barrier", [&] {
      DDPV_NCCL_CHECK(
          ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclInt32, ncclSum, comm_, comm_stream_));
    });
    DDPV_CUDA_CHECK(cudaEventSynchronize(done->get()));
    DDPV_NCCL_CHECK(async_result());
  }

  std::unique_ptr<CommWork> allreduce_async(void* data, int64_t count, CommType type,
                                            ReduceOp op) override {
    DDPV_CHECK(count >= 0, "allreduce: negative count ", count);
    const ncclDataType_t dt = nccl_type(type);
    const ncclRedOp_t rop = nccl_op(op, type);
    auto done =
        launch(detail::concat("allreduce (", reduce_op_name(op), ") of ", count, " elements"), [&] {
          DDPV_NCCL_CHECK(
              ncclAllReduce(data, data, static_cast<size_t>(count), dt, rop, comm_, comm_stream_));
        });
    return std::make_unique<NcclWork>(compute_, std::move(done), comm_);
  }

  void set_step(int64_t step) override { step_.store(step, std::memory_order_relaxed); }
  void set_timeout(double seconds) override { watchdog_->set_timeout(seconds); }

 private:
  // Note [Stream-ordered collectives], GPU side: the communication stream waits on an event
  // recorded on the compute stream now, i.e. after the kernels that wrote the buffer, and the
  // collective's completion event is handed to the watchdog and to the caller's work handle.
  template <typename Enqueue>
  std::shared_ptr<CudaEvent> launch(std::string what, Enqueue&& enqueue) {
    DDPV_CUDA_CHECK(cudaEventRecord(ready_.get(), compute_));
    DDPV_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, ready_.get(), 0));
    enqueue();
    auto done = std::make_shared<CudaEvent>();
    DDPV_CUDA_CHECK(cudaEventRecord(done->get(), comm_stream_));
    watchdog_->watch(
        [done](std::string* error) {
          const cudaError_t status = cudaEventQuery(done->get());
          if (status == cudaSuccess) return CollectiveWatchdog::State::kDone;
          if (status == cudaErrorNotReady) return CollectiveWatchdog::State::kPending;
          *error = cudaGetErrorString(status);
          return CollectiveWatchdog::State::kFailed;
        },
        detail::concat("NCCL ", what, " (collective #", ++launched_, ")"));
    return done;
  }

  ncclResult_t async_result() const {
    ncclResult_t r = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) return ncclSystemError;
    return r;
  }
  std::string async_error() const {
    const ncclResult_t r = async_result();
    if (r == ncclSuccess || r == ncclInProgress) return "";
    return detail::concat("NCCL reported an asynchronous error: ", ncclGetErrorString(r));
  }

  // Note [Watchdog ends the job]: the one place below main that ends the process. A rank stuck
  // in a device-side wait cannot unwind to main's catch, and its peers may be stuck too;
  // aborting the communicator releases the GPU, and the stall watch's abort prints one line
  // naming the rank and host and ends the whole MPI job, once even when the host-side stall
  // watchdog or another rank's fires at the same time (Note [One abort]).
  void on_hang(const std::string& what) {
    (void)ncclCommAbort(comm_);
    const int64_t step = step_.load(std::memory_order_relaxed);
    watch_->abort(program_invocation_short_name,
                  detail::concat(what, step >= 0 ? detail::concat(" at step ", step) : "",
                                 "; aborted the NCCL communicator"),
                  StallWatch::kExitCode);
  }

  void release(bool abort) noexcept {
    // Drain with the watchdog still running: should a peer be gone, it ends the job rather
    // than leave this rank waiting forever. Then join it before the communicator goes.
    if (!abort && comm_stream_ != nullptr) (void)cudaStreamSynchronize(comm_stream_);
    watchdog_.reset();
    if (comm_ != nullptr) {
      (void)(abort ? ncclCommAbort(comm_) : ncclCommDestroy(comm_));
      comm_ = nullptr;
    }
    if (barrier_buf_ != nullptr) (void)cudaFree(barrier_buf_);
    barrier_buf_ = nullptr;
    if (comm_stream_ != nullptr) (void)cudaStreamDestroy(comm_stream_);
    comm_stream_ = nullptr;
  }

  int rank_, size_;
  int device_ = 0;
  int version_ = 0;
  cudaStream_t compute_;
  cudaStream_t comm_stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  void* barrier_buf_ = nullptr;  // one int32 on the device
  CudaEvent ready_;
  std::unique_ptr<CollectiveWatchdog> watchdog_;
  StallWatch* watch_;  // World's (Note [Stall watchdog])
  uint64_t launched_ = 0;
  std::atomic<int64_t> step_{-1};
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const World& world, Backend& backend) {
  return std::make_unique<NcclCommunicator>(world, backend);
}

}  // namespace ddpv
