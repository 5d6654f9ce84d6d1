// World: MPI start-up and shutdown, rank/size/local rank, host collectives, abort_job.
#include "ddpv/dist/world.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "dist/mpi_check.hpp"

namespace ddpv {

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

World::World(int* argc, char*** argv)
    : impl_(std::make_unique<Impl>()), uncaught_at_start_(std::uncaught_exceptions()) {
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
  if (impl_->local != MPI_COMM_NULL) MPI_Comm_free(&impl_->local);
  if (impl_->world != MPI_COMM_NULL) MPI_Comm_free(&impl_->world);
  if (owns_mpi_) MPI_Finalize();
}

const std::string& World::host() const { return host_name(); }

void World::broadcast_bytes(void* data, size_t bytes, int root) const {
  DDPV_CHECK(bytes <= static_cast<size_t>(INT32_MAX), "broadcast of ", bytes,
             " bytes is larger than one MPI message");
  DDPV_MPI_CHECK(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, impl_->world));
}

void World::allreduce_sum(double* data, int64_t count) const {
  DDPV_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_DOUBLE, MPI_SUM,
                               impl_->world));
}

void World::allreduce_sum(int64_t* data, int64_t count) const {
  DDPV_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_INT64_T, MPI_SUM,
                               impl_->world));
}

void World::allreduce_max(int64_t* data, int64_t count) const {
  DDPV_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_INT64_T, MPI_MAX,
                               impl_->world));
}

void World::barrier() const { DDPV_MPI_CHECK(MPI_Barrier(impl_->world)); }

std::string describe_exception(const std::exception& e) {
  if (const auto* err = dynamic_cast<const Error*>(&e))
    return err->message() + " [" + err->location() + "]";
  return e.what();
}

void abort_job(const std::string& program, const std::string& what, int code) {
  const int rank = error_rank();
  std::string line = program + ": ";
  line += rank >= 0 ? "rank " + std::to_string(rank) + " on " + host_name() : host_name();
  line += ": " + what + "\n";
  // One write(2), so the line is not interleaved with other ranks' output.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
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
