// Under real Open MPI: every rank counts the same sync points whatever the timing (what lets
// the stall watchdog tell who is missing, Note [Stall watchdog]); World::agree prints one line
// per fault and makes every rank throw (Note [Agreed failures]); the watchdog starts, stays
// quiet through ordinary waits, and stops.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "ddpv/dist/communicator.hpp"
#include "ddpv/dist/grad_reducer.hpp"
#include "ddpv/dist/shared_update.hpp"
#include "ddpv/dist/stall_watch.hpp"
#include "ddpv/dist/world.hpp"
#include "support/test_support.hpp"

namespace ddpv {
namespace {

// The smallest and largest of a value over the ranks (on MPI_COMM_WORLD directly, so that the
// check itself is no sync point).
std::pair<int64_t, int64_t> extremes(int64_t v) {
  int64_t lo = v, hi = v;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  return {lo, hi};
}

// A different delay on every rank and call, so that ranks reach each sync point at other times.
void skew(int rank, int i) {
  std::this_thread::sleep_for(std::chrono::milliseconds((rank * 7 + i * 3) % 11));
}

TEST(StallWatch, EveryRankCountsTheSameSyncPoints) {
  World world;
  StallWatch& watch = *world.stall_watch();
  const int r = world.rank();
  for (MpiProgress mode : {MpiProgress::kNonBlocking, MpiProgress::kThread}) {
    auto comm = make_mpi_communicator(world, mode);
    std::vector<float> a(1 << 16, 1.0f), b(64, 2.0f), c(8, 3.0f);
    for (int i = 0; i < 4; ++i) {
      skew(r, i);
      auto w1 = comm->allreduce_async(a.data(), static_cast<int64_t>(a.size()), CommType::kF32,
                                      ReduceOp::kSum);
      auto w2 = comm->allreduce_async(b.data(), static_cast<int64_t>(b.size()), CommType::kF32,
                                      ReduceOp::kAvg);
      skew(r, i + 1);
      comm->progress();
      w1->wait();
      w2->wait();
      comm->allreduce(c.data(), static_cast<int64_t>(c.size()), ReduceOp::kMax);
      comm->broadcast(b.data(), b.size() * sizeof(float), i % world.size());
      comm->barrier();
      double d = r;
      world.allreduce_sum(&d, 1);
      EXPECT_EQ(d, world.size() * (world.size() - 1) / 2.0);
      world.broadcast_bytes(&d, sizeof d, 0);
      world.barrier();
    }
  }
  auto backend = make_backend(BackendOptions{.threads = 1});
  auto model = make_model("lenet", *backend, Shape{28, 28, 1}, 10);
  std::string why_not;
  auto shared = SharedUpdate::create(world, *model, &why_not);
  ASSERT_TRUE(shared) << why_not;
  SgdConfig cfg;
  cfg.lr = 0.01f;
  for (int i = 0; i < 3; ++i) {
    skew(r, i);
    shared->step(cfg);
  }
  const RankStatus s = watch.status();
  EXPECT_FALSE(s.waiting);
  const auto [lo, hi] = extremes(s.seq);
  EXPECT_EQ(lo, hi) << "ranks counted different numbers of sync points";
  EXPECT_GT(lo, 40);
}

// Redirects this process's stderr to a file for its lifetime; text() ends the capture.
class CapturedStderr {
 public:
  CapturedStderr() {
    path_ = "/tmp/ddpv-stall-test-" + std::to_string(getpid()) + ".txt";
    std::fflush(stderr);
    saved_ = dup(STDERR_FILENO);
    const int fd = open(path_.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    dup2(fd, STDERR_FILENO);
    close(fd);
  }
  ~CapturedStderr() { restore(); }
  std::string text() {
    restore();
    std::ifstream in(path_);
    std::stringstream s;
    s << in.rdbuf();
    std::remove(path_.c_str());
    return s.str();
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    dup2(saved_, STDERR_FILENO);
    close(saved_);
    saved_ = -1;
  }
  std::string path_;
  int saved_ = -1;
};

int count_of(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// Runs agree with `failure` on this rank; returns (threw, what this rank printed).
std::pair<bool, std::string> agree_with(const World& world, std::exception_ptr failure) {
  CapturedStderr capture;
  bool threw = false;
  try {
    world.agree(failure);
  } catch (const AgreedFailure&) {
    threw = true;
  }
  return {threw, capture.text()};
}

std::exception_ptr error_of(const std::string& message) {
  try {
    DDPV_FAIL(message);
  } catch (...) {
    return std::current_exception();
  }
}

TEST(AgreedFailures, NoFailureReturnsOnEveryRank) {
  World world;
  const auto [threw, printed] = agree_with(world, nullptr);
  EXPECT_FALSE(threw);
  EXPECT_EQ(printed, "");
}

TEST(AgreedFailures, OneRankFailingEndsEveryRankWithOneLine) {
  World world;
  const int culprit = world.size() - 1;
  const auto [threw, printed] =
      agree_with(world, world.rank() == culprit ? error_of("the disk is on fire") : nullptr);
  EXPECT_TRUE(threw) << "every rank must throw, not only the one that failed";
  int64_t lines = count_of(printed, "the disk is on fire");
  MPI_Allreduce(MPI_IN_PLACE, &lines, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(lines, 1);
  if (world.rank() == culprit) {
    EXPECT_NE(printed.find("rank " + std::to_string(culprit) + " on "), std::string::npos)
        << printed;
  }
}

TEST(AgreedFailures, EveryRankFailingAlikePrintsOnceWithoutARank) {
  World world;
  const auto [threw, printed] = agree_with(world, error_of("store x.h5: no such file"));
  EXPECT_TRUE(threw);
  int64_t lines = count_of(printed, "store x.h5: no such file");
  MPI_Allreduce(MPI_IN_PLACE, &lines, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(lines, 1);
  if (world.rank() == 0) {
    EXPECT_EQ(printed.find("rank 0"), std::string::npos) << printed;
    EXPECT_EQ(count_of(printed, "\n"), 1) << printed;
  }
}

TEST(AgreedFailures, DifferentFailuresArePrintedEach) {
  World world;
  // Ranks 0 and 1 fail, with different messages; the others do not.
  std::exception_ptr failure;
  if (world.rank() < 2) failure = error_of("failure number " + std::to_string(world.rank()));
  const auto [threw, printed] = agree_with(world, failure);
  EXPECT_TRUE(threw);
  int64_t lines = count_of(printed, "failure number");
  MPI_Allreduce(MPI_IN_PLACE, &lines, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(lines, 2);
  if (world.rank() < 2) {
    EXPECT_EQ(count_of(printed, "failure number"), 1) << printed;
  }
}

TEST(StallWatch, StartsStaysQuietThroughSlowWaitsAndStops) {
  World world;
  world.watch_stalls(2.0);
  ASSERT_TRUE(world.stall_watch()->active());
  // Waits of up to a second on some ranks: well inside the timeout, so nothing may happen.
  for (int i = 0; i < 3; ++i) {
    if (world.rank() == i % world.size())
      std::this_thread::sleep_for(std::chrono::milliseconds(300 * (i + 1)));
    world.barrier();
  }
  world.stall_watch()->stop();
  EXPECT_FALSE(world.stall_watch()->active());
}

}  // namespace
}  // namespace ddpv
