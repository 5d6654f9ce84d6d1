// SharedUpdate: one copy of the parameters and momentum per node in POSIX shared memory, next
// to every local rank's gradient arena; each rank sums and updates its slice (Note [Shared
// update]).
#include "ddpv/dist/shared_update.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

#include "ddpv/core/clock.hpp"
#include "ddpv/core/log.hpp"
#include "ddpv/dist/stall_watch.hpp"
#include "ddpv/nn/model.hpp"
#include "dist/backoff.hpp"
#include "dist/mpi_check.hpp"
#include "dist/mpi_wait.hpp"

namespace ddpv {

// Note [Shared update]: with the CPU backend, the ranks of a node share its memory, yet a
// replica per rank means each step copies every gradient through MPI's shared-memory buffers
// (an allreduce of the whole arena, 1.7 MiB for lenet) and then repeats the same SGD update
// on every rank. Instead, the node keeps one parameter arena and one momentum arena in shared
// memory, beside one gradient arena per local rank, and after backward
//   1. a barrier of the node: every local gradient arena is final;
//   2. local rank l takes slice l of the arena (cut at 64-byte lines, so no line is written by
//      two ranks), sums that slice of every local rank's gradients (pairwise_sum), and
//      applies SGD to that slice of the parameters and momentum, in one pass (sgd_update_sum);
//      across nodes, the slice's node sum is first allreduced with the same slice of the other
//      nodes (the ranks of the same local rank), then updated;
//   3. a barrier of the node: every slice is updated before any rank's next forward.
// Each rank reads the gradients of one slice from every arena, and writes only its slice of
// the parameters and momentum: per step, a rank moves about 3 arena-sizes of bytes / L against
// about 9 for the allreduce and its own full update, and the SGD arithmetic is split L ways.
// On 2 ranks a sum of two floats is the same in either order, so the parameters are bit for
// bit those of the allreduce; pairwise_sum's order makes 4 ranks match Open MPI's 4-rank
// allreduce too, and 2 nodes x 2 ranks the 4 ranks of one node. Other counts differ from MPI
// by rounding.
// The barriers are MPI_Barrier on the node; MPI orders the memory accesses around them on the
// ranks (x86 stores become visible in program order; the fences keep the compiler's order).
// On one node, steps 1-3 run as claims instead (Note [Updating while others finish]).
// Checkpoints read the shared arenas on rank 0 after a step, when they are complete.
// The memory is made by local rank 0 with shm_open and reserved with posix_fallocate, so a
// full /dev/shm gives an error at start-up (then every rank keeps its replica and the
// allreduce) rather than a SIGBUS later; the name is unlinked once every local rank has mapped
// it, so nothing is left in /dev/shm, even after a crash. --no-shared-update turns it off.

// Note [Updating while others finish]: on one node, a rank that finished its backward used to
// wait at the first barrier for the slowest rank (a tenth of a lenet step on this project's
// 2-core VM, from per-step jitter), and the slowest then still had its own slice of the update
// ahead of it, on the critical path of every step. Yet backward writes
// the gradient arena front to back (Note [Reverse layer order]): lenet's classifier, 88% of its
// parameters, is final in every rank's arena long before its backward ends. So the arena is cut
// into chunks of kChunkFloats, and the update is a queue of them, claimed in arena order from a
// counter in the shared memory: a rank takes the next chunk once every local rank has reported
// (through ready_fn, or by entering step) the gradients of that whole chunk final, sums and
// updates it, and counts it done; a step ends for everyone when all its chunks are done. The
// early rank thus updates the classifier while the late one is still in its convolutions, and
// the late rank finds little left. Which rank updates a chunk changes nothing: each parameter
// is updated once, from the same sums in the same order (pairwise_sum), so the results are bit
// for bit those of the slices. Counters only grow (step s owns claims [s C, (s + 1) C) of C
// chunks), so nothing is reset between steps; a rank's report packs its step and how far its
// gradients are final into one word. A rank can enter step s + 1 only after every chunk of
// step s is done, so it never overwrites a gradient that is still to be read. Waiting follows
// Note [Waiting without spinning]: a spin with a pause and a yield of the core now and then,
// for the runs with more ranks than cores, and sleeps once no chunk has moved for a while.
// Alternated against the barrier path in one binary, 2-rank lenet ran faster (the figures:
// docs/performance.md, "Distributed").

namespace {

constexpr size_t kPage = 4096;
constexpr int64_t kSliceAlign = 16;  // floats: one 64-byte line
// The control block's words (int64) lie one per 64-byte line.
constexpr size_t kWordStride = 8;
// The control block at the start of the shared memory: words 0 and 8 count the chunks claimed
// and done over all steps; word 16 + 8 l is local rank l's report.
constexpr size_t kClaimedWord = 0, kDoneWord = kWordStride, kReportWord = 2 * kWordStride;

std::atomic_ref<int64_t> word(int64_t* control, size_t index) {
  return std::atomic_ref<int64_t>(control[index]);
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// The parts of the weight-decay runs that lie in [begin, end).
std::vector<ParamSpan> spans_within(const std::vector<ParamSpan>& spans, int64_t begin,
                                    int64_t end) {
  std::vector<ParamSpan> out;
  for (const ParamSpan& span : spans) {
    const int64_t b = std::max(span.offset, begin);
    const int64_t e = std::min(span.offset + span.count, end);
    if (b < e) out.push_back({b, e - b, span.decay});
  }
  return out;
}

std::string mib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

// A mapping of a shared memory object, unmapped when destroyed.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* base, size_t bytes) : base_(base), bytes_(bytes) {}
  ~Mapping() {
    if (base_ != nullptr) munmap(base_, bytes_);
  }
  Mapping(Mapping&& o) noexcept : base_(std::exchange(o.base_, nullptr)), bytes_(o.bytes_) {}
  Mapping& operator=(Mapping&& o) noexcept {
    std::swap(base_, o.base_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  char* data() const { return static_cast<char*>(base_); }
  size_t size() const { return bytes_; }

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0;
};

// Maps the shared memory object `name`, creating it with `bytes` reserved when `create`.
// Returns what failed, or "" when *out holds the mapping. A created object whose set-up failed
// is unlinked again.
std::string map_object(const char* name, size_t bytes, bool create, Mapping* out) {
  const int fd =
      create ? shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600) : shm_open(name, O_RDWR, 0);
  if (fd < 0) return std::string("shm_open ") + name + ": " + std::strerror(errno);
  std::string err;
  if (create) {
    const int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (rc != 0) err = "reserving " + mib(bytes) + " in /dev/shm: " + std::strerror(rc);
  }
  if (err.empty()) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      err = std::string("mmap of ") + mib(bytes) + ": " + std::strerror(errno);
    } else {
      *out = Mapping(p, bytes);
    }
  }
  close(fd);
  if (create && !err.empty()) shm_unlink(name);
  return err;
}

}  // namespace

