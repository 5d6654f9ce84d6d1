// Allreduce bandwidth of our MPI communicator against a plain MPI_Allreduce loop, 1 KiB to
// 64 MiB of floats, in one run:
//   mpirun -np 2 build/bin/allreduce_bench [trials=7]
// Note [Benchmarking on a shared machine]: the variants of one size run interleaved, trial by
// trial, each trial a fixed number of iterations timed by the slowest rank; the table shows
// the best trial (load from other processes only ever adds time) and the median. Fixed counts
// also keep every rank issuing the same collectives, which an adaptive framework would not.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "ddpv/dist/communicator.hpp"
#include "ddpv/dist/world.hpp"
#include "dist/mpi_check.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Stats {
  double best_us, median_us;
};

// Runs body `iters` times per trial, variants interleaved; returns per-iteration times.
std::vector<Stats> measure(const ddpv::World& world,
                           const std::vector<std::function<void()>>& bodies, int iters,
                           int trials) {
  std::vector<std::vector<double>> us(bodies.size());
  for (int t = 0; t < trials; ++t) {
    for (size_t v = 0; v < bodies.size(); ++v) {
      bodies[v]();  // warm: first touch, lazy connection setup
      world.barrier();
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) bodies[v]();
      double elapsed = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      int64_t ns = static_cast<int64_t>(elapsed * 1000);
      world.allreduce_max(&ns, 1);
      us[v].push_back(static_cast<double>(ns) / 1000 / iters);
    }
  }
  std::vector<Stats> out;
  for (auto& v : us) {
    std::sort(v.begin(), v.end());
    out.push_back({v.front(), v[v.size() / 2]});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    ddpv::World world(&argc, &argv);
    const int trials = argc > 1 ? std::max(1, std::atoi(argv[1])) : 7;
    MPI_Comm plain = MPI_COMM_NULL;
    DDPV_MPI_CHECK(MPI_Comm_dup(ddpv::mpi_world_comm(world), &plain));
    auto thread_comm = ddpv::make_mpi_communicator(world, ddpv::MpiProgress::kThread);
    auto nb_comm = ddpv::make_mpi_communicator(world, ddpv::MpiProgress::kNonBlocking);
    const char* names[] = {"MPI_Allreduce", "allreduce", "async+wait thread",
                           "async+wait non-blocking"};
    if (world.rank() == 0) {
      std::printf(
          "allreduce (sum, in place) of float buffers on %d ranks; per call: best of "
          "%d trials (median), overhead of the best vs MPI_Allreduce\n",
          world.size(), trials);
      std::printf("%10s %8s %22s", "bytes", "GB/s", names[0]);
      for (int v = 1; v < 4; ++v) std::printf(" %32s", names[v]);
      std::printf("\n");
    }
    for (int64_t bytes = 1 << 10; bytes <= (int64_t{64} << 20); bytes *= 4) {
      std::vector<float> buf(static_cast<size_t>(bytes / 4), 1.0f);
      const int n = static_cast<int>(buf.size());
      float* p = buf.data();
      const std::vector<std::function<void()>> bodies = {
          [&] { MPI_Allreduce(MPI_IN_PLACE, p, n, MPI_FLOAT, MPI_SUM, plain); },
          [&] { thread_comm->allreduce(p, n, ddpv::ReduceOp::kSum); },
          [&] {
            thread_comm->allreduce_async(p, n, ddpv::CommType::kF32, ddpv::ReduceOp::kSum)->wait();
          },
          [&] {
            nb_comm->allreduce_async(p, n, ddpv::CommType::kF32, ddpv::ReduceOp::kSum)->wait();
          }};
      const int iters = static_cast<int>(std::clamp<int64_t>((int64_t{16} << 20) / bytes, 2, 500));
      const std::vector<Stats> s = measure(world, bodies, iters, trials);
      if (world.rank() == 0) {
        std::printf("%10lld %8.2f %10.1f us (%7.1f)", static_cast<long long>(bytes),
                    static_cast<double>(bytes) / (s[0].best_us * 1e3), s[0].best_us,
                    s[0].median_us);
        for (int v = 1; v < 4; ++v) {
          std::printf(" %10.1f us (%7.1f) %+6.1f%%", s[v].best_us, s[v].median_us,
                      100.0 * (s[v].best_us / s[0].best_us - 1.0));
        }
        std::printf("\n");
        std::fflush(stdout);
      }
    }
    thread_comm.reset();
    nb_comm.reset();
    MPI_Comm_free(&plain);
  } catch (const std::exception& e) {
    ddpv::abort_job("allreduce_bench", e);
  }
  return 0;
}
