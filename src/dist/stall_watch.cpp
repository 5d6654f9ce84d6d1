// StallWatch: a watchdog thread per rank that notices a sync point lasting longer than
// --comm-timeout, asks the other ranks over a side channel where they are, and ends the job
// with one line naming those that did not arrive; and the one-abort rule for faults.
#include "ddpv/dist/stall_watch.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <list>
#include <mutex>
#include <thread>

#include "ddpv/core/clock.hpp"
#include "dist/mpi_check.hpp"

namespace ddpv {

// Note [Stall watchdog]: on CPU a rank that stops (SIGSTOP, a node swapping, a hung file
// system, a stuck NIC) leaves the others inside a collective forever: MPI has no timeout, and
// the CUDA backend's watchdog (Note [Collective watchdog]) watches device work only. Ending the
// job is easy; saying *which* rank held it is what a user needs to find the node, and the
// collective cannot tell: the ranks inside it know only that it has not completed. So:
//  - The main thread marks every sync point it enters (begin_wait / end_wait: a counter, a
//    time and a flag, a few stores) and says what it is doing (set_phase, set_step). Every rank
//    passes the same sync points in the same order, so ranks waiting at the same one have the
//    same count, and a rank with a smaller count has not arrived.
//  - A watchdog thread per rank wakes ten times a second. When its own main thread has waited
//    longer than the timeout, it sends a query to every other rank over a side channel: a
//    private duplicate of the world communicator on which only the watchdog threads talk,
//    point to point (MPI_THREAD_MULTIPLE, Note [MPI thread level]). Each rank's watchdog thread
//    answers with its main thread's state, whatever that thread is doing; a rank that does not
//    answer within kAnswerWait is stopped, swapping or hung in the kernel.
//  - Every waiting rank judges the same answers the same way (Note [Stall verdict]); the lowest
//    rank among those waiting at the newest sync point prints the line and calls MPI_Abort, so
//    the job ends once, with one message. The others stay quiet, and end the job themselves
//    only if it is still running kFallback later (the reporter died meanwhile).
//  - A wait that ends while the answers come in cancels the verdict: a rank that was merely
//    slow does not end the job.
// Why not a heartbeat in shared memory within a node and a side channel across nodes: one
// mechanism that works across nodes also works within one, and a stopped rank is recognised
// by its silence as well as by a stale heartbeat. Nothing of it runs in the step but the main
// thread's stores; the thread sends nothing until a wait has lasted the whole timeout.

// Note [One abort]: a fault that several ranks meet at about the same time (a file system gone,
// a store read failing everywhere) used to print one line per rank, and ranks calling MPI_Abort
// together garble Open MPI's own report. So a rank ending the job first tells the others
// (a claim on the side channel, with a hash of its message), waits kClaimWindow for claims of
// theirs, and calls MPI_Abort only when no lower rank claimed; it prints its line unless an
// earlier claim carried the same message. The others wait to be ended, and end the job
// themselves only after kFallback. A rank that received a claim before its own fault defers
// at once.

namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kTag = 0x57a1;
constexpr auto kPoll = milliseconds(100);
constexpr auto kAnswerWait = seconds(3);
constexpr auto kFallback = seconds(15);
constexpr auto kClaimWindow = milliseconds(300);

enum MessageType : int64_t { kQuery = 1, kAnswer = 2, kClaim = 3 };
// One side-channel message, sent as 8 int64.
struct Message {
  int64_t type = 0, seq = 0, step = 0, phase = 0, waiting = 0, millis = 0;
  uint64_t hash = 0;
  int64_t unused = 0;
};
static_assert(sizeof(Message) == 8 * sizeof(int64_t));

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string whole_seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.0f s", s);
  return text;
}

}  // namespace

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kStartup:
      return "start-up";
    case Phase::kData:
      return "wait for a batch";
    case Phase::kCompute:
      return "forward and backward";
    case Phase::kGradients:
      return "gradient exchange";
    case Phase::kAgreement:
      return "step agreement";
    case Phase::kBalance:
      return "batch balancing";
    case Phase::kEvaluation:
      return "evaluation";
    case Phase::kCheckpoint:
      return "checkpoint";
    case Phase::kReport:
      return "rank report";
    case Phase::kFinish:
      return "end of the run";
  }
  return "unknown phase";
}

