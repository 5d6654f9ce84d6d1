// Private to the CPU backend: how its own loops run on the OpenMP team (Note [No team of one]).
// Internal linkage, as in kernels/simd/vec8.hpp: each instruction set's files get their own copies.
#pragma once

#include <omp.h>

#include <cstdint>

namespace ddpv::cpu {

// Note [Alone in a chunk]: true on a thread of a Winograd convolution's team while it works
// through a chunk of images of its own (Note [Chunks between threads] in
// kernels/winograd/conv2d.cpp): the loops below then run whole on it, with no team and no
// worksharing. One flag for every instruction set's copy of these helpers, so defined once
// (kernels/winograd/conv2d.cpp).
extern constinit thread_local bool t_alone;

namespace {  // NOLINT(google-build-namespaces): see above

// Below this many elements (or floats of work) a loop runs on one thread: waking a team costs
// more than it saves.
constexpr int64_t kParallelMin = 1 << 16;

// Note [No team of one]: `#pragma omp parallel if (false)` still goes through libgomp. It
// starts a team of one thread and ends it at a barrier whose last arrival wakes the waiters
// with a futex system call, even when there are none: on a paravirtualised guest, where a
// system call is dear, that costs about a microsecond a region, against nothing for a plain
// call. resnet20's Winograd loops open about 3 900 regions a step (each transform and product,
// per chunk of a few images), several percent of the step at one thread per rank, which is how
// the benchmarks and most MPI jobs run (strace -c counts the futex calls; docs/performance.md,
// "CPU engine").
// in_team(worth_it, f) runs f on the team only where the work is worth a team and the team
// would have more than one thread; otherwise it calls f directly. The worksharing loops in f
// (`#pragma omp for`, orphaned) then run whole on the calling thread, their barriers return at
// once, and omp_get_thread_num() is 0: the same iterations in the same order as a team of one.
// op_team_test counts the regions of lenet's and resnet20's training steps: none on one thread.
template <class F>
inline void in_team(bool worth_it, const F& f) {
  if (worth_it && !t_alone && omp_get_max_threads() > 1) {
#pragma omp parallel
    f();
  } else {
    f();
  }
}

// body(i) for i in [begin, end): the loop of an in_team body, divided between the team as
// `#pragma omp for schedule(static)` does, or whole on this thread when it is alone in a
// chunk (Note [Alone in a chunk]).
template <class I, class Body>
inline void team_for(I begin, I end, const Body& body) {
  if (t_alone) {
    for (I i = begin; i < end; ++i) body(i);
    return;
  }
#pragma omp for schedule(static)
  for (I i = begin; i < end; ++i) body(i);
}

// The team in_team(worth_it, ...) runs on, and this thread's place in it.
inline int team_size(bool worth_it) { return worth_it && !t_alone ? omp_get_max_threads() : 1; }
inline int team_rank() { return t_alone ? 0 : omp_get_thread_num(); }

}  // namespace
}  // namespace ddpv::cpu
