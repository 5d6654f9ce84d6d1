// DeviceFeed's slot protocol (Note [Two slots]) against a simulated upload stream that checks
// every rule of Note [Batch uploads] and executes copies either as early or as late as the
// rules allow, with a source that poisons a host batch the moment it is given back. A feed
// that overwrote a slot still being read, or let go of a host batch before its upload ran,
// delivers wrong values in one of the two modes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "train/device_feed.hpp"

namespace ddpv {
namespace {

constexpr int64_t kPixels = 2 * 2 * 1;  // per image: (2, 2, 1)

// Batches of known values from a fixed pool of host buffers, like the Loader: a buffer goes
// back to the pool (and is filled with NaN) when the last copy of its Batch is dropped.
class PoisoningSource final : public BatchSource {
 public:
  PoisoningSource(int64_t samples, int64_t batch) : samples_(samples), batch_(batch) {
    for (auto& b : pool_) {
      b.images = Tensor::empty(Shape{batch, 2, 2, 1}, DType::kF32);
      b.labels = Tensor::empty(Shape{batch}, DType::kI32);
    }
  }
  static float pixel(int64_t epoch, int64_t step, int64_t i) {
    return static_cast<float>(epoch * 10000 + step * 100 + i);
  }
  void start_epoch(int64_t epoch, int64_t start_step) override {
    epoch_ = epoch;
    step_ = start_step;
  }
  void push_split(std::vector<int64_t> /*sizes*/) override {
    ADD_FAILURE() << "push_split without --balance";
  }
  std::optional<Batch> next() override {
    if (step_ >= steps_per_epoch()) return std::nullopt;
    const int64_t n = std::min(batch_, samples_ - step_ * batch_);
    int free_slot = -1;
    for (int k = 0; k < kPool && free_slot < 0; ++k)
      if (!pool_[k].busy) free_slot = k;
    if (free_slot < 0) ADD_FAILURE() << "the feed holds every host buffer of the pool";
    if (free_slot < 0) return std::nullopt;
    Buffer& buf = pool_[free_slot];
    buf.busy = true;
    float* x = buf.images.data<float>();
    for (int64_t i = 0; i < n * kPixels; ++i) x[i] = pixel(epoch_, step_, i);
    for (int64_t i = 0; i < n; ++i) buf.labels.data<int32_t>()[i] = static_cast<int32_t>(step_);
    Batch b;
    b.images = Tensor::wrap(x, Shape{n, 2, 2, 1}, DType::kF32);
    b.labels = Tensor::wrap(buf.labels.raw(), Shape{n}, DType::kI32);
    b.size = n;
    b.epoch = epoch_;
    b.step = step_++;
    b.lease = std::shared_ptr<void>(nullptr, [this, &buf, n](void*) {
      if (on_release) on_release(buf.images.raw());
      float* p = buf.images.data<float>();
      for (int64_t i = 0; i < n * kPixels; ++i) p[i] = std::numeric_limits<float>::quiet_NaN();
      buf.labels.data<int32_t>()[0] = -1;
      buf.busy = false;
    });
    return b;
  }
  int64_t steps_per_epoch() const override { return (samples_ + batch_ - 1) / batch_; }
  int64_t samples_per_epoch() const override { return samples_; }
  std::function<void(const void*)> on_release;  // told of every host buffer given back

 private:
  static constexpr int kPool = 4;
  struct Buffer {
    Tensor images, labels;
    bool busy = false;
  };
  int64_t samples_, batch_, epoch_ = 0, step_ = 0;
  Buffer pool_[kPool];
};

// An upload stream on host memory. Eager: a copy runs when queued (as if the copy stream were
// idle). Lazy: it runs only when someone must see it (acquire or host_done). Both are legal
// schedules of a real stream, so a correct feed gives the same results under both.
class SimulatedUploads final : public UploadStream {
 public:
  explicit SimulatedUploads(bool eager) : eager_(eager) {}
  std::vector<std::string> violations;

