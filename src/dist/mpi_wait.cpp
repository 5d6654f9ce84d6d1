// wait_request and arrive: MPI waits that sleep once they last (Note [Waiting without spinning]).
#include "dist/mpi_wait.hpp"

#include "dist/backoff.hpp"
#include "dist/mpi_check.hpp"

namespace ddpv {

void wait_request(MPI_Request* request, const char* what) {
  Backoff backoff;
  for (;;) {
    int done = 0;
    const int rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) DDPV_FAIL("MPI error in ", what, ": ", mpi_error_string(rc));
    if (done != 0) return;
    backoff.pause();
  }
}

void arrive(MPI_Comm comm) {
  MPI_Request request = MPI_REQUEST_NULL;
  DDPV_MPI_CHECK(MPI_Ibarrier(comm, &request));
  wait_request(&request, "MPI_Ibarrier");
}

}  // namespace ddpv
