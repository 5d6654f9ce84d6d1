// The backend's elementwise ops (relu, add, fill, scale, all_finite, bf16 casts) and layout
// transposes against naive loops, relu's backward also by finite differences, on every device.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>

#include "ddpv/core/rng.hpp"
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
  // NaN propagates (PyTorch's relu does too), so divergence is not hidden by a ReLU.
  DeviceBuffer nan_(backend.get(), std::vector<float>{std::nanf(""), -1.0f, 2.0f});
  backend->relu_forward(3, nan_.data(), nan_.data());
  const auto nan_h = nan_.to_host();
  EXPECT_TRUE(std::isnan(nan_h[0]));
  EXPECT_EQ(nan_h[1], 0.0f);
  EXPECT_EQ(nan_h[2], 2.0f);
  // The residual block's add + ReLU keeps NaN the same way.
  DeviceBuffer a_(backend.get(), std::vector<float>{std::nanf(""), -1.0f, 2.0f}),
      b_(backend.get(), std::vector<float>{1.0f, 0.5f, std::nanf("")});
  backend->add_relu(3, a_.data(), b_.data(), a_.data());
  const auto sum_h = a_.to_host();
  EXPECT_TRUE(std::isnan(sum_h[0]));
  EXPECT_EQ(sum_h[1], 0.0f);
  EXPECT_TRUE(std::isnan(sum_h[2]));
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
    backend->add_relu(count, a_.data(), b_.data(), y_.data());
    std::vector<double> want_relu(nc);
    for (size_t i = 0; i < nc; ++i) want_relu[i] = std::max(0.0, want[i]);
    EXPECT_TRUE(all_close(y_.to_host(), want_relu, 0, 0)) << "add_relu";
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

// Views into a larger buffer, 16-byte aligned (offset 4) or not (offset 1), with counts that
// leave a tail of 0 to 3 past the last group of four (Note [Vector elementwise] in the CUDA
// backend): every element of the view is right and nothing around it is touched.
TEST_P(ElementwiseOpTest, ViewsAtAnyOffsetAndCount) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  for (int64_t offset : {1, 4}) {
    for (int64_t count : {1, 6, 1003, 4096}) {
      SCOPED_TRACE("offset=" + std::to_string(offset) + " count=" + std::to_string(count));
      const size_t total = static_cast<size_t>(offset + count + 5);
      const auto a = random_vector(total, 7), b = random_vector(total, 8);
      DeviceBuffer a_(backend.get(), a), b_(backend.get(), b), y_(backend.get(), total);
      auto check = [&](const char* what, auto f) {
        const std::vector<float> y = y_.to_host();
        for (size_t i = 0; i < total; ++i) {
          const bool inside =
              i >= static_cast<size_t>(offset) && i < static_cast<size_t>(offset + count);
          const float want = inside ? f(a[i], b[i]) : -7.0f;
          ASSERT_EQ(y[i], want) << what << " at " << i;
        }
      };
      auto run = [&](const char* what, auto op, auto f) {
        backend->fill(static_cast<int64_t>(total), -7.0f, y_.data());
        op(a_.data() + offset, b_.data() + offset, y_.data() + offset);
        check(what, f);
      };
      run(
          "add", [&](float* x, float* z, float* y) { backend->add(count, x, z, y); },
          [](float x, float z) { return x + z; });
      run(
          "add_relu", [&](float* x, float* z, float* y) { backend->add_relu(count, x, z, y); },
          [](float x, float z) { return std::max(0.0f, x + z); });
      run(
          "relu_forward", [&](float* x, float*, float* y) { backend->relu_forward(count, x, y); },
          [](float x, float) { return std::max(0.0f, x); });
      run(
          "relu_backward",
          [&](float* x, float* z, float* y) { backend->relu_backward(count, x, z, y); },
          [](float x, float z) { return x > 0.0f ? z : 0.0f; });
    }
  }
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

// The value of f32 bits as a double, decoded by hand; an all-ones exponent with a zero
// mantissa reads as 2^128, the next step after the largest finite value (rounding to it means
// rounding to infinity).
double decode_f32_bits(uint32_t bits) {
  const int exponent = static_cast<int>((bits >> 23) & 0xff);
  const double mantissa = static_cast<double>(bits & 0x7fffff);
  const double magnitude = exponent == 0 ? std::ldexp(mantissa, -149)
                                         : std::ldexp(1.0 + mantissa / 8388608.0, exponent - 127);
  return (bits >> 31) ? -magnitude : magnitude;
}

// bf16 of a finite f32 by comparing distances to its two bf16 neighbours in double, ties to the
// even one; independent of the bit trick the backends use.
uint16_t naive_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t down = u & 0xffff0000u, up = down + 0x10000u;  // toward zero, away from zero
  const double x = f, d_down = std::abs(x - decode_f32_bits(down)),
               d_up = std::abs(decode_f32_bits(up) - x);
  const bool take_up = d_up < d_down || (d_up == d_down && ((down >> 16) & 1u));
  return static_cast<uint16_t>((take_up ? up : down) >> 16);
}

