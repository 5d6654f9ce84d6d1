// World: MPI start-up and shutdown, rank/size/local rank, host collectives, abort_job.
#include "ddpv/dist/world.hpp"

#include <errno.h>  // program_invocation_short_name
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <vector>

#include "ddpv/dist/stall_watch.hpp"
#include "dist/mpi_check.hpp"
#include "dist/mpi_wait.hpp"

namespace ddpv {
namespace {

// A host allreduce in place: a sync point of `watch` whose wait sleeps once it lasts (Note
// [Waiting without spinning]).
void host_allreduce(MPI_Comm comm, StallWatch* watch, void* data, int64_t count, MPI_Datatype type,
                    MPI_Op op) {
  WaitScope scope(watch);
  MPI_Request r = MPI_REQUEST_NULL;
  DDPV_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), type, op, comm, &r));
  wait_request(&r, "MPI_Iallreduce");
}

}  // namespace

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

World::World(int* argc, char*** argv)
    : impl_(std::make_unique<Impl>()),
      watch_(std::make_unique<StallWatch>()),
      uncaught_at_start_(std::uncaught_exceptions()) {
  int initialized = 0;
  DDPV_MPI_CHECK(MPI_Initialized(&initialized));
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    // Note [MPI thread level] in world.hpp.
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      DDPV_FAIL("MPI_Init_thread failed: start the program with mpirun (or as a single process)");
    owns_mpi_ = true;
  } else {
    DDPV_MPI_CHECK(MPI_Query_thread(&provided));
  }
  thread_multiple_ = provided >= MPI_THREAD_MULTIPLE;
  // Our own duplicate of MPI_COMM_WORLD that returns errors instead of aborting, so a failed
  // call becomes a ddpv::Error with context and takes the one abort path in main.
  DDPV_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &impl_->world));
  DDPV_MPI_CHECK(MPI_Comm_set_errhandler(impl_->world, MPI_ERRORS_RETURN));
  DDPV_MPI_CHECK(MPI_Comm_rank(impl_->world, &rank_));
  DDPV_MPI_CHECK(MPI_Comm_size(impl_->world, &size_));
  set_error_rank(rank_);
  DDPV_MPI_CHECK(
      MPI_Comm_split_type(impl_->world, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &impl_->local));
  DDPV_MPI_CHECK(MPI_Comm_rank(impl_->local, &local_rank_));
  DDPV_MPI_CHECK(MPI_Comm_size(impl_->local, &local_size_));
}

World::~World() {
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // Unwinding: a peer may be blocked in a collective, so freeing communicators or finalising
  // could hang; the top-level catch calls abort_job, which ends the whole job.
  if (std::uncaught_exceptions() > uncaught_at_start_) return;
  watch_->stop();
  if (impl_->local != MPI_COMM_NULL) MPI_Comm_free(&impl_->local);
  if (impl_->world != MPI_COMM_NULL) MPI_Comm_free(&impl_->world);
  if (owns_mpi_) MPI_Finalize();
}

const std::string& World::host() const { return host_name(); }

int World::device_index(int visible_devices) const {
  // One visible GPU per rank is how a scheduler binds them (Slurm's --gpus-per-task=1 sets
  // CUDA_VISIBLE_DEVICES per rank), and then every rank's GPU is its device 0. With several
  // visible, the node's ranks take one each; two ranks on one GPU would fail later in NCCL
  // ("duplicate GPU"), so too many ranks for the GPUs is refused here, on every rank alike.
  DDPV_CHECK(visible_devices <= 1 || local_size_ <= visible_devices, local_size_,
             " ranks run on host ", host(), " but it has only ", visible_devices,
             " visible GPUs: start at most ", visible_devices,
             " ranks per node (mpirun --map-by ppr:", visible_devices,
             ":node), or give each rank a GPU of its own (srun --gpus-per-task=1)");
  return visible_devices > 1 ? local_rank_ % visible_devices : 0;
}

void World::broadcast_bytes(void* data, size_t bytes, int root) const {
  DDPV_CHECK(bytes <= static_cast<size_t>(INT32_MAX), "broadcast of ", bytes,
             " bytes is larger than one MPI message");
  WaitScope scope(watch_.get());
  MPI_Request r = MPI_REQUEST_NULL;
  DDPV_MPI_CHECK(MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, impl_->world, &r));
  wait_request(&r, "MPI_Ibcast");
}

