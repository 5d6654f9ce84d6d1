// A small MPI program for tests/e2e/stall_test.sh: ranks "train" with a loop of steps (a
// little work, then the step agreement) under the stall watchdog, and one fault is injected:
//   stall_tool late RANK       RANK stays alive but waits for its batch for a minute in step 5:
//                              the watchdog (2 s) ends the job naming it and where it is
//   stall_tool fail-all        every rank throws the same error in step 5: one line, one abort
//   stall_tool fail-two        ranks 0 and 1 throw different errors in step 5: two lines, one
//                              abort (Note [One abort])
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "ddpv/core/error.hpp"
#include "ddpv/dist/stall_watch.hpp"
#include "ddpv/dist/world.hpp"

namespace {

constexpr int kFaultStep = 5;

void train(const std::string& mode, int late_rank, const ddpv::World& world) {
  ddpv::StallWatch& watch = *world.stall_watch();
  for (int step = 0; step < 1000; ++step) {
    watch.set_step(step);
    watch.set_phase(ddpv::Phase::kData);
    if (step == kFaultStep && mode == "late" && world.rank() == late_rank)
      std::this_thread::sleep_for(std::chrono::seconds(60));  // a hung file system, say
    if (step == kFaultStep && mode == "fail-all") DDPV_FAIL("injected failure on every rank");
    if (step == kFaultStep && mode == "fail-two" && world.rank() < 2)
      DDPV_FAIL("injected failure number ", world.rank());
    watch.set_phase(ddpv::Phase::kCompute);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    watch.set_phase(ddpv::Phase::kAgreement);
    double loss = 1.0;
    world.allreduce_sum(&loss, 1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  ddpv::World world(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "late";
  try {
    world.watch_stalls(mode == "late" ? 2.0 : 60.0);
    train(mode, argc > 2 ? std::atoi(argv[2]) : 1, world);
  } catch (const std::exception& e) {
    world.abort_job("stall_tool", e);
  }
  return 0;
}