// Note [Stall verdict]
StallVerdict judge_stall(const std::vector<std::optional<RankStatus>>& answers,
                         const std::vector<std::string>& hosts, double timeout_s) {
  const int n = static_cast<int>(answers.size());
  int64_t newest = -1;
  for (const auto& a : answers)
    if (a && a->waiting) newest = std::max(newest, a->seq);
  StallVerdict v;
  v.reporter = -1;
  for (int r = 0; r < n && v.reporter < 0; ++r)
    if (answers[r] && answers[r]->waiting && answers[r]->seq == newest) v.reporter = r;
  for (int r = 0; r < n && v.reporter < 0; ++r)
    if (answers[r]) v.reporter = r;
  if (v.reporter < 0) v.reporter = 0;  // nobody answered, not even the asker: cannot happen
  auto host = [&](int r) {
    return r < static_cast<int>(hosts.size()) ? hosts[static_cast<size_t>(r)] : std::string("?");
  };

  // The ranks that hold the others: silent ones, and live ones that have not arrived. A rank
  // waiting at an older sync point is held itself (its collective needs a late rank too), so
  // it is named only when nothing else explains the stall.
  std::vector<std::string> late, behind;
  std::vector<int> silent;  // consecutive ranks on one host that did not answer
  auto flush_silent = [&] {
    if (silent.empty()) return;
    late.push_back(rank_list(silent) + " on " + host(silent[0]) +
                   (silent.size() == 1 ? " does" : " do") +
                   " not answer (stopped, swapping, or hung in the kernel)");
    silent.clear();
  };
  for (int r = 0; r < n; ++r) {
    const auto& a = answers[static_cast<size_t>(r)];
    if (!a) {
      if (!silent.empty() && (silent.back() != r - 1 || host(silent.back()) != host(r)))
        flush_silent();
      silent.push_back(r);
      continue;
    }
    flush_silent();
    if (a->seq >= newest) continue;  // arrived (or passed: a broadcast's root leaves early)
    const std::string where = std::string(phase_name(a->phase)) + " of step " +
                              std::to_string(a->step) + " (" + whole_seconds(a->seconds) + ")";
    const std::string who = "rank " + std::to_string(r) + " on " + host(r);
    if (a->waiting) {
      behind.push_back(who + " waits in the " + where + ", behind the others");
    } else {
      late.push_back(who + " is still in the " + where);
    }
  }
  flush_silent();
  if (late.empty()) late = behind;

  const RankStatus& at = *answers[static_cast<size_t>(v.reporter)];
  v.line = "stall: no progress for " + whole_seconds(timeout_s) + " (--comm-timeout) in the " +
           phase_name(at.phase) + " of step " + std::to_string(at.step) + ": ";
  if (late.empty()) {
    v.line += "every rank waits there (a network or MPI fault?)";
  } else {
    constexpr size_t kShown = 8;
    for (size_t i = 0; i < std::min(late.size(), kShown); ++i) v.line += (i ? "; " : "") + late[i];
    if (late.size() > kShown) v.line += "; and " + std::to_string(late.size() - kShown) + " more";
  }
  v.line += "; ending the job";
  return v;
}

struct StallWatch::Impl {
  // The main thread's state (Note [Stall watchdog]).
  std::atomic<int64_t> seq{0}, step{0}, wait_since{0}, phase_since{now_ns()};
  std::atomic<int> phase{static_cast<int>(Phase::kStartup)};
  std::atomic<bool> waiting{false};

  // Fixed by start().
  std::string program;
  double timeout = 0;
  int rank = 0, size = 1;
  MPI_Comm side = MPI_COMM_NULL;
  bool channel = false;  // the watchdog thread may call MPI
  std::vector<std::string> hosts;

  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  bool quit = false;                             // guarded by mu
  std::vector<std::pair<int, uint64_t>> claims;  // guarded by mu: (rank, hash), Note [One abort]
  std::atomic<bool> ending{false};               // this process is ending the job

  // The watchdog thread's own.
  struct Send {
    Message message;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  std::list<Send> sends;  // stable addresses while MPI sends them
  std::vector<std::optional<RankStatus>> answers;
  int answered = 0;
  bool asking = false, deferred = false;
  int64_t asked_seq = -1;
  Clock::time_point deadline;
  std::string verdict;

  // abort_job's line: "<program>: rank R on HOST: <what>".
  std::string line_of(const std::string& what) const {
    return program + ": rank " + std::to_string(error_rank()) + " on " + host_name() + ": " + what;
  }

