// World and the MPI communicator under real Open MPI: broadcast, allreduce of every type and
// op, asynchronous launches, and the gradient reducer's cross-rank order and sums.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "ddpv/backend/backend.hpp"
#include "ddpv/core/dtype.hpp"
#include "ddpv/core/rng.hpp"
#include "ddpv/dist/communicator.hpp"
#include "ddpv/dist/grad_reducer.hpp"
#include "ddpv/dist/world.hpp"

namespace ddpv {
namespace {

// The value rank r contributes at index i; expected reductions are computed from it by loops.
float value(int r, int64_t i) { return static_cast<float>((r + 1) * ((i % 17) - 8)) * 0.25f; }

class CommTest : public ::testing::TestWithParam<MpiProgress> {
 protected:
  World world_;
  std::unique_ptr<Communicator> comm_ = make_mpi_communicator(world_, GetParam());
};

TEST(World, RankSizeAndNodeLocalRank) {
  World world;
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(world.rank(), rank);
  EXPECT_EQ(world.size(), size);
  // mpirun here starts every rank on this one host.
  EXPECT_EQ(world.local_size(), size);
  EXPECT_EQ(world.local_rank(), rank);
  // One GPU per rank: the local rank among as many as there are ranks, GPU 0 where a
  // scheduler shows each rank one GPU alone (or none: a CPU run).
  EXPECT_EQ(world.device_index(size), world.local_rank());
  EXPECT_EQ(world.device_index(size + 3), world.local_rank());
  EXPECT_EQ(world.device_index(1), 0);
  EXPECT_EQ(world.device_index(0), 0);
  if (size > 2) {  // more ranks on this host than GPUs: refused alike on every rank
    try {
      (void)world.device_index(2);
      ADD_FAILURE() << size << " ranks were given 2 GPUs";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(size) + " ranks run on host"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("only 2 visible GPUs"), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(world.host().empty());
  EXPECT_EQ(error_rank(), rank);
  EXPECT_TRUE(world.thread_multiple());

  int64_t v[2] = {world.rank(), 1};
  world.allreduce_sum(v, 2);
  EXPECT_EQ(v[0], int64_t{size} * (size - 1) / 2);
  EXPECT_EQ(v[1], size);
  int64_t m = world.rank();
  world.allreduce_max(&m, 1);
  EXPECT_EQ(m, size - 1);
  double d = 0.5;
  world.allreduce_sum(&d, 1);
  EXPECT_DOUBLE_EQ(d, 0.5 * size);
  char id[128];
  for (int i = 0; i < 128; ++i) id[i] = static_cast<char>(world.rank() == size - 1 ? i : 0);
  world.broadcast_bytes(id, sizeof(id), size - 1);  // like a ncclUniqueId from its root
  for (int i = 0; i < 128; ++i) ASSERT_EQ(id[i], static_cast<char>(i));
  world.barrier();
}

TEST_P(CommTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < comm_->size(); ++root) {
    std::vector<float> buf(1000);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = value(comm_->rank(), static_cast<int64_t>(i));
    comm_->broadcast(buf.data(), buf.size() * sizeof(float), root);
    for (size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], value(root, static_cast<int64_t>(i)));
  }
}

TEST_P(CommTest, AllreduceSumAvgMaxOfEveryType) {
  const int w = comm_->size(), r = comm_->rank();
  const int64_t n = 3001;
  std::vector<float> f(n), favg(n), fmax(n);
  std::vector<double> d(n);
  std::vector<int64_t> l(n);
  std::vector<int32_t> k(n);
  for (int64_t i = 0; i < n; ++i) {
    f[i] = favg[i] = fmax[i] = value(r, i);
    d[i] = value(r, i);
    l[i] = (int64_t{1} << 40) * r + i;
    k[i] = r - static_cast<int32_t>(i);
  }
  comm_->allreduce(f.data(), n, ReduceOp::kSum);
  comm_->allreduce(favg.data(), n, ReduceOp::kAvg);
  comm_->allreduce(fmax.data(), n, CommType::kF32, ReduceOp::kMax);
  comm_->allreduce(d.data(), n, ReduceOp::kSum);
  comm_->allreduce(l.data(), n, ReduceOp::kSum);
  comm_->allreduce(k.data(), n, CommType::kI32, ReduceOp::kSum);
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0, mx = -1e30;
    for (int q = 0; q < w; ++q) {
      sum += value(q, i);
      mx = std::max(mx, static_cast<double>(value(q, i)));
    }
    // Values are multiples of 0.25 with small magnitude: every order of summation is exact.
    ASSERT_EQ(f[i], static_cast<float>(sum)) << i;
    ASSERT_EQ(favg[i], static_cast<float>(sum / w)) << i;
    ASSERT_EQ(fmax[i], static_cast<float>(mx)) << i;
    ASSERT_EQ(d[i], sum) << i;
    ASSERT_EQ(l[i], (int64_t{1} << 40) * (int64_t{w} * (w - 1) / 2) + w * i) << i;
    ASSERT_EQ(k[i], w * (w - 1) / 2 - w * static_cast<int32_t>(i)) << i;
  }
  std::vector<int64_t> bad(4);
  EXPECT_THROW(comm_->allreduce(bad.data(), 4, ReduceOp::kAvg), Error);
  comm_->barrier();
}

// bf16 (Note [bf16 over MPI]): small multiples of 0.25 are exact in bf16, so sums, averages
// (W is a power of two here) and maxima must be exact; random values must be within the
// rounding of W - 1 additions of the exact sum, and the same bits on every rank.
TEST_P(CommTest, Bf16AllreduceIsExactWhereBf16IsAndWithinItsRoundingElsewhere) {
  const int w = comm_->size(), r = comm_->rank();
  const int64_t n = 5003;
  std::vector<uint16_t> sum(n), avg(n), mx(n), noisy(n);
  std::vector<float> mine(n);  // this rank's random values, already rounded to bf16
  Rng rng(derive_key(11, static_cast<uint64_t>(r)));
  for (int64_t i = 0; i < n; ++i) {
    sum[i] = avg[i] = mx[i] = f32_to_bf16(value(r, i));
    noisy[i] = f32_to_bf16(rng.normal() * (1.0f + static_cast<float>(i % 7)));
    mine[i] = bf16_to_f32(noisy[i]);
  }
  comm_->allreduce(sum.data(), n, CommType::kBF16, ReduceOp::kSum);
  comm_->allreduce(avg.data(), n, CommType::kBF16, ReduceOp::kAvg);
  auto work = comm_->allreduce_async(mx.data(), n, CommType::kBF16, ReduceOp::kMax);
  auto work2 = comm_->allreduce_async(noisy.data(), n, CommType::kBF16, ReduceOp::kSum);
  comm_->progress();
  work->wait();
  work2->wait();
  // Every rank's random values, for the exact sums.
  std::vector<float> all(static_cast<size_t>(n) * w, 0.0f);
  std::copy(mine.begin(), mine.end(), all.begin() + static_cast<int64_t>(r) * n);
  comm_->allreduce(all.data(), static_cast<int64_t>(all.size()), ReduceOp::kSum);
  for (int64_t i = 0; i < n; ++i) {
    double s = 0, m = -1e30, exact = 0, magnitude = 0;
    for (int q = 0; q < w; ++q) {
      s += value(q, i);
      m = std::max(m, static_cast<double>(value(q, i)));
      const double x = all[static_cast<size_t>(q * n + i)];
      exact += x;
      magnitude += std::abs(x);
    }
    ASSERT_EQ(bf16_to_f32(sum[i]), static_cast<float>(s)) << i;
    ASSERT_EQ(bf16_to_f32(avg[i]), static_cast<float>(s / w)) << i;
    ASSERT_EQ(bf16_to_f32(mx[i]), static_cast<float>(m)) << i;
    // Each of the W - 1 additions rounds by at most half a unit in the last of bf16's 8
    // significant bits (2^-8 relative) of a partial sum no larger than the sum of magnitudes.
    ASSERT_LE(std::abs(bf16_to_f32(noisy[i]) - exact), (w - 1) * std::ldexp(magnitude, -8) + 1e-30)
        << i;
  }
  const uint64_t h = hash_bytes(noisy.data(), noisy.size() * sizeof(uint16_t));
  uint64_t root = h;
  comm_->broadcast(&root, sizeof root, 0);
  EXPECT_EQ(h, root) << "ranks hold different bf16 sums";
}

TEST_P(CommTest, AsyncLaunchesCompleteInOrderAndMixWithBlockingCalls) {
  const int w = comm_->size(), r = comm_->rank();
  std::vector<std::vector<float>> bufs;
  for (int j = 0; j < 6; ++j) {
    std::vector<float> b(static_cast<size_t>(1000 * (j + 1)));
    for (size_t i = 0; i < b.size(); ++i) b[i] = value(r, static_cast<int64_t>(i) + j);
    bufs.push_back(std::move(b));
  }
  std::vector<std::unique_ptr<CommWork>> work;
  for (int j = 0; j < 3; ++j)
    work.push_back(comm_->allreduce_async(bufs[j].data(), static_cast<int64_t>(bufs[j].size()),
                                          CommType::kF32, ReduceOp::kSum));
  // A blocking call behind launched ones must not overtake them.
  comm_->allreduce(bufs[3].data(), static_cast<int64_t>(bufs[3].size()), ReduceOp::kSum);
  for (int j = 4; j < 6; ++j)
    work.push_back(comm_->allreduce_async(bufs[j].data(), static_cast<int64_t>(bufs[j].size()),
                                          CommType::kF32, ReduceOp::kAvg));
  comm_->progress();
  for (auto& h : work) h->wait();
  for (int j = 0; j < 6; ++j) {
    for (size_t i = 0; i < bufs[j].size(); ++i) {
      double sum = 0;
      for (int q = 0; q < w; ++q) sum += value(q, static_cast<int64_t>(i) + j);
      const double want = j >= 4 ? sum / w : sum;
      ASSERT_EQ(bufs[j][i], static_cast<float>(want)) << "buffer " << j << " index " << i;
    }
  }
}

// Records the collectives a reducer launches, then forwards them to the real communicator.
class Recorder final : public Communicator {
 public:
  explicit Recorder(Communicator& inner) : inner_(inner) {}
  std::vector<int64_t> trace;  // offset, count of each launch, relative to `base`
  const float* base = nullptr;
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Device device() const override { return inner_.device(); }
  std::string name() const override { return "recorder"; }
  void broadcast(void* d, size_t b, int root) override { inner_.broadcast(d, b, root); }
  void allreduce(void* d, int64_t n, CommType t, ReduceOp op) override {
    record(d, n);  // the reducer's last bucket (Note [The last bucket blocks])
    inner_.allreduce(d, n, t, op);
  }
  void barrier() override { inner_.barrier(); }
  void progress() override { inner_.progress(); }
  std::unique_ptr<CommWork> allreduce_async(void* d, int64_t n, CommType t, ReduceOp op) override {
    record(d, n);
    return inner_.allreduce_async(d, n, t, op);
  }

