// A small MPI program for tests/e2e/dist_abort_test.sh: ranks "train" with a loop of gradient
// allreduces and one rank throws in the middle of a backward pass. The job must end promptly,
// non-zero, with one line from the failing rank naming its rank and host (abort_job).
//   mpirun -np 2 dist_abort_tool [FAIL_RANK] [FAIL_STEP] [thread|nonblocking]
#include <cstdlib>
#include <string>
#include <vector>

#include "ddpv/core/error.hpp"
#include "ddpv/dist/communicator.hpp"
#include "ddpv/dist/grad_reducer.hpp"
#include "ddpv/dist/world.hpp"

namespace {

std::vector<ddpv::ArenaEntry> fake_params(int n, int64_t count) {
  std::vector<ddpv::ArenaEntry> params;
  for (int i = 0; i < n; ++i) {
    ddpv::ArenaEntry e;
    e.name = std::to_string(i);
    e.count = count;
    e.extent = count;
    e.offset = i * count;
    e.shape = ddpv::Shape{count};
    params.push_back(e);
  }
  return params;
}

void train(int argc, char** argv, const ddpv::World& world) {
  const int fail_rank = argc > 1 ? std::atoi(argv[1]) : 1;
  const int fail_step = argc > 2 ? std::atoi(argv[2]) : 20;
  const auto progress =
      ddpv::find_choice<ddpv::MpiProgress>(argc > 3 ? argv[3] : "nonblocking");
  DDPV_CHECK(progress, "dist_abort_tool: the third argument is thread or nonblocking");
  auto comm = ddpv::make_mpi_communicator(world, *progress);
  const int kTensors = 16;
  const int64_t kCount = 64 * 1024;
  std::vector<float> grad(static_cast<size_t>(kTensors * kCount), 1.0f);
  ddpv::GradReducer reducer(ddpv::BucketPlan(fake_params(kTensors, kCount), 0), *comm, grad.data());
  for (int step = 0; step < 1000000; ++step) {
    for (int t = 0; t < kTensors; ++t) {
      // Half way through backward: some buckets are launched, the rest never will be here.
      if (step == fail_step && t == kTensors / 2 && world.rank() == fail_rank)
        DDPV_FAIL("injected failure in backward at step ", step);
      reducer.mark_ready(t);
    }
    reducer.wait();
    for (float& g : grad) g = 1.0f;
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    ddpv::World world(&argc, &argv);
    train(argc, argv, world);
  } catch (const std::exception& e) {
    ddpv::abort_job("dist_abort_tool", e);
  }
  return 0;
}