  int slots() const override { return 2; }
  void copy(int s, void* dst, const void* src, size_t bytes) override {
    if (acquired_[s] > released_[s]) fail("copy into slot " + std::to_string(s) + " while read");
    unconfirmed_[src] = s;
    auto run = [dst, src, bytes] { std::memcpy(dst, src, bytes); };
    if (eager_) {
      run();
    } else {
      pending_[s].push_back(run);
    }
    committed_[s] = false;
  }
  void commit(int s) override { committed_[s] = true; }
  void acquire(int s) override {
    if (!committed_[s]) fail("acquire of slot " + std::to_string(s) + " before its commit");
    flush(s);
    ++acquired_[s];
  }
  void release(int s) override { released_[s] = acquired_[s]; }
  void host_done(int s) override {
    flush(s);
    std::erase_if(unconfirmed_, [s](const auto& e) { return e.second == s; });
  }
  // A host buffer goes back to its pool: a copy out of it that the host has not seen finish
  // (host_done) could still be queued on a real copy stream.
  void check_released(const void* host) {
    if (unconfirmed_.count(host)) fail("a host batch was given back before host_done");
  }

 private:
  void fail(const std::string& what) { violations.push_back(what); }
  void flush(int s) {
    for (auto& f : pending_[s]) f();
    pending_[s].clear();
  }
  bool eager_;
  std::vector<std::function<void()>> pending_[2];
  int acquired_[2] = {0, 0}, released_[2] = {0, 0};
  bool committed_[2] = {true, true};
  std::map<const void*, int> unconfirmed_;  // host sources of copies -> slot
};

// Reads a delivered batch "on the device" and checks it holds epoch `e`, step `s`.
void expect_batch(const DeviceFeed::Ready& b, int64_t e, int64_t s, int64_t n) {
  ASSERT_EQ(b.size, n);
  ASSERT_EQ(b.images.shape(), (Shape{n, 2, 2, 1}));
  ASSERT_EQ(b.labels.shape(), Shape{n});
  const float* x = b.images.data<float>();
  for (int64_t i = 0; i < n * kPixels; ++i)
    ASSERT_EQ(x[i], PoisoningSource::pixel(e, s, i)) << "epoch " << e << " step " << s << " [" << i << "]";
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(b.labels.data<int32_t>()[i], s);
}

class DeviceFeedTest : public ::testing::TestWithParam<bool> {};

TEST_P(DeviceFeedTest, DeliversEveryBatchIntactUnderEitherSchedule) {
  PoisoningSource source(/*samples=*/26, /*batch=*/4);  // 7 batches, the last of 2
  SimulatedUploads uploads(GetParam());
  source.on_release = [&](const void* host) { uploads.check_released(host); };
  {
    DeviceFeed feed(source, &uploads, host_allocator());
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      feed.start_epoch(epoch, 0);
      int64_t step = 0;
      while (std::optional<DeviceFeed::Ready> b = feed.next()) {
        const DeviceFeed::Ready batch = *b;
        feed.done();
        // The device runs this batch's compute after the host queued done() (and with it the
        // next upload): the values must still be this batch's.
        expect_batch(batch, epoch, step, step == 6 ? 2 : 4);
        ++step;
      }
      EXPECT_EQ(step, 7);
    }
    // An epoch abandoned after 2 batches, then a resume at step 5 of the next.
    feed.start_epoch(2, 0);
    for (int64_t s = 0; s < 2; ++s) {
      auto b = feed.next();
      ASSERT_TRUE(b);
      expect_batch(*b, 2, s, 4);
      feed.done();
    }
    feed.start_epoch(3, 5);
    auto b = feed.next();
    ASSERT_TRUE(b);
    expect_batch(*b, 3, 5, 4);
    EXPECT_THROW(feed.next(), Error) << "next() twice without done()";
  }
  EXPECT_TRUE(uploads.violations.empty()) << uploads.violations.front();
}

INSTANTIATE_TEST_SUITE_P(Schedules, DeviceFeedTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? std::string("EagerCopies") : std::string("LazyCopies");
                         });

TEST(DeviceFeed, WithoutAnUploadStreamHandsOutTheHostBatches) {
  PoisoningSource source(/*samples=*/10, /*batch=*/4);
  DeviceFeed feed(source, nullptr, nullptr);
  feed.start_epoch(0, 1);
  int64_t step = 1;
  while (std::optional<DeviceFeed::Ready> b = feed.next()) {
    expect_batch(*b, 0, step, step == 2 ? 2 : 4);
    EXPECT_EQ(b->images.device(), Device::kCpu);
    feed.done();
    ++step;
  }
  EXPECT_EQ(step, 3);
  EXPECT_THROW(feed.done(), Error) << "done() without a batch";
}

}  // namespace
}  // namespace ddpv