 private:
  void record(void* d, int64_t n) {
    trace.push_back(static_cast<float*>(d) - base);
    trace.push_back(n);
  }
  Communicator& inner_;
};

TEST_P(CommTest, ReducerSumsAndIssuesTheSameSequenceOnEveryRank) {
  const int w = comm_->size(), r = comm_->rank();
  // 40 tensors of uneven sizes, 1.9 MB in all.
  std::vector<ArenaEntry> params;
  int64_t off = 0;
  for (int i = 0; i < 40; ++i) {
    ArenaEntry e;
    e.name = std::to_string(i);  // (a "p" + prefix trips GCC 12 -Wrestrict at -O3)
    e.count = (i % 9 == 0) ? 100000 : 1000 * (i % 4 + 1);
    e.extent = e.count;
    e.offset = off;
    e.shape = Shape{e.count};
    off += e.count;
    params.push_back(e);
  }
  for (double mb : {0.0, 0.25, 1.0, 25.0}) {
    for (bool overlap : {true, false}) {
      std::vector<float> grad(static_cast<size_t>(off));
      for (int64_t i = 0; i < off; ++i) grad[static_cast<size_t>(i)] = value(r, i);
      Recorder rec(*comm_);
      rec.base = grad.data();
      GradReducer reducer(BucketPlan(params, mb), rec, grad.data(), {.overlap = overlap});
      // Ranks report in different orders (odd ranks backwards); launches must not differ.
      for (int k = 0; k < 40; ++k) reducer.mark_ready(r % 2 ? 39 - k : k);
      reducer.wait();
      for (int64_t i = 0; i < off; ++i) {
        double sum = 0;
        for (int q = 0; q < w; ++q) sum += value(q, i);
        ASSERT_EQ(grad[static_cast<size_t>(i)], static_cast<float>(sum)) << mb << " " << i;
      }
      EXPECT_EQ(static_cast<int>(rec.trace.size()), 2 * reducer.plan().size());
      // Same trace everywhere: compare with rank 0's.
      std::vector<int64_t> root = rec.trace;
      comm_->broadcast(root.data(), root.size() * sizeof(int64_t), 0);
      EXPECT_EQ(rec.trace, root) << "bucket_mb " << mb << " overlap " << overlap;
    }
  }
}

// Note [bf16 reduction]: the reducer rounds buckets to bf16, sums those and writes f32 sums
// back into the arena. Multiples of 0.25 survive exactly; random gradients come back within
// the rounding of the inputs (2^-8 relative each) and of the W - 1 additions.
TEST_P(CommTest, ReducerInBf16SumsWithinBf16RoundingIntoTheF32Arena) {
  const int w = comm_->size(), r = comm_->rank();
  auto backend = make_backend(BackendOptions{.threads = 1});
  std::vector<ArenaEntry> params;
  int64_t off = 0;
  for (int i = 0; i < 12; ++i) {
    ArenaEntry e;
    e.name = std::to_string(i);
    e.count = 3000 + 1000 * (i % 5);
    e.extent = e.count;
    e.offset = off;
    e.shape = Shape{e.count};
    off += e.count;
    params.push_back(e);
  }
  for (bool exact_values : {true, false}) {
    std::vector<float> grad(static_cast<size_t>(off)), everyone(static_cast<size_t>(off * w));
    Rng rng(derive_key(23, static_cast<uint64_t>(r)));
    for (int64_t i = 0; i < off; ++i) {
      grad[static_cast<size_t>(i)] = exact_values ? value(r, i) : rng.normal() * 1e-3f;
      everyone[static_cast<size_t>(r * off + i)] = grad[static_cast<size_t>(i)];
    }
    comm_->allreduce(everyone.data(), static_cast<int64_t>(everyone.size()), ReduceOp::kSum);
    GradReducer reducer(BucketPlan(params, 0.02), *comm_, grad.data(),
                        {.reduce_type = CommType::kBF16, .backend = backend.get()});
    ASSERT_GT(reducer.plan().size(), 2);
    for (int k = 0; k < 12; ++k) reducer.mark_ready(k);
    reducer.wait();
    int64_t rounded = 0;
    for (int64_t i = 0; i < off; ++i) {
      double exact = 0, magnitude = 0;
      for (int q = 0; q < w; ++q) {
        const double x = everyone[static_cast<size_t>(q * off + i)];
        exact += x;
        magnitude += std::abs(x);
      }
      const float got = grad[static_cast<size_t>(i)];
      if (exact_values) {
        ASSERT_EQ(got, static_cast<float>(exact)) << i;
      } else {
        ASSERT_LE(std::abs(got - exact), w * std::ldexp(magnitude, -8)) << i;
        rounded += got != static_cast<float>(exact);
      }
    }
    if (!exact_values) {
      EXPECT_GT(rounded, off / 2) << "random gradients came back unrounded";
    }
  }
}

std::string progress_name(const ::testing::TestParamInfo<MpiProgress>& info) {
  return info.param == MpiProgress::kThread ? "Thread" : "NonBlocking";
}

INSTANTIATE_TEST_SUITE_P(Progress, CommTest,
                         ::testing::Values(MpiProgress::kThread, MpiProgress::kNonBlocking),
                         progress_name);

}  // namespace
}  // namespace ddpv
