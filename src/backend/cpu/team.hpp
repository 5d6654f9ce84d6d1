// Private to the CPU backend: how its own loops run on the OpenMP team (Note [No team of one]).
// Internal linkage, as in vec8.hpp: each instruction set's files get their own copies.
#pragma once

#include <omp.h>

namespace ddpv::cpu {
namespace {  // NOLINT(google-build-namespaces): see above

// Note [No team of one]: `#pragma omp parallel if (false)` still goes through libgomp. It
// starts a team of one thread and ends it at a barrier whose last arrival wakes the waiters
// with a futex system call, even when there are none: 1.2 us a region on the 2026-12-04 EPYC
// (a paravirtualised guest, where a system call is dear), against nothing for a plain call.
// resnet20's Winograd loops open about 3 900 regions a step (each transform and product, per
// chunk of a few images): about 4.6 ms of an 84 ms step at one thread per rank, which is how
// the benchmarks and most MPI jobs run (strace -c: 94 602 futex calls in a 4 s model_bench).
// in_team(worth_it, f) runs f on the team only where the work is worth a team and the team
// would have more than one thread; otherwise it calls f directly. The worksharing loops in f
// (`#pragma omp for`, orphaned) then run whole on the calling thread, their barriers return at
// once, and omp_get_thread_num() is 0: the same iterations in the same order as a team of one.
// op_team_test counts the regions of lenet's and resnet20's training steps: none on one thread.
template <class F>
inline void in_team(bool worth_it, const F& f) {
  if (worth_it && omp_get_max_threads() > 1) {
#pragma omp parallel
    f();
  } else {
    f();
  }
}

}  // namespace
}  // namespace ddpv::cpu
