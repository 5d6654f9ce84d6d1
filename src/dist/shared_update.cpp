// SharedUpdate: one copy of the parameters and momentum per node in POSIX shared memory, next
// to every local rank's gradient arena; each rank sums and updates its slice (Note [Shared
// update]).
#include "ddpv/dist/shared_update.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

#include "ddpv/core/clock.hpp"
#include "ddpv/core/log.hpp"
#include "ddpv/nn/model.hpp"
#include "dist/mpi_check.hpp"

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
// Checkpoints read the shared arenas on rank 0 after a step, when they are complete.
// The memory is made by local rank 0 with shm_open and reserved with posix_fallocate, so a
// full /dev/shm gives an error at start-up (then every rank keeps its replica and the
// allreduce) rather than a SIGBUS later; the name is unlinked once every local rank has mapped
// it, so nothing is left in /dev/shm, even after a crash. --no-shared-update turns it off.

namespace {

constexpr size_t kPage = 4096;
constexpr int64_t kSliceAlign = 16;  // floats: one 64-byte line

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

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

  ~Impl() {
    if (cross != MPI_COMM_NULL) MPI_Comm_free(&cross);
    if (local != MPI_COMM_NULL) MPI_Comm_free(&local);
  }

  void barrier() const {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    DDPV_MPI_CHECK(MPI_Barrier(local));
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
  s->local_rank = world.local_rank();
  s->local_size = world.local_size();
  s->nodes = world.size() / world.local_size();
  s->count = model.param_count();
  DDPV_MPI_CHECK(MPI_Comm_dup(world.impl().local, &s->local));
  if (s->nodes > 1) {
    DDPV_MPI_CHECK(MPI_Comm_split(mpi_world_comm(world), s->local_rank, world.rank(), &s->cross));
  }

  // Parameters, momentum, then one gradient arena per local rank, each on its own pages.
  const size_t arena =
      round_up(std::max<size_t>(static_cast<size_t>(s->count) * sizeof(float), 1), kPage);
  const size_t bytes = (2 + static_cast<size_t>(s->local_size)) * arena;
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

  char* base = s->shm.data();
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
  for (const ParamSpan& span : model.decay_spans()) {
    const int64_t b = std::max(span.offset, s->begin);
    const int64_t e = std::min(span.offset + span.count, s->end);
    if (b < e) s->spans.push_back({b, e - b, span.decay});
  }
  return std::unique_ptr<SharedUpdate>(new SharedUpdate(std::move(s)));
}

double SharedUpdate::step(const SgdConfig& cfg) {
  Impl& s = *impl_;
  auto t = Clock::now();
  s.barrier();  // every local gradient arena is final
  double waited = seconds_since(t);
  if (s.nodes == 1) {
    s.backend->sgd_update_sum(cfg, s.spans, s.count, s.params, s.grads, s.momentum);
  } else {
    // The node's sum of the slice goes into this rank's own arena (each rank writes only its
    // slice there, and reads only its slice of the others), then across the nodes.
    for (int64_t i = s.begin; i < s.end; ++i)
      s.own_grad[i] = pairwise_sum(s.grads.data(), s.grads.size(), i);
    t = Clock::now();
    DDPV_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, s.own_grad + s.begin,
                                 static_cast<int>(s.end - s.begin), MPI_FLOAT, MPI_SUM, s.cross));
    waited += seconds_since(t);
    s.backend->sgd_update_sum(cfg, s.spans, s.count, s.params, s.summed, s.momentum);
  }
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
