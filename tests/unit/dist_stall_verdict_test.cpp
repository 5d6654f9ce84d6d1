// judge_stall (Note [Stall verdict]): who reports a stall and what the one line says, from the
// answers of the ranks, with the times given rather than measured.
#include <gtest/gtest.h>

#include "ddpv/dist/stall_watch.hpp"

namespace ddpv {
namespace {

using Answers = std::vector<std::optional<RankStatus>>;

RankStatus waiting_at(int64_t seq, int64_t step, Phase phase, double seconds) {
  return RankStatus{seq, step, phase, /*waiting=*/true, seconds};
}
RankStatus busy_in(int64_t seq, int64_t step, Phase phase, double seconds) {
  return RankStatus{seq, step, phase, /*waiting=*/false, seconds};
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(StallVerdict, NamesTheRankThatDoesNotAnswerAndTheLowestWaiterReports) {
  const Answers a = {waiting_at(40, 7, Phase::kAgreement, 31),
                     waiting_at(40, 7, Phase::kAgreement, 31), std::nullopt,
                     waiting_at(40, 7, Phase::kAgreement, 30)};
  const StallVerdict v = judge_stall(a, {"n0", "n0", "n1", "n1"}, 30);
  EXPECT_EQ(v.reporter, 0);
  EXPECT_EQ(v.line,
            "stall: no progress for 30 s (--comm-timeout) in the step agreement of step 7: rank 2 "
            "on n1 does not answer (stopped, swapping, or hung in the kernel); ending the job");
}

TEST(StallVerdict, AStoppedRankZeroHandsTheReportToRankOne) {
  const Answers a = {std::nullopt, waiting_at(12, 3, Phase::kGradients, 5),
                     waiting_at(12, 3, Phase::kGradients, 5)};
  const StallVerdict v = judge_stall(a, {"a", "b", "c"}, 5);
  EXPECT_EQ(v.reporter, 1);
  EXPECT_TRUE(has(v.line, "in the gradient exchange of step 3: rank 0 on a does not answer"))
      << v.line;
}

TEST(StallVerdict, ALiveRankThatHasNotArrivedSaysWhereItIs) {
  // Rank 1 answered: it is still waiting for its batch (a hung file system, say), one sync
  // point behind the others.
  const Answers a = {waiting_at(9, 4, Phase::kAgreement, 61), busy_in(8, 4, Phase::kData, 62.4),
                     waiting_at(9, 4, Phase::kAgreement, 60)};
  const StallVerdict v = judge_stall(a, {"h0", "h1", "h2"}, 60);
  EXPECT_EQ(v.reporter, 0);
  EXPECT_TRUE(has(v.line, "rank 1 on h1 is still in the wait for a batch of step 4 (62 s)"))
      << v.line;
  EXPECT_FALSE(has(v.line, "rank 2")) << v.line;
}

TEST(StallVerdict, ARankWaitingAtAnOlderSyncPointIsBehindTheOthers) {
  const Answers a = {waiting_at(20, 5, Phase::kEvaluation, 40),
                     waiting_at(19, 5, Phase::kReport, 41),
                     waiting_at(20, 5, Phase::kEvaluation, 40)};
  const StallVerdict v = judge_stall(a, {"h", "h", "h"}, 30);
  EXPECT_EQ(v.reporter, 0);
  EXPECT_TRUE(has(v.line, "in the evaluation of step 5"));
  EXPECT_TRUE(
      has(v.line, "rank 1 on h waits in the rank report of step 5 (41 s), behind the others"))
      << v.line;
}

TEST(StallVerdict, ARankHeldBehindTheOthersIsNotBlamedBesideTheCause) {
  // Rank 3 still waits in an earlier collective, which needs the stopped rank 1 as well.
  const Answers a = {waiting_at(20, 5, Phase::kGradients, 9), std::nullopt,
                     waiting_at(20, 5, Phase::kGradients, 9),
                     waiting_at(19, 5, Phase::kGradients, 9)};
  const StallVerdict v = judge_stall(a, {"h", "h", "h", "h"}, 8);
  EXPECT_EQ(v.reporter, 0);
  EXPECT_TRUE(has(v.line, "rank 1 on h does not answer")) << v.line;
  EXPECT_FALSE(has(v.line, "rank 3")) << v.line;
}

TEST(StallVerdict, SilentNeighboursOnOneHostAreOneGroup) {
  // A whole node (ranks 4-7) stopped answering; rank 9 on another node too.
  Answers a(10, waiting_at(3, 1, Phase::kGradients, 10));
  for (int r : {4, 5, 6, 7, 9}) a[static_cast<size_t>(r)] = std::nullopt;
  const std::vector<std::string> hosts = {"a", "a", "a", "a", "b", "b", "b", "b", "c", "c"};
  const StallVerdict v = judge_stall(a, hosts, 10);
  EXPECT_EQ(v.reporter, 0);
  EXPECT_TRUE(has(v.line, "ranks 4-7 on b do not answer")) << v.line;
  EXPECT_TRUE(has(v.line, "rank 9 on c does not answer")) << v.line;
}

TEST(StallVerdict, TwoSilentRanksOnOneHostAreListedWithAComma) {
  Answers a(3, waiting_at(3, 1, Phase::kGradients, 10));
  a[1] = a[2] = std::nullopt;
  const StallVerdict v = judge_stall(a, {"x", "y", "y"}, 10);
  EXPECT_TRUE(has(v.line, "ranks 1, 2 on y do not answer")) << v.line;
}

TEST(StallVerdict, EveryRankWaitingIsAFaultOfTheNetwork) {
  const Answers a = {waiting_at(5, 2, Phase::kGradients, 11),
                     waiting_at(5, 2, Phase::kGradients, 12)};
  const StallVerdict v = judge_stall(a, {"h", "h"}, 10);
  EXPECT_EQ(v.reporter, 0);
  EXPECT_TRUE(has(v.line, "every rank waits there")) << v.line;
}

TEST(StallVerdict, ARankThatPassedTheSyncPointIsNotLate) {
  // A broadcast's root leaves it before the others have their data: not a missing rank.
  const Answers a = {busy_in(6, 0, Phase::kStartup, 40), waiting_at(6, 0, Phase::kStartup, 40),
                     std::nullopt};
  const StallVerdict v = judge_stall(a, {"h", "h", "h"}, 30);
  EXPECT_EQ(v.reporter, 1);
  EXPECT_FALSE(has(v.line, "rank 0")) << v.line;
  EXPECT_TRUE(has(v.line, "rank 2 on h does not answer")) << v.line;
}

TEST(StallVerdict, ALongListIsCutAfterEightNames) {
  // Ten late ranks on ten hosts: eight named, then a count.
  Answers a(11, std::nullopt);
  a[0] = waiting_at(2, 1, Phase::kAgreement, 10);
  std::vector<std::string> hosts(11);
  for (size_t r = 0; r < hosts.size(); ++r) hosts[r] = std::string("h").append(std::to_string(r));
  const StallVerdict v = judge_stall(a, hosts, 10);
  EXPECT_EQ(v.reporter, 0);
  EXPECT_TRUE(has(v.line, "rank 8 on h8 does not answer")) << v.line;
  EXPECT_FALSE(has(v.line, "rank 9 on h9")) << v.line;
  EXPECT_TRUE(has(v.line, "; and 2 more; ending the job")) << v.line;
}

TEST(StallVerdict, EveryRankJudgesTheSameAnswersAlike) {
  // The verdict depends on the answers only, so every asking rank picks the same reporter.
  const Answers a = {std::nullopt, waiting_at(8, 2, Phase::kAgreement, 9),
                     busy_in(7, 2, Phase::kCompute, 9), waiting_at(8, 2, Phase::kAgreement, 9)};
  const std::vector<std::string> hosts = {"h", "h", "h", "h"};
  const StallVerdict once = judge_stall(a, hosts, 8), again = judge_stall(a, hosts, 8);
  EXPECT_EQ(once.reporter, 1);
  EXPECT_EQ(once.line, again.line);
  EXPECT_TRUE(has(once.line,
                  "rank 0 on h does not answer (stopped, swapping, or hung in the "
                  "kernel); rank 2 on h is still in the forward and backward of step 2 "
                  "(9 s); ending the job"))
      << once.line;
}

}  // namespace
}  // namespace ddpv