TEST_P(ElementwiseOpTest, Bf16CastsRoundToNearestEvenAndWidenExactly) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  std::vector<float> x = random_vector(200003, 12, -3.0f, 3.0f);
  Rng rng(13);
  for (size_t i = 0; i < x.size(); i += 3)
    x[i] = std::ldexp(x[i], static_cast<int>(rng.uniform_int(200)) - 100);
  const float special[] = {0.0f,
                           -0.0f,
                           1.0f,
                           std::numeric_limits<float>::max(),
                           -std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::denorm_min(),
                           1e-40f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity()};
  for (size_t k = 0; k < std::size(special); ++k) x[k] = special[k];
  for (uint32_t k = 0; k < 64; ++k) {  // exact ties, half with an odd and half with an even bf16
    const uint32_t bits = 0x3f800000u + (k << 16) + 0x8000u;
    std::memcpy(&x[100 + k], &bits, 4);
  }
  const int64_t n = static_cast<int64_t>(x.size());
  DeviceBuffer x_(backend.get(), x), back(backend.get(), x.size());
  Tensor half = Tensor::empty(Shape{n}, DType::kBF16, backend->allocator());
  auto* h = static_cast<uint16_t*>(half.raw());
  backend->cast_to_bf16(n, x_.data(), h);
  std::vector<uint16_t> got(x.size());
  backend->copy(got.data(), Device::kCpu, h, backend->device(), got.size() * 2);
  backend->cast_from_bf16(n, h, back.data());
  const std::vector<float> widened = back.to_host();
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(got[i], naive_bf16(x[i])) << "element " << i << " = " << x[i];
    uint32_t bits = static_cast<uint32_t>(got[i]) << 16;
    float want;
    std::memcpy(&want, &bits, 4);
    ASSERT_EQ(std::memcmp(&widened[i], &want, 4), 0) << "widening element " << i;
  }
  // NaN stays NaN (whatever its payload).
  std::vector<float> nan(5, std::numeric_limits<float>::quiet_NaN());
  DeviceBuffer nan_(backend.get(), nan);
  backend->cast_to_bf16(5, nan_.data(), h);
  backend->cast_from_bf16(5, h, nan_.data());
  for (float v : nan_.to_host()) EXPECT_TRUE(std::isnan(v));
}

// Every pair of layouts the device offers (Note [Blocked activations]) against index loops
// written out per layout.
TEST_P(ElementwiseOpTest, LayoutChanges) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  const int n = 2, h = 3, w = 5, c = 16;
  const size_t total = static_cast<size_t>(n) * h * w * c;
  // Element (i, k, y, z) of a (N, C, H, W) tensor: its value, and its offset in each layout.
  auto value = [&](int i, int k, int y, int z) {
    return static_cast<float>(((i * c + k) * h + y) * w + z);
  };
  auto at = [&](int layout, int i, int k, int y, int z) -> size_t {
    if (layout == Backend::kNchw) return static_cast<size_t>(((i * c + k) * h + y) * w + z);
    if (layout == 0) return static_cast<size_t>(((i * h + y) * w + z) * c + k);
    const int b = layout;
    return static_cast<size_t>((((i * (c / b) + k / b) * h + y) * w + z) * b + k % b);
  };
  auto filled = [&](int layout) {
    std::vector<float> v(total);
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < c; ++k)
        for (int y = 0; y < h; ++y)
          for (int z = 0; z < w; ++z) v[at(layout, i, k, y, z)] = value(i, k, y, z);
    return v;
  };
  std::vector<std::pair<int, int>> pairs = {{0, Backend::kNchw}, {Backend::kNchw, 0}};
  if (GetParam() == Device::kCpu) {
    for (int a : {Backend::kNchw, 0, 8, 16})
      for (int b : {Backend::kNchw, 0, 8, 16})
        if (a != b && (a > 0 || b > 0)) pairs.emplace_back(a, b);
  }
  for (auto [from, to] : pairs) {
    const auto x = filled(from);
    DeviceBuffer x_(backend.get(), x), y_(backend.get(), total);
    backend->relayout(n, h, w, c, from, to, x_.data(), y_.data());
    EXPECT_TRUE(all_close(y_.to_host(), to_double(filled(to)), 0, 0)) << from << " -> " << to;
  }
  DeviceBuffer x_(backend.get(), total), y_(backend.get(), total);
  EXPECT_THROW(backend->relayout(n, h, w, 12, 0, 8, x_.data(), y_.data()), Error)
      << "12 channels do not fill blocks of 8";
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
