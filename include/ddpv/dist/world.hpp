// World: this process's place in the MPI job (rank, size, node-local rank, host), owning MPI's
// lifetime, plus the top-level error path of an MPI program (abort_job).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>

namespace ddpv {

class StallWatch;

// A failure that every rank has learned of through World::agree, and that one rank has
// already reported: main exits non-zero on every rank without another word, and without
// MPI_Abort (Note [Agreed failures]).
class AgreedFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Note [MPI thread level]: World asks for MPI_THREAD_MULTIPLE. The CPU communicator can issue
// its collectives from a communication thread (MpiProgress::kThread, Note [Communication
// thread]) while the main thread calls MPI on another communicator (World's host collectives,
// the test main's verdict), and the NCCL watchdog may end the job from its own thread.
// FUNNELED or SERIALIZED would force every MPI call through one thread or a global lock.
// With Open MPI over shared memory, MULTIPLE costs nothing measurable (the plain
// MPI_Allreduce baseline of bench/allreduce_bench.cpp runs under it). When the library
// grants less, World warns and communicators use non-blocking collectives driven from the
// calling thread (World::thread_multiple() is false).
class World {
 public:
  // Initialises MPI unless something (a test main) already did; then World only queries and
  // leaves finalisation to the owner.
  World(int* argc, char*** argv);
  World() : World(nullptr, nullptr) {}
  // Finalises MPI when it initialised it, except while an exception unwinds: a peer may still
  // be blocked in a collective, and MPI_Finalize would hang; abort_job ends the job instead.
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }  // among the ranks on this node
  int local_size() const { return local_size_; }
  const std::string& host() const;
  // The GPU ordinal this rank drives (one rank = one GPU) among the `visible_devices` it sees:
  // local_rank % visible_devices, so 0 where a scheduler shows each rank its own GPU alone.
  // Throws when the node has more ranks than visible GPUs (more than one).
  int device_index(int visible_devices) const;
  bool is_root() const { return rank_ == 0; }
  bool thread_multiple() const { return thread_multiple_; }

  // Host-side collectives over all ranks, on the calling thread. Used for metrics, agreeing on
  // decisions, and handing the NCCL unique id from rank 0 to the others. Each is a sync point
  // of the stall watch, and its wait sleeps once it lasts (Note [Waiting without spinning]).
  void broadcast_bytes(void* data, size_t bytes, int root) const;
  void allreduce_sum(double* data, int64_t count) const;
  void allreduce_sum(int64_t* data, int64_t count) const;
  void allreduce_max(int64_t* data, int64_t count) const;
  void barrier() const;

  // Note [Agreed failures]: collective. Every rank passes what it failed with (null when it
  // did not); when any rank failed, every rank throws AgreedFailure after exactly one of them
  // printed "<program>: <what>" (naming the rank when not all ranks failed alike; the program
  // is the process's own name).
  void agree(std::exception_ptr failure) const;

  // The stall watchdog of this process (Note [Stall watchdog]): idle until watch_stalls, which
  // is collective and starts it with `timeout_s`.
  StallWatch* stall_watch() const { return watch_.get(); }
  void watch_stalls(double timeout_s);
  // abort_job through the stall watch, so that one fault ends the job once (Note [One abort]).
  [[noreturn]] void abort_job(const std::string& program, const std::exception& e,
                              int code = 1) const;

  struct Impl;  // MPI handles; see src/dist/mpi_world.hpp for the communicator implementations
  const Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<StallWatch> watch_;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  bool owns_mpi_ = false;
  bool thread_multiple_ = false;
  int uncaught_at_start_ = 0;
};

// "message [file:line]" for a ddpv::Error (World's rank and host are said once, by abort_job),
// what() for anything else.
std::string describe_exception(const std::exception& e);

// For main's top-level catch: prints ONE line "<program>: rank R on HOST: <what>" to stderr and
// ends the whole job with MPI_Abort(code), so no peer is left waiting in a collective. Works
// before MPI is initialised and after it is finalised (then it only ends this process).
[[noreturn]] void abort_job(const std::string& program, const std::string& what, int code = 1);
[[noreturn]] void abort_job(const std::string& program, const std::exception& e, int code = 1);
// abort_job without the line: for a caller that printed its own (or need not print).
[[noreturn]] void abort_quietly(int code);

}  // namespace ddpv