struct SharedUpdate::Impl {
  Backend* backend = nullptr;
  StallWatch* watch = nullptr;     // Note [Stall watchdog]
  MPI_Comm local = MPI_COMM_NULL;  // the ranks of this node (a private duplicate)
  MPI_Comm cross = MPI_COMM_NULL;  // this local rank on every node; null on a single node
  int local_rank = 0, local_size = 1, nodes = 1;
  int64_t count = 0, begin = 0, end = 0;  // the arena, and this rank's slice of it
  Mapping shm;
  float* params = nullptr;
  float* momentum = nullptr;
  float* own_grad = nullptr;
  std::vector<const float*> grads;   // every local rank's gradient arena, in local rank order
  std::vector<const float*> summed;  // across nodes: {own_grad}, which holds the slice's sum
  std::vector<ParamSpan> spans;      // the weight-decay runs within [begin, end)
  // One node (Note [Updating while others finish]): the control block, the chunks' weight-
  // decay runs, this rank's step and how far its gradients are final (where each arena entry
  // ends, which entries backward has reported, and the first entry of the arena not yet
  // reported), and its early chunks.
  int64_t* control = nullptr;
  std::vector<std::vector<ParamSpan>> chunk_spans;
  std::vector<int64_t> entry_end;
  std::vector<char> final_entry;
  size_t next_entry = 0;
  int64_t step_no = 0, early = 0;

  int64_t chunks() const { return static_cast<int64_t>(chunk_spans.size()); }
  int64_t chunk_end(int64_t j) const { return std::min(count, (j + 1) * kChunkFloats); }
  // Local rank l's report: its step and how far its gradients are final, in one word.
  std::atomic_ref<int64_t> report_of(int l) const {
    return word(control, kReportWord + kWordStride * static_cast<size_t>(l));
  }
  // Reports that this rank's gradients are final in [0, upto) for the current step.
  void report(int64_t upto) {
    report_of(local_rank).store(step_no * (count + 1) + upto, std::memory_order_release);
  }
  // How far every local rank's gradients are final in the current step.
  int64_t final_everywhere() const {
    int64_t least = count;
    for (int l = 0; l < local_size && least > 0; ++l) {
      const int64_t r = report_of(l).load(std::memory_order_acquire) - step_no * (count + 1);
      least = std::min(least, std::max<int64_t>(r, 0));  // behind: a report of an older step
    }
    return least;
  }

