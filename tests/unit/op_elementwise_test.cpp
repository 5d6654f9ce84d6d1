// The backend's elementwise ops (relu, add, fill, scale, all_finite) and layout transposes
// against naive loops, relu's backward also by finite differences, on every device.
#include <cmath>
#include <limits>
#include <string>

#include "op_check.hpp"

namespace ddpv::test {
namespace {

class ElementwiseOpTest : public ::testing::TestWithParam<Device> {};

// Counts on both sides of the CPU backend's threshold for running a loop on several threads.
const int64_t kCounts[] = {1, 37, 1000, 200003};

TEST_P(ElementwiseOpTest, ReluForwardAndBackward) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  for (int64_t count : kCounts) {
    SCOPED_TRACE("count=" + std::to_string(count));
    const size_t nc = static_cast<size_t>(count);
    auto x = random_vector(nc, 1 + nc);
    // Keep values away from the kink so that finite differences stay on one side of it.
    for (float& v : x) v += v >= 0 ? 0.05f : -0.05f;
    const auto r = random_vector(nc, 2 + nc);
    DeviceBuffer x_(backend.get(), x), y_(backend.get(), nc), r_(backend.get(), r),
        dx_(backend.get(), nc);
    backend->relu_forward(count, x_.data(), y_.data());
    std::vector<double> want_y(nc), want_dx(nc);
    for (size_t i = 0; i < nc; ++i) {
      want_y[i] = x[i] > 0 ? x[i] : 0.0;
      want_dx[i] = x[i] > 0 ? r[i] : 0.0;
    }
    const auto y_h = y_.to_host();
    EXPECT_TRUE(all_close(y_h, want_y, 0, 0));
    backend->relu_backward(count, y_.data(), r_.data(), dx_.data());
    const auto dx_h = dx_.to_host();
    EXPECT_TRUE(all_close(dx_h, want_dx, 0, 0));
    if (count <= 1000) {
      auto loss = [&] {
        upload(x_, x);
        backend->relu_forward(count, x_.data(), y_.data());
        return dot(y_.to_host(), r);
      };
      const auto idx = sample_indices(nc, 10);
      EXPECT_TRUE(all_close(pick(dx_h, idx), numeric_gradient(loss, x, idx, 1e-2), 1e-3, 1e-4));
    }
    // In place, as layers use it: y = relu(y), dy = relu'(y) * dy.
    upload(x_, x);  // finite differences left a perturbed copy there
    backend->relu_forward(count, x_.data(), x_.data());
    EXPECT_TRUE(all_close(x_.to_host(), want_y, 0, 0)) << "in place";
    backend->relu_backward(count, x_.data(), r_.data(), r_.data());
    EXPECT_TRUE(all_close(r_.to_host(), want_dx, 0, 0)) << "in place";
  }
}

TEST_P(ElementwiseOpTest, AddFillScale) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  for (int64_t count : kCounts) {
    SCOPED_TRACE("count=" + std::to_string(count));
    const size_t nc = static_cast<size_t>(count);
    const auto a = random_vector(nc, 3), b = random_vector(nc, 4);
    DeviceBuffer a_(backend.get(), a), b_(backend.get(), b), y_(backend.get(), nc);
    backend->add(count, a_.data(), b_.data(), y_.data());
    std::vector<double> want(nc);
    for (size_t i = 0; i < nc; ++i) want[i] = static_cast<double>(a[i] + b[i]);
    EXPECT_TRUE(all_close(y_.to_host(), want, 0, 0)) << "add";
    backend->add(count, a_.data(), b_.data(), a_.data());  // residual in place
    EXPECT_TRUE(all_close(a_.to_host(), want, 0, 0)) << "add in place";

    backend->scale(count, -0.25f, b_.data());
    for (size_t i = 0; i < nc; ++i) want[i] = static_cast<double>(b[i] * -0.25f);
    EXPECT_TRUE(all_close(b_.to_host(), want, 0, 0)) << "scale";

    backend->fill(count, 2.5f, y_.data());
    EXPECT_TRUE(all_close(y_.to_host(), std::vector<double>(nc, 2.5), 0, 0)) << "fill";
  }
  backend->fill(0, 1.0f, nullptr);  // an empty range touches nothing
}

