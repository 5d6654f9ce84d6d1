// Factories of the concrete communicators, private to src/dist; the registry picks one.
#pragma once

#include <memory>

#include "ddpv/backend/backend.hpp"
#include "ddpv/dist/communicator.hpp"
#include "ddpv/dist/world.hpp"

namespace ddpv {

// Defined in src/dist/nccl/ (compiled only with the CUDA backend). What it needs from World:
// rank(), size(), device_index(), broadcast_bytes() for the ncclUniqueId made on rank 0, and
// mpi_world_comm() (src/dist/mpi_check.hpp) should it want MPI itself; from the backend:
// native_stream(), the compute stream its launches are ordered after
// (Note [Stream-ordered collectives]).
std::unique_ptr<Communicator> make_nccl_communicator(const World& world, Backend& backend);

}  // namespace ddpv