void World::allreduce_sum(double* data, int64_t count) const {
  host_allreduce(impl_->world, watch_.get(), data, count, MPI_DOUBLE, MPI_SUM);
}

void World::allreduce_sum(int64_t* data, int64_t count) const {
  host_allreduce(impl_->world, watch_.get(), data, count, MPI_INT64_T, MPI_SUM);
}

void World::allreduce_max(int64_t* data, int64_t count) const {
  host_allreduce(impl_->world, watch_.get(), data, count, MPI_INT64_T, MPI_MAX);
}

void World::barrier() const {
  WaitScope scope(watch_.get());
  arrive(impl_->world);
}

void World::watch_stalls(double timeout_s) {
  watch_->start(*this, program_invocation_short_name, timeout_s);
}

// Note [Agreed failures]: a fault that every rank meets in set-up (a missing store, a bad
// split, a checkpoint rank 0 cannot read while the others wait for its broadcast) used to
// end the job through every rank's abort_job: N lines, and Open MPI's report garbled by N
// MPI_Aborts. Set-up therefore has agreement points, before each collective that a failure on
// some ranks would leave the others blocked in. One allreduce finds the lowest failing rank;
// when there is one, it broadcasts a hash of its message, and an allreduce of one flag per rank
// tells it which ranks failed alike. It prints one line (without a rank when every rank failed
// alike), a rank that failed differently prints its own, and every rank throws AgreedFailure,
// so that the job ends through main's normal exit: MPI_Finalize everywhere, exit status 1.
void World::agree(std::exception_ptr failure) const {
  const std::string program = program_invocation_short_name;
  std::string what;
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      what = describe_exception(e);
    } catch (...) {
      what = "an unknown exception";
    }
  }
  int64_t first = failure ? rank_ : size_;
  host_allreduce(impl_->world, watch_.get(), &first, 1, MPI_INT64_T, MPI_MIN);
  if (first == size_) return;
  uint64_t hash = std::hash<std::string>{}(what);
  broadcast_bytes(&hash, sizeof hash, static_cast<int>(first));
  const bool alike = failure && std::hash<std::string>{}(what) == hash;
  std::vector<int64_t> same(static_cast<size_t>(size_), 0);
  same[static_cast<size_t>(rank_)] = alike ? 1 : 0;
  allreduce_sum(same.data(), size_);
  std::vector<int> also;
  for (int q = 0; q < size_; ++q)
    if (same[static_cast<size_t>(q)] != 0 && q != first) also.push_back(q);
  std::string line;
  if (rank_ == first && static_cast<int>(also.size()) == size_ - 1) {
    line = program + ": " + what;
  } else if (rank_ == first || (failure && !alike)) {
    line = program + ": rank " + std::to_string(rank_) + " on " + host_name() + ": " + what;
    if (rank_ == first && !also.empty()) {
      line += " (also on rank" + std::string(also.size() > 1 ? "s" : "");
      for (size_t i = 0; i < also.size(); ++i) line += (i ? ", " : " ") + std::to_string(also[i]);
      line += ")";
    }
  }
  if (!line.empty()) write_line(line);
  throw AgreedFailure(what.empty() ? "another rank failed in set-up" : what);
}

void World::abort_job(const std::string& program, const std::exception& e, int code) const {
  watch_->abort(program, describe_exception(e), code);
}

std::string describe_exception(const std::exception& e) {
  if (const auto* err = dynamic_cast<const Error*>(&e))
    return err->message() + " [" + err->location() + "]";
  return e.what();
}

void abort_job(const std::string& program, const std::string& what, int code) {
  const int rank = error_rank();
  std::string line = program + ": ";
  line += rank >= 0 ? "rank " + std::to_string(rank) + " on " + host_name() : host_name();
  write_line(line + ": " + what);
  abort_quietly(code);
}

void abort_quietly(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  // Without MPI running there is no peer to release: the top-level handler ends the process.
  std::exit(code);
}

void abort_job(const std::string& program, const std::exception& e, int code) {
  abort_job(program, describe_exception(e), code);
}

}  // namespace ddpv