  ~Impl() {
    if (cross != MPI_COMM_NULL) MPI_Comm_free(&cross);
    if (local != MPI_COMM_NULL) MPI_Comm_free(&local);
  }

  void barrier() const {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    WaitScope scope(watch);
    arrive(local);  // MPI_Ibarrier, waited on as Note [Waiting without spinning] says
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
};

SharedUpdate::SharedUpdate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SharedUpdate::~SharedUpdate() = default;

std::unique_ptr<SharedUpdate> SharedUpdate::create(const World& world, Model& model,
                                                   std::string* why_not) {
  auto none = [why_not](std::string why) {
    if (why_not != nullptr) *why_not = std::move(why);
    return std::unique_ptr<SharedUpdate>();
  };
  if (world.size() < 2) return none("one rank");
  if (model.backend().device() != Device::kCpu) return none("the parameters are in GPU memory");
  int64_t extremes[2] = {world.local_size(), -static_cast<int64_t>(world.local_size())};
  world.allreduce_max(extremes, 2);
  if (extremes[0] != -extremes[1]) {
    return none(detail::concat("the nodes run between ", -extremes[1], " and ", extremes[0],
                               " ranks each"));
  }

  auto s = std::make_unique<Impl>();
  s->backend = &model.backend();
  s->watch = world.stall_watch();
  s->local_rank = world.local_rank();
  s->local_size = world.local_size();
  s->nodes = world.size() / world.local_size();
  s->count = model.param_count();
  DDPV_MPI_CHECK(MPI_Comm_dup(world.impl().local, &s->local));
  if (s->nodes > 1) {
    DDPV_MPI_CHECK(MPI_Comm_split(mpi_world_comm(world), s->local_rank, world.rank(), &s->cross));
  }

  // The control block, parameters, momentum, then one gradient arena per local rank, each on
  // its own pages. The memory starts zeroed: no claims, no reports.
  const size_t arena =
      round_up(std::max<size_t>(static_cast<size_t>(s->count) * sizeof(float), 1), kPage);
  const size_t control =
      round_up((kReportWord + kWordStride * static_cast<size_t>(s->local_size)) * 8, kPage);
  const size_t bytes = control + (2 + static_cast<size_t>(s->local_size)) * arena;
  char name[64] = {};
  std::string err;
  if (s->local_rank == 0) {
    std::random_device rd;
    std::snprintf(name, sizeof name, "/ddpv-%ld-%08x%08x", static_cast<long>(getpid()), rd(), rd());
    err = map_object(name, bytes, /*create=*/true, &s->shm);
    if (!err.empty()) name[0] = '\0';
  }
  DDPV_MPI_CHECK(MPI_Bcast(name, sizeof name, MPI_CHAR, 0, s->local));
  bool failed = !err.empty() || name[0] == '\0';
  if (s->local_rank != 0 && !failed) {
    err = map_object(name, bytes, /*create=*/false, &s->shm);
    failed = !err.empty();
  }
  s->barrier();  // every local rank has mapped the object, or given up
  if (s->local_rank == 0 && name[0] != '\0') shm_unlink(name);
  if (!err.empty()) {
    DDPV_WARN("shared update: ", err, "; each rank keeps a copy of the model instead");
  }
  // [ranks that could not use the memory, ranks that said why]
  int64_t failures[2] = {failed ? 1 : 0, err.empty() ? 0 : 1};
  world.allreduce_sum(failures, 2);
  if (failures[0] > 0) {
    return none(
        detail::concat("shared memory failed on ", failures[1], " rank(s), see the warning"));
  }

  s->control = reinterpret_cast<int64_t*>(s->shm.data());
  char* base = s->shm.data() + control;
  s->params = reinterpret_cast<float*>(base);
  s->momentum = reinterpret_cast<float*>(base + arena);
  for (int l = 0; l < s->local_size; ++l)
    s->grads.push_back(reinterpret_cast<const float*>(base + (2 + static_cast<size_t>(l)) * arena));
  s->own_grad = reinterpret_cast<float*>(base + (2 + static_cast<size_t>(s->local_rank)) * arena);
  s->summed = {s->own_grad};
  model.bind_arenas(s->params, s->own_grad, s->momentum, /*copy_values=*/s->local_rank == 0);
  s->barrier();  // local rank 0's copy is in place before any rank reads a parameter

  auto edge = [&](int l) {
    return l == s->local_size ? s->count : s->count * l / s->local_size / kSliceAlign * kSliceAlign;
  };
  s->begin = edge(s->local_rank);
  s->end = edge(s->local_rank + 1);
  const std::vector<ParamSpan> decay = model.decay_spans();
  s->spans = spans_within(decay, s->begin, s->end);
  if (s->nodes == 1) {
    s->chunk_spans.resize(static_cast<size_t>((s->count + kChunkFloats - 1) / kChunkFloats));
    for (int64_t j = 0; j < s->chunks(); ++j)
      s->chunk_spans[static_cast<size_t>(j)] =
          spans_within(decay, j * kChunkFloats, s->chunk_end(j));
    for (const ArenaEntry& e : model.params()) s->entry_end.push_back(e.offset + e.extent);
    s->final_entry.assign(s->entry_end.size(), 0);
  }
  return std::unique_ptr<SharedUpdate>(new SharedUpdate(std::move(s)));
}

GradReadyFn SharedUpdate::ready_fn() {
  Impl& s = *impl_;
  if (s.nodes != 1) return {};
  return [&s](int index) {
    s.final_entry[static_cast<size_t>(index)] = 1;
    if (static_cast<size_t>(index) != s.next_entry) return;  // the prefix did not grow
    while (s.next_entry < s.entry_end.size() && s.final_entry[s.next_entry]) ++s.next_entry;
    s.report(s.entry_end[s.next_entry - 1]);
  };
}

int64_t SharedUpdate::early_chunks() const { return impl_->early; }

// Note [Updating while others finish]
double SharedUpdate::step_one_node(const SgdConfig& cfg) {
  Impl& s = *impl_;
  s.report(s.count);  // every gradient of this rank is final
  const int64_t last = (s.step_no + 1) * s.chunks();
  WaitScope scope(s.watch);
  double waited = 0;
  auto t = Clock::now();
  Backoff backoff;
  std::atomic_ref<int64_t> claimed = word(s.control, kClaimedWord);
  std::atomic_ref<int64_t> done = word(s.control, kDoneWord);
  for (int64_t c = claimed.load(std::memory_order_acquire); c < last;) {
    const int64_t j = c - s.step_no * s.chunks();
    const int64_t final_end = s.final_everywhere();
    if (s.chunk_end(j) > final_end) {  // some rank is still writing this chunk's gradients
      backoff.pause();
      c = claimed.load(std::memory_order_acquire);
      continue;
    }
    if (!claimed.compare_exchange_strong(c, c + 1, std::memory_order_acq_rel)) continue;
    waited += seconds_since(t);
    s.backend->sgd_update_sum(cfg, s.chunk_spans[static_cast<size_t>(j)], s.count, s.params,
                              s.grads, s.momentum);
    if (final_end < s.count) ++s.early;
    done.fetch_add(1, std::memory_order_release);
    backoff.reset();
    t = Clock::now();
    c = claimed.load(std::memory_order_acquire);
  }
  while (done.load(std::memory_order_acquire) < last) backoff.pause();
  ++s.step_no;
  std::fill(s.final_entry.begin(), s.final_entry.end(), 0);
  s.next_entry = 0;
  return waited + seconds_since(t);
}

double SharedUpdate::step(const SgdConfig& cfg) {
  Impl& s = *impl_;
  if (s.nodes == 1) return step_one_node(cfg);
  auto t = Clock::now();
  s.barrier();  // every local gradient arena is final
  double waited = seconds_since(t);
  // The node's sum of the slice goes into this rank's own arena (each rank writes only its
  // slice there, and reads only its slice of the others), then across the nodes.
  for (int64_t i = s.begin; i < s.end; ++i)
    s.own_grad[i] = pairwise_sum(s.grads.data(), s.grads.size(), i);
  t = Clock::now();
  {
    WaitScope scope(s.watch);
    arrive(s.cross);  // the other nodes' ranks, before the blocking allreduce
    DDPV_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, s.own_grad + s.begin,
                                 static_cast<int>(s.end - s.begin), MPI_FLOAT, MPI_SUM, s.cross));
  }
  waited += seconds_since(t);
  s.backend->sgd_update_sum(cfg, s.spans, s.count, s.params, s.summed, s.momentum);
  t = Clock::now();
  s.barrier();  // every slice is updated before any rank's next forward
  return waited + seconds_since(t);
}

std::string SharedUpdate::summary() const {
  const Impl& s = *impl_;
  return detail::concat("shared update (", s.local_size, " ranks per node x ", s.nodes,
                        s.nodes == 1 ? " node" : " nodes", ", ", mib(s.shm.size()),
                        " of shared memory per node)");
}

}  // namespace ddpv
