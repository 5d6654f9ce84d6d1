// GradReducer against a recording communicator: launch timing, plan order, the blocking last
// bucket, no-overlap, accumulation (set_sync) and misuse.
#include <gtest/gtest.h>

#include <vector>

#include "ddpv/dist/grad_reducer.hpp"

namespace ddpv {
namespace {

// Pretends to be one of `world` ranks that all hold the same gradients: the sum is the buffer
// times world, applied when the handle is waited on.
class RecordingComm final : public Communicator {
 public:
  explicit RecordingComm(int world) : world_(world) {}
  struct Launch {
    int64_t offset, count;
    bool blocking;
    int waits_before;  // handles waited on when it was issued
  };
  std::vector<Launch> launches;
  int waits = 0;
  const float* base = nullptr;

  int rank() const override { return 0; }
  int size() const override { return world_; }
  Device device() const override { return Device::kCpu; }
  std::string name() const override { return "recording"; }
  void broadcast(void*, size_t, int) override {}
  void allreduce(void* data, int64_t count, CommType type, ReduceOp op) override {
    EXPECT_EQ(type, CommType::kF32);
    EXPECT_EQ(op, ReduceOp::kSum);
    launches.push_back({static_cast<float*>(data) - base, count, true, waits});
    scale(static_cast<float*>(data), count);
  }
  void barrier() override {}
  std::unique_ptr<CommWork> allreduce_async(void* data, int64_t count, CommType type,
                                            ReduceOp op) override {
    EXPECT_EQ(type, CommType::kF32);
    EXPECT_EQ(op, ReduceOp::kSum);
    launches.push_back({static_cast<float*>(data) - base, count, false, waits});
    return std::make_unique<Work>(this, static_cast<float*>(data), count);
  }
  void scale(float* data, int64_t count) const {
    for (int64_t i = 0; i < count; ++i) data[i] *= static_cast<float>(world_);
  }