  RankStatus status() const {
    RankStatus s;
    s.seq = seq.load(std::memory_order_relaxed);
    s.step = step.load(std::memory_order_relaxed);
    s.phase = static_cast<Phase>(phase.load(std::memory_order_relaxed));
    s.waiting = waiting.load(std::memory_order_acquire);
    const int64_t since = (s.waiting ? wait_since : phase_since).load(std::memory_order_relaxed);
    s.seconds = static_cast<double>(now_ns() - since) * 1e-9;
    return s;
  }

  void send(int to, const Message& m) {
    Send& s = sends.emplace_back();
    s.message = m;
    if (MPI_Isend(&s.message, 8, MPI_INT64_T, to, kTag, side, &s.request) != MPI_SUCCESS)
      s.request = MPI_REQUEST_NULL;
  }

  // Receives what the other ranks sent; answers queries.
  void serve() {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kTag, side, &flag, &st) != MPI_SUCCESS || flag == 0) break;
      Message m;
      if (MPI_Recv(&m, 8, MPI_INT64_T, st.MPI_SOURCE, kTag, side, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        break;
      const int from = st.MPI_SOURCE;
      if (m.type == kQuery) {
        const RankStatus s = status();
        Message a;
        a.type = kAnswer;
        a.seq = s.seq;
        a.step = s.step;
        a.phase = static_cast<int64_t>(s.phase);
        a.waiting = s.waiting;
        a.millis = static_cast<int64_t>(s.seconds * 1e3);
        send(from, a);
      } else if (m.type == kAnswer && asking && !answers[static_cast<size_t>(from)]) {
        answers[static_cast<size_t>(from)] =
            RankStatus{m.seq, m.step, static_cast<Phase>(m.phase), m.waiting != 0,
                       static_cast<double>(m.millis) * 1e-3};
        ++answered;
      } else if (m.type == kClaim) {
        std::lock_guard lock(mu);
        claims.emplace_back(from, m.hash);
      }
    }
    sends.remove_if([](Send& s) {
      int done = 1;
      if (s.request != MPI_REQUEST_NULL) MPI_Test(&s.request, &done, MPI_STATUS_IGNORE);
      return done != 0;
    });
  }

  [[noreturn]] void end_job(const std::string& what, int code) {
    if (ending.exchange(true)) {  // another thread of this process is ending it already
      std::this_thread::sleep_for(kFallback);
      abort_quietly(code);
    }
    write_line(line_of(what));
    abort_quietly(code);
  }

  // One tick of the watchdog: Note [Stall watchdog].
  void watch() {
    const RankStatus me = status();
    const bool same_wait = me.waiting && me.seq == asked_seq;
    if (deferred) {
      if (!same_wait)
        deferred = false;  // the job moved on
      else if (Clock::now() >= deadline)
        end_job(verdict, kExitCode);
      return;
    }
    if (asking) {
      if (!same_wait) {  // the wait ended while the answers came in: the rank was only slow
        asking = false;
        return;
      }
      if (answered < size && Clock::now() < deadline) return;
      asking = false;
      answers[static_cast<size_t>(rank)] = me;
      if (!channel) {
        end_job("stall: no progress for " + whole_seconds(timeout) + " (--comm-timeout) in the " +
                    phase_name(me.phase) + " of step " + std::to_string(me.step) +
                    "; the other ranks could not be asked where they are (MPI grants no "
                    "MPI_THREAD_MULTIPLE); ending the job",
                kExitCode);
      }
      const StallVerdict v = judge_stall(answers, hosts, timeout);
      if (v.reporter == rank) end_job(v.line, kExitCode);
      deferred = true;
      verdict = v.line;
      deadline = Clock::now() + kFallback;
      return;
    }
    if (!me.waiting || me.seconds <= timeout) return;
    asked_seq = me.seq;
    answers.assign(static_cast<size_t>(size), std::nullopt);
    answers[static_cast<size_t>(rank)] = me;
    answered = 1;
    if (channel) {
      Message q;
      q.type = kQuery;
      for (int r = 0; r < size; ++r)
        if (r != rank) send(r, q);
    }
    asking = true;
    deadline = Clock::now() + kAnswerWait;
  }

  void run() {
    std::unique_lock lock(mu);
    while (!quit) {
      cv.wait_for(lock, kPoll);
      if (quit) break;
      lock.unlock();
      if (channel) serve();
      watch();
      lock.lock();
    }
  }
};

StallWatch::StallWatch() : impl_(std::make_unique<Impl>()) { impl_->hosts = {host_name()}; }

