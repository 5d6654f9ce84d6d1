// DDPV_MPI_CHECK and World's MPI handles: private to src/dist (mpi.h never reaches include/).
#pragma once

#include <mpi.h>

#include <string>

#include "ddpv/core/error.hpp"
#include "ddpv/dist/world.hpp"

namespace ddpv {

// The MPI library's text for an error code.
std::string mpi_error_string(int code);

// World's communicators: `world` is MPI_COMM_WORLD with errors returned (so DDPV_MPI_CHECK can
// throw), `local` the ranks of this node. A communicator implementation (MPI here, NCCL in
// src/dist/nccl) duplicates `world` for its own traffic.
struct World::Impl {
  MPI_Comm world = MPI_COMM_NULL;
  MPI_Comm local = MPI_COMM_NULL;
};

inline MPI_Comm mpi_world_comm(const World& w) { return w.impl().world; }

}  // namespace ddpv

// Throws ddpv::Error naming the call and MPI's message unless it returned MPI_SUCCESS.
#define DDPV_MPI_CHECK(call)                                                           \
  do {                                                                                 \
    const int ddpv_mpi_rc_ = (call);                                                   \
    if (ddpv_mpi_rc_ != MPI_SUCCESS) [[unlikely]]                                      \
      DDPV_FAIL("MPI error in ", #call, ": ", ::ddpv::mpi_error_string(ddpv_mpi_rc_)); \
  } while (0)