 private:
  struct Work final : CommWork {
    Work(RecordingComm* c, float* d, int64_t n) : comm(c), data(d), count(n) {}
    void wait() override {
      if (done) return;
      done = true;
      ++comm->waits;
      comm->scale(data, count);
    }
    RecordingComm* comm;
    float* data;
    int64_t count;
    bool done = false;
  };
  int world_;
};

// Four tensors of 100, 200, 300, 400 floats; bucket_mb 0 gives one bucket each.
std::vector<ArenaEntry> four_tensors() {
  std::vector<ArenaEntry> e;
  int64_t off = 0;
  for (int i = 0; i < 4; ++i) {
    ArenaEntry a;
    a.name = std::to_string(i);  // (a "p" + prefix trips GCC 12 -Wrestrict at -O3)
    a.count = 100 * (i + 1);
    a.shape = Shape{a.count};
    a.extent = a.count;
    a.offset = off;
    off += a.count;
    e.push_back(a);
  }
  return e;
}

struct Fixture {
  std::vector<float> grad = std::vector<float>(1000);
  RecordingComm comm{4};
  Fixture() {
    comm.base = grad.data();
    for (size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(i % 13) - 6.0f;
  }
};

TEST(GradReducer, LaunchesEachBucketWhenReadyInPlanOrder) {
  Fixture f;
  GradReducer r(BucketPlan(four_tensors(), 0), f.comm, f.grad.data());
  const std::vector<float> before = f.grad;
  // Report 2 first, then 0, 1, 3: bucket 2 must wait for 0 and 1.
  r.mark_ready(2);
  EXPECT_EQ(f.comm.launches.size(), 0u);
  r.mark_ready(0);
  ASSERT_EQ(f.comm.launches.size(), 1u);
  r.mark_ready(1);
  ASSERT_EQ(f.comm.launches.size(), 3u);
  // The last bucket waits for wait() (Note [The last bucket blocks]).
  r.mark_ready(3);
  ASSERT_EQ(f.comm.launches.size(), 3u);
  r.wait();
  ASSERT_EQ(f.comm.launches.size(), 4u);
  const int64_t offsets[4] = {0, 100, 300, 600};
  for (int b = 0; b < 4; ++b) {
    EXPECT_EQ(f.comm.launches[b].offset, offsets[b]);
    EXPECT_EQ(f.comm.launches[b].count, 100 * (b + 1));
    EXPECT_EQ(f.comm.launches[b].blocking, b == 3) << b;
  }
  EXPECT_EQ(f.comm.waits, 3);
  for (size_t i = 0; i < f.grad.size(); ++i) ASSERT_EQ(f.grad[i], 4.0f * before[i]) << i;
  EXPECT_FLOAT_EQ(r.grad_scale(), 0.25f);
}

TEST(GradReducer, TheLastBucketBlocksOnceTheOthersAreDone) {
  Fixture f;
  GradReducer r(BucketPlan(four_tensors(), 0), f.comm, f.grad.data());
  for (int i : {0, 1, 2, 3}) r.mark_ready(i);
  r.wait();
  ASSERT_EQ(f.comm.launches.size(), 4u);
  EXPECT_TRUE(f.comm.launches[3].blocking);
  EXPECT_EQ(f.comm.launches[3].waits_before, 3);  // every launched bucket was complete

  // One bucket for everything: nothing goes out during backward; wait() reduces it in place.
  Fixture g;
  const std::vector<float> before = g.grad;
  GradReducer one(BucketPlan(four_tensors(), 25), g.comm, g.grad.data());
  ASSERT_EQ(one.plan().size(), 1);
  for (int i : {3, 2, 1, 0}) one.mark_ready(i);
  EXPECT_EQ(g.comm.launches.size(), 0u);
  one.wait();
  ASSERT_EQ(g.comm.launches.size(), 1u);
  EXPECT_TRUE(g.comm.launches[0].blocking);
  EXPECT_EQ(g.comm.launches[0].count, 1000);
  for (size_t i = 0; i < g.grad.size(); ++i) ASSERT_EQ(g.grad[i], 4.0f * before[i]) << i;
}

TEST(GradReducer, FusedBucketWaitsForAllItsTensors) {
  Fixture f;
  // 0.0015 MiB (1572 bytes) fuses tensors 0 and 1 (400 + 800 bytes); 2 and 3 go alone.
  GradReducer r(BucketPlan(four_tensors(), 0.0015), f.comm, f.grad.data());
  ASSERT_EQ(r.plan().size(), 3);
  auto ready = r.ready_fn();
  ready(1);
  EXPECT_EQ(f.comm.launches.size(), 0u);
  ready(0);
  ASSERT_EQ(f.comm.launches.size(), 1u);
  EXPECT_EQ(f.comm.launches[0].offset, 0);
  EXPECT_EQ(f.comm.launches[0].count, 300);
  ready(2);
  ready(3);
  r.wait();
}

TEST(GradReducer, NoOverlapLaunchesEverythingInWait) {
  Fixture f;
  GradReducer r(BucketPlan(four_tensors(), 0), f.comm, f.grad.data(), {.overlap = false});
  for (int i : {3, 2, 1, 0}) r.mark_ready(i);
  EXPECT_EQ(f.comm.launches.size(), 0u);
  r.wait();
  ASSERT_EQ(f.comm.launches.size(), 4u);
  for (int b = 1; b < 4; ++b) EXPECT_GT(f.comm.launches[b].offset, f.comm.launches[b - 1].offset);
  EXPECT_EQ(f.comm.waits, 3);
  EXPECT_TRUE(f.comm.launches[3].blocking);
}

TEST(GradReducer, AccumulationStepsDoNotCommunicate) {
  Fixture f;
  GradReducer r(BucketPlan(four_tensors(), 0), f.comm, f.grad.data());
  const std::vector<float> before = f.grad;
  r.set_sync(false);
  EXPECT_FALSE(r.ready_fn());
  for (int i = 0; i < 4; ++i) r.mark_ready(i);
  r.wait();
  EXPECT_EQ(f.comm.launches.size(), 0u);
  EXPECT_EQ(f.grad, before);
  r.set_sync(true);
  for (int i = 0; i < 4; ++i) r.mark_ready(i);
  r.wait();
  EXPECT_EQ(f.comm.launches.size(), 4u);
  // A second step reuses the reducer: counts were reset by wait().
  for (int i = 0; i < 4; ++i) r.mark_ready(i);
  r.wait();
  EXPECT_EQ(f.comm.launches.size(), 8u);
}

TEST(GradReducer, WaitLaunchesBucketsNeverReported) {
  Fixture f;
  GradReducer r(BucketPlan(four_tensors(), 0), f.comm, f.grad.data());
  r.mark_ready(0);
  r.mark_ready(2);
  EXPECT_EQ(f.comm.launches.size(), 1u);
  r.wait();
  ASSERT_EQ(f.comm.launches.size(), 4u);
  EXPECT_EQ(f.comm.launches[1].offset, 100);
}

TEST(GradReducer, RejectsMisuse) {
  Fixture f;
  GradReducer r(BucketPlan(four_tensors(), 0), f.comm, f.grad.data());
  r.mark_ready(1);
  EXPECT_THROW(r.mark_ready(1), Error);    // reported twice
  EXPECT_THROW(r.set_sync(false), Error);  // in the middle of a backward
  EXPECT_THROW(r.mark_ready(4), Error);    // out of range
  r.wait();
  EXPECT_NO_THROW(r.set_sync(false));
}

}  // namespace
}  // namespace ddpv