StallWatch::~StallWatch() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->quit = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void StallWatch::start(const World& world, const std::string& program, double timeout_s) {
  Impl& s = *impl_;
  DDPV_CHECK(!s.thread.joinable(), "the stall watchdog is already running");
  DDPV_CHECK(timeout_s > 0, "--comm-timeout must be positive, got ", timeout_s);
  s.program = program;
  s.timeout = timeout_s;
  s.rank = world.rank();
  s.size = world.size();
  s.channel = world.thread_multiple();
  // Every rank's host, for the line: gathered once, as fixed-width names.
  constexpr int kHostChars = 64;
  std::vector<char> names(static_cast<size_t>(kHostChars) * static_cast<size_t>(s.size), '\0');
  std::vector<char> mine(kHostChars, '\0');
  host_name().copy(mine.data(), kHostChars - 1);
  DDPV_MPI_CHECK(MPI_Allgather(mine.data(), kHostChars, MPI_CHAR, names.data(), kHostChars,
                               MPI_CHAR, mpi_world_comm(world)));
  s.hosts.clear();
  for (int r = 0; r < s.size; ++r)
    s.hosts.emplace_back(names.data() + static_cast<size_t>(r) * kHostChars);
  if (s.channel) {
    DDPV_MPI_CHECK(MPI_Comm_dup(mpi_world_comm(world), &s.side));
    DDPV_MPI_CHECK(MPI_Comm_set_errhandler(s.side, MPI_ERRORS_RETURN));
  }
  s.quit = false;
  s.thread = std::thread([&s] { s.run(); });
}

void StallWatch::stop() {
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.mu);
    s.quit = true;
  }
  s.cv.notify_all();
  if (s.thread.joinable()) s.thread.join();
  for (Impl::Send& send : s.sends)
    if (send.request != MPI_REQUEST_NULL) MPI_Request_free(&send.request);
  s.sends.clear();
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (s.side != MPI_COMM_NULL && !finalized) MPI_Comm_free(&s.side);
  s.side = MPI_COMM_NULL;
  s.timeout = 0;
}

bool StallWatch::active() const { return impl_->thread.joinable(); }

void StallWatch::set_step(int64_t step) { impl_->step.store(step, std::memory_order_relaxed); }

void StallWatch::set_phase(Phase phase) {
  const int p = static_cast<int>(phase);
  if (impl_->phase.load(std::memory_order_relaxed) == p) return;
  impl_->phase_since.store(now_ns(), std::memory_order_relaxed);
  impl_->phase.store(p, std::memory_order_relaxed);
}

void StallWatch::begin_wait() {
  Impl& s = *impl_;
  s.seq.store(s.seq.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  s.wait_since.store(now_ns(), std::memory_order_relaxed);
  s.waiting.store(true, std::memory_order_release);
}

void StallWatch::end_wait() { impl_->waiting.store(false, std::memory_order_release); }

RankStatus StallWatch::status() const { return impl_->status(); }

// Note [One abort]
void StallWatch::abort(const std::string& program, const std::string& what, int code) {
  Impl& s = *impl_;
  if (s.program.empty()) s.program = program;
  if (!s.channel || !active() || s.size == 1) s.end_job(what, code);
  const uint64_t hash = std::hash<std::string>{}(what);
  auto defer = [&](uint64_t first_hash) {
    s.ending.store(true);
    if (first_hash != hash) write_line(s.line_of(what));
    std::this_thread::sleep_for(kFallback);  // the claimant's MPI_Abort ends this process
    abort_quietly(code);
  };
  std::optional<uint64_t> first;
  {
    std::lock_guard lock(s.mu);
    if (!s.claims.empty()) first = s.claims.front().second;
  }
  if (first) defer(*first);  // another rank is ending the job already
  // The claims' buffers and requests live until the process ends, which is soon.
  static Message claim;
  claim.type = kClaim;
  claim.hash = hash;
  for (int r = 0; r < s.size; ++r) {
    if (r == s.rank) continue;
    MPI_Request request = MPI_REQUEST_NULL;
    if (MPI_Isend(&claim, 8, MPI_INT64_T, r, kTag, s.side, &request) == MPI_SUCCESS)
      MPI_Request_free(&request);
  }
  s.cv.notify_all();
  std::this_thread::sleep_for(kClaimWindow);  // the watchdog thread collects the others' claims
  std::optional<uint64_t> lower;
  {
    std::lock_guard lock(s.mu);
    for (const auto& [from, h] : s.claims)
      if (from < s.rank && !lower) lower = h;
  }
  if (lower) defer(*lower);
  s.end_job(what, code);
}

}  // namespace ddpv