TEST_P(ElementwiseOpTest, AllFiniteFindsEveryKindOfNonFinite) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (int64_t count : kCounts) {
    SCOPED_TRACE("count=" + std::to_string(count));
    const size_t nc = static_cast<size_t>(count);
    auto x = random_vector(nc, 5, -1e30f, 1e30f);
    x[nc / 2] = std::numeric_limits<float>::max();  // large but finite
    DeviceBuffer x_(backend.get(), x);
    EXPECT_TRUE(backend->all_finite(count, x_.data()));
    for (float v : bad)
      for (size_t pos : {size_t{0}, nc / 3, nc - 1}) {
        auto y = x;
        y[pos] = v;
        upload(x_, y);
        EXPECT_FALSE(backend->all_finite(count, x_.data())) << v << " at " << pos;
      }
  }
  EXPECT_TRUE(backend->all_finite(0, nullptr));
}

TEST_P(ElementwiseOpTest, LayoutTransposes) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  const int n = 2, h = 3, w = 5, c = 4;
  const size_t total = static_cast<size_t>(n) * h * w * c;
  const auto x = random_vector(total, 6);
  std::vector<double> want(total);
  for (int i = 0; i < n; ++i)
    for (int y = 0; y < h; ++y)
      for (int z = 0; z < w; ++z)
        for (int k = 0; k < c; ++k)
          want[((i * c + k) * h + y) * w + z] = x[((i * h + y) * w + z) * c + k];
  DeviceBuffer x_(backend.get(), x), t_(backend.get(), total), back(backend.get(), total);
  backend->nhwc_to_nchw(n, h, w, c, x_.data(), t_.data());
  EXPECT_TRUE(all_close(t_.to_host(), want, 0, 0)) << "nhwc_to_nchw";
  backend->nchw_to_nhwc(n, h, w, c, t_.data(), back.data());
  EXPECT_TRUE(all_close(back.to_host(), to_double(x), 0, 0)) << "nchw_to_nhwc";
}

TEST_P(ElementwiseOpTest, SeveralThreadsGiveTheSameResults) {
  DDPV_BACKEND_OR_SKIP(one, GetParam());
  auto two = backend_or_skip(GetParam(), 2);
  ASSERT_TRUE(two);
  const int64_t count = 300001;
  const size_t nc = static_cast<size_t>(count);
  const auto x = random_vector(nc, 8), dy = random_vector(nc, 9);
  std::vector<std::vector<float>> results;
  for (Backend* b : {one.get(), two.get()}) {
    DeviceBuffer x_(b, x), dy_(b, dy), y_(b, nc), dx_(b, nc), s_(b, nc);
    b->relu_forward(count, x_.data(), y_.data());
    b->relu_backward(count, y_.data(), dy_.data(), dx_.data());
    b->add(count, y_.data(), dx_.data(), s_.data());
    b->scale(count, 3.0f, s_.data());
    results.push_back(s_.to_host());
    EXPECT_TRUE(b->all_finite(count, s_.data()));
    auto bad = x;
    bad[nc - 2] = std::numeric_limits<float>::quiet_NaN();
    upload(x_, bad);
    EXPECT_FALSE(b->all_finite(count, x_.data()));
  }
  EXPECT_TRUE(all_close(results[1], to_double(results[0]), 0, 0));
}

INSTANTIATE_TEST_SUITE_P(Devices, ElementwiseOpTest, ::testing::ValuesIn(test_devices()),
                         device_param_name);

}  // namespace
}  // namespace ddpv::test
