// Waiting for MPI requests the way Note [Waiting without spinning] says: spin briefly, then
// sleep; and arriving at a blocking collective through a non-blocking barrier first.
#pragma once

#include <mpi.h>

namespace ddpv {

// MPI_Wait of `request` with the back-off of Note [Waiting without spinning]. Throws
// ddpv::Error naming `what` when MPI reports a failure. Callers mark the sync point for the
// stall watch (WaitScope), around this and whatever blocking call follows it.
void wait_request(MPI_Request* request, const char* what);

// Every rank of `comm` has arrived here when it returns (MPI_Ibarrier, waited on as above): a
// blocking collective called next waits for data, not for late ranks, so it spins only as long
// as the transfer takes (or, when a rank stops in the middle of it, until the stall watchdog
// ends the job: a blocking MPI call cannot be made to sleep).
void arrive(MPI_Comm comm);

}  // namespace ddpv
