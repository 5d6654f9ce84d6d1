// The communicator registry (the one place in dist that knows which communicators were
// compiled in) and the small helpers of the Communicator interface.
#include "ddpv/dist/communicator.hpp"

#include "ddpv/core/error.hpp"
#include "dist/communicator_factory.hpp"

namespace ddpv {

size_t comm_type_size(CommType t) {
  switch (t) {
    case CommType::kF32:
      return 4;
    case CommType::kF64:
      return 8;
    case CommType::kI32:
      return 4;
    case CommType::kI64:
      return 8;
    case CommType::kBF16:
      return 2;
  }
  return 0;
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

std::unique_ptr<Communicator> make_communicator(const World& world, Backend& backend) {
  if (backend.device() == Device::kCpu) return make_mpi_communicator(world);
#if DDPV_HAVE_CUDA
  return make_nccl_communicator(world, backend);
#else
  DDPV_FAIL("no communicator for device ", device_name(backend.device()),
            " in this build (the CUDA backend and NCCL are not compiled in)");
#endif
}

}  // namespace ddpv
