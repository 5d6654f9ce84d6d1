// The gtest main of MPI tests: every rank runs every test, and a test passes only when it
// passed on all ranks. Rank 0 prints the agreed verdict; other ranks print only their failures,
// each line prefixed with "[rank R]".
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <string>

#include "ddpv/core/error.hpp"

namespace {

constexpr const char* kOtherRankFailed = "failed on another rank";

// Turns a per-rank result into the agreed result: any rank failing fails the test everywhere.
class AgreeAcrossRanks : public ::testing::EmptyTestEventListener {
 public:
  void OnTestEnd(const ::testing::TestInfo& info) override {
    int failed = info.result()->Failed() ? 1 : 0;
    int any_failed = 0;
    MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any_failed && !failed) {
      ADD_FAILURE() << kOtherRankFailed;
    }
  }
};

// On ranks other than 0: prints each failure as one write, so it reads whole among the output
// of the other ranks.
class PrintFailuresWithRank : public ::testing::EmptyTestEventListener {
 public:
  explicit PrintFailuresWithRank(int rank) : prefix_("[rank " + std::to_string(rank) + "] ") {}
  void OnTestStart(const ::testing::TestInfo& info) override {
    name_ = std::string(info.test_suite_name()) + "." + info.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed() || std::string(r.message()).ends_with(kOtherRankFailed)) return;
    std::string line = prefix_ + name_ + ": " + (r.file_name() ? r.file_name() : "?") + ":" +
                       std::to_string(r.line_number()) + ": ";
    // Every line of a multi-line message carries the prefix too.
    for (const char* c = r.message(); *c; ++c) {
      if (*c == '\n') {
        line += "\n" + prefix_ + "  ";
      } else {
        line += *c;
      }
    }
    line += "\n";
    ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
    (void)ignored;
  }

 private:
  std::string prefix_, name_;
};

}  // namespace

int main(int argc, char** argv) {
  // MPI_THREAD_MULTIPLE: the communicator under test has a communication thread
  // (Note [MPI thread level] in include/ddpv/dist/world.hpp).
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ddpv::set_error_rank(rank);
  ::testing::InitGoogleTest(&argc, argv);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    // Keep only failure output on the other ranks.
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new PrintFailuresWithRank(rank));
  }
  listeners.Append(new AgreeAcrossRanks);
  const int local = RUN_ALL_TESTS();
  int global = 0;
  MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return global;
}
