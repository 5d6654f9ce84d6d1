// Communicator: collectives over all ranks on buffers of the backend's device (MPI on CPU,
// NCCL on GPU), with asynchronous launches for the gradient reducer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "ddpv/core/choice.hpp"
#include "ddpv/core/tensor.hpp"

namespace ddpv {

class Backend;
class World;

enum class ReduceOp : uint8_t { kSum, kAvg, kMax };
// kBF16: 16-bit brain floats (the upper half of an f32), for gradients reduced in bf16
// (--reduce-dtype bf16); sums are formed in f32 and rounded to nearest even once per step of
// the reduction, on NCCL and MPI alike.
enum class CommType : uint8_t { kF32, kF64, kI32, kI64, kBF16 };
size_t comm_type_size(CommType t);
const char* reduce_op_name(ReduceOp op);

// Note [Stream-ordered collectives]: a communicator's calls are ordered with the work the
// backend has queued before them, and work queued after a completed call sees its result.
//  - CPU (MPI): the backend computes synchronously, so "queued" means "returned"; a launch
//    reads the buffer as it is now and wait() blocks the host until the result is in place.
//  - GPU (NCCL): a launch records an event on the backend's compute stream, makes the
//    communication stream wait on it and enqueues the collective there; wait() makes the
//    compute stream wait on the collective's completion event (the host does not block), so
//    the optimizer, queued next on the compute stream, reads reduced gradients.
// Either way the caller writes: launch after the producer, wait() before the consumer.
// Every rank must issue the same collectives in the same order (Note [Bucket order]).

// A launched collective. wait() returns when its result may be consumed (see above) and
// rethrows any failure of the collective; a handle must be waited on before its buffer dies.
// Destroying an un-waited handle waits (errors are then only logged).
class CommWork {
 public:
  virtual ~CommWork() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Device device() const = 0;     // where the buffers live
  virtual std::string name() const = 0;  // "mpi (communication thread)"

  // In place, blocking in the sense of Note [Stream-ordered collectives].
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void allreduce(void* data, int64_t count, CommType type, ReduceOp op) = 0;
  virtual void barrier() = 0;

  // For communicators with a watchdog (NCCL, Note [Collective watchdog]): the training step its
  // message names, and --comm-timeout. No-ops for the others.
  virtual void set_step(int64_t /*step*/) {}
  virtual void set_timeout(double /*seconds*/) {}

  // In place, returns at once; the result is ready after the handle's wait(). kAvg is for
  // floating types (f32, f64, bf16) only.
  virtual std::unique_ptr<CommWork> allreduce_async(void* data, int64_t count, CommType type,
                                                    ReduceOp op) = 0;

  // Gives a communicator without its own progress engine (MPI non-blocking mode) a chance to
  // advance launched collectives; the reducer calls it as backward reports tensors.
  virtual void progress() {}

  // Typed conveniences.
  void allreduce(float* data, int64_t count, ReduceOp op) {
    allreduce(data, count, CommType::kF32, op);
  }
  void allreduce(double* data, int64_t count, ReduceOp op) {
    allreduce(data, count, CommType::kF64, op);
  }
  void allreduce(int64_t* data, int64_t count, ReduceOp op) {
    allreduce(data, count, CommType::kI64, op);
  }
};

// How the MPI communicator overlaps collectives with computation; see
// Note [Communication thread] in src/dist/mpi_communicator.cpp for the measurements.
enum class MpiProgress : uint8_t {
  kNonBlocking,  // MPI_Iallreduce from the caller, advanced by progress() (the default)
  kThread,       // a communication thread issues blocking MPI collectives
};
std::span<const ChoiceWord<MpiProgress>> choices(MpiProgress);  // nonblocking | thread

// The MPI communicator over all ranks of `world` (host memory); it uses a private duplicate of
// the world communicator, so its collectives never mix with anyone else's.
std::unique_ptr<Communicator> make_mpi_communicator(
    const World& world, MpiProgress progress = MpiProgress::kNonBlocking);

// The communicator for a backend: NCCL for a CUDA backend, MPI for the CPU backend.
std::unique_ptr<Communicator> make_communicator(const World& world, Backend& backend);

}  // namespace ddpv
