// Pool2dOp (max, average counting padding, global average) against naive double-precision
// loops and finite differences, on every device.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>

#include "cpu_fusable.hpp"
#include "op_check.hpp"

namespace ddpv::test {
namespace {

Pool2dConfig config(PoolKind kind, int c, int h, int w, int k, int s, int p) {
  Pool2dConfig cfg;
  cfg.kind = kind;
  cfg.channels = c;
  cfg.in_h = h;
  cfg.in_w = w;
  cfg.kernel = k;
  cfg.stride = s;
  cfg.padding = p;
  return cfg;
}

// Each output is the max, or the mean with the padding counted as zeros (PyTorch's
// count_include_pad = True), of its window; global average: the mean over the whole image.
// Backward routes dy to the arg-max, or spreads it evenly. x: (N, H, W, C), y: (N, OH, OW, C).
void pool_ref(const Pool2dConfig& c, int n, const std::vector<float>& x,
              const std::vector<float>& dy, std::vector<double>& y, std::vector<double>& dx) {
  const bool global = c.kind == PoolKind::kGlobalAvg;
  const int k_h = global ? c.in_h : c.kernel, k_w = global ? c.in_w : c.kernel;
  const int s = global ? 1 : c.stride, p = global ? 0 : c.padding;
  const int oh = c.out_h(), ow = c.out_w(), ch = c.channels;
  y.assign(static_cast<size_t>(n) * oh * ow * ch, 0);
  dx.assign(x.size(), 0);
  for (int i = 0; i < n; ++i)
    for (int yo = 0; yo < oh; ++yo)
      for (int xo = 0; xo < ow; ++xo)
        for (int k = 0; k < ch; ++k) {
          const size_t out = ((static_cast<size_t>(i) * oh + yo) * ow + xo) * ch + k;
          double best = -INFINITY, sum = 0;
          size_t arg = 0;
          for (int a = 0; a < k_h; ++a)
            for (int b = 0; b < k_w; ++b) {
              const int yi = yo * s - p + a, xi = xo * s - p + b;
              if (yi < 0 || yi >= c.in_h || xi < 0 || xi >= c.in_w) continue;
              const size_t in = ((static_cast<size_t>(i) * c.in_h + yi) * c.in_w + xi) * ch + k;
              sum += x[in];
              if (x[in] > best) best = x[in], arg = in;
            }
          if (c.kind == PoolKind::kMax) {
            y[out] = best;
            dx[arg] += dy[out];
            continue;
          }
          const double count = static_cast<double>(k_h) * k_w;
          y[out] = sum / count;
          for (int a = 0; a < k_h; ++a)
            for (int b = 0; b < k_w; ++b) {
              const int yi = yo * s - p + a, xi = xo * s - p + b;
              if (yi < 0 || yi >= c.in_h || xi < 0 || xi >= c.in_w) continue;
              dx[((static_cast<size_t>(i) * c.in_h + yi) * c.in_w + xi) * ch + k] +=
                  dy[out] / count;
            }
        }
}

// Distinct values 0.01 apart in random order: finite differences of max pooling never cross a
// tie.
std::vector<float> distinct_values(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.01f * static_cast<float>(i) - 0.005f * n;
  std::shuffle(v.begin(), v.end(), std::mt19937_64(seed));
  return v;
}

class PoolOpTest : public ::testing::TestWithParam<Device> {};

TEST_P(PoolOpTest, MatchesNaiveLoopAndFiniteDifferences) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  struct Case {
    const char* name;
    int n;
    Pool2dConfig cfg;
  };
  const Case cases[] = {
      {"max k2 s2", 2, config(PoolKind::kMax, 3, 6, 7, 2, 2, 0)},
      {"max k2 s2, odd rows", 2, config(PoolKind::kMax, 3, 7, 4, 2, 2, 0)},
      {"max k3 s3", 2, config(PoolKind::kMax, 2, 8, 7, 3, 3, 0)},
      {"max k3 s2 p1", 2, config(PoolKind::kMax, 4, 7, 5, 3, 2, 1)},
      {"max k3 s1 p1", 1, config(PoolKind::kMax, 2, 5, 5, 3, 1, 1)},
      {"max k3 s2 p1 on 1x2", 2,
       config(PoolKind::kMax, 3, 1, 2, 3, 2, 1)},  // windows mostly padding
      {"avg k2 s2", 2, config(PoolKind::kAvg, 3, 6, 7, 2, 2, 0)},
      {"avg k3 s2 p1", 2, config(PoolKind::kAvg, 4, 7, 5, 3, 2, 1)},
      {"avg k3 s1 p1", 1, config(PoolKind::kAvg, 2, 5, 6, 3, 1, 1)},
      {"global 8x8", 3, config(PoolKind::kGlobalAvg, 5, 8, 8, 0, 0, 0)},
      {"global 3x5", 2, config(PoolKind::kGlobalAvg, 4, 3, 5, 0, 0, 0)},
  };
  uint64_t seed = 500;
  for (const Case& cs : cases) {
    SCOPED_TRACE(cs.name);
    const Pool2dConfig& c = cs.cfg;
    const int n = cs.n;
    const size_t nx = static_cast<size_t>(n) * c.in_h * c.in_w * c.channels;
    const size_t ny = static_cast<size_t>(n) * c.out_h() * c.out_w() * c.channels;
    auto x = distinct_values(nx, ++seed);
    const auto r = random_vector(ny, ++seed);
    auto op = backend->pool2d(c);
    DeviceBuffer x_(backend.get(), x), y_(backend.get(), ny), dy_(backend.get(), r),
        dx_(backend.get(), std::vector<float>(nx, 1e30f));  // backward must overwrite all of dx
    op->forward(n, x_.data(), y_.data());
    std::vector<double> ref_y, ref_dx;
    pool_ref(c, n, x, r, ref_y, ref_dx);
    EXPECT_TRUE(all_close(y_.to_host(), ref_y, 1e-6, 1e-6)) << "y";
    op->backward(n, dy_.data(), dx_.data());
    const auto dx_h = dx_.to_host();
    EXPECT_TRUE(all_close(dx_h, ref_dx, 1e-6, 1e-6)) << "dx";

    auto loss = [&] {
      upload(x_, x);
      op->forward(n, x_.data(), y_.data());
      return dot(y_.to_host(), r);
    };
    const auto ix = sample_indices(nx, 16);
    EXPECT_TRUE(all_close(pick(dx_h, ix), numeric_gradient(loss, x, ix, 1e-3), 1e-2, 1e-3))
        << "dx FD";
  }
}

// Note [Blocked activations]: the CPU backend's pooling on blocked activations against the
// naive NHWC loops, through the test's own layout changes.
TEST(PoolOpBlocked, EveryKindMatchesTheNaiveLoop) {
  auto backend = backend_or_skip(Device::kCpu);
  for (int block : {8, 16}) {
    // The last max pooling tiles its input (kernel = stride, no padding): its own loops.
    for (Pool2dConfig c :
         {config(PoolKind::kMax, 16, 6, 7, 3, 2, 1), config(PoolKind::kAvg, 16, 6, 7, 3, 2, 1),
          config(PoolKind::kGlobalAvg, 16, 6, 7, 3, 2, 1),
          config(PoolKind::kMax, 16, 7, 6, 2, 2, 0)}) {
      c.block = block;
      SCOPED_TRACE("block " + std::to_string(block) + " kind " +
                   std::to_string(static_cast<int>(c.kind)) + " kernel " +
                   std::to_string(c.kernel));
      const int n = 2;
      const int64_t ihw = c.in_h * c.in_w, ohw = int64_t{c.out_h()} * c.out_w();
      const auto x = random_vector(static_cast<size_t>(n * ihw * 16), 71),
                 dy = random_vector(static_cast<size_t>(n * ohw * 16), 72);
      std::vector<double> want_y, want_dx;
      pool_ref(c, n, x, dy, want_y, want_dx);
      auto op = backend->pool2d(c);
      DeviceBuffer x_(backend.get(), nhwc_to_blocked(x, n, ihw, 16, block)),
          dy_(backend.get(), nhwc_to_blocked(dy, n, ohw, 16, block)),
          y_(backend.get(), want_y.size()), dx_(backend.get(), x.size());
      op->forward(n, x_.data(), y_.data());
      EXPECT_TRUE(all_close(blocked_to_nhwc(y_.to_host(), n, ohw, 16, block), want_y, 1e-5, 1e-6));
      op->backward(n, dy_.data(), dx_.data());
      EXPECT_TRUE(
          all_close(blocked_to_nhwc(dx_.to_host(), n, ihw, 16, block), want_dx, 1e-5, 1e-6));
    }
  }
}

TEST_P(PoolOpTest, MaxPoolingPropagatesNaN) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  // One channel, 2x2 image, one 2x2 window: NaN anywhere in it makes the output NaN (PyTorch).
  for (int at = 0; at < 4; ++at) {
    std::vector<float> x = {1.0f, 5.0f, -2.0f, 3.0f};
    x[static_cast<size_t>(at)] = std::nanf("");
    auto op = backend->pool2d(config(PoolKind::kMax, 1, 2, 2, 2, 2, 0));
    DeviceBuffer x_(backend.get(), x), y_(backend.get(), 1);
    op->forward(1, x_.data(), y_.data());
    EXPECT_TRUE(std::isnan(y_.to_host()[0])) << "NaN at " << at;
  }
}

// Note [ReLU folded into max pooling]: on a ReLU's output (zeros, including whole windows of
// them, and positive values), a max pooling that folds the ReLU's backward gives what the
// ReLU's backward (dx where the ReLU output is positive) gives after the plain pooling's
// backward, exactly, for tiled and overlapping windows, in NHWC and in blocks.
TEST_P(PoolOpTest, FoldsTheBackwardOfTheReluBeforeIt) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  for (int block : {0, 8}) {
    for (Pool2dConfig c :
         {config(PoolKind::kMax, 8, 7, 6, 2, 2, 0), config(PoolKind::kMax, 8, 9, 9, 3, 3, 0),
          config(PoolKind::kMax, 8, 7, 5, 3, 2, 1)}) {
      SCOPED_TRACE("block " + std::to_string(block) + " kernel " + std::to_string(c.kernel) +
                   " stride " + std::to_string(c.stride));
      c.block = block;
      if (block > 0 && GetParam() != Device::kCpu) continue;  // blocks are the CPU's layout
      const int n = 2, ch = c.channels;
      const int64_t ihw = c.in_h * c.in_w, ohw = int64_t{c.out_h()} * c.out_w();
      // ReLU outputs: distinct values shifted down, so that about 60% are zero, and image 1's
      // first channel all zero (every window of it not positive).
      auto x = distinct_values(static_cast<size_t>(n * ihw * ch), 90 + c.kernel);
      const float shift = 0.0025f * static_cast<float>(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        const bool dead = i >= static_cast<size_t>(ihw * ch) && i % static_cast<size_t>(ch) == 0;
        x[i] = dead ? 0.0f : std::max(0.0f, x[i] - 0.2f * shift);
      }
      const auto dy = random_vector(static_cast<size_t>(n * ohw * ch), 93);
      std::vector<double> want_y, want_dx;
      pool_ref(c, n, x, dy, want_y, want_dx);
      for (size_t i = 0; i < x.size(); ++i) want_dx[i] = x[i] > 0 ? want_dx[i] : 0.0;
      auto op = as_fusable<cpu::FusablePool>(backend->pool2d(c));
      if (!op || !op->fold_relu_backward()) GTEST_SKIP() << "this backend's pooling folds no ReLU";
      auto lay = [&](const std::vector<float>& v, int64_t hw) {
        return nhwc_to_blocked(v, n, hw, ch, block);
      };
      auto unlay = [&](const std::vector<float>& v, int64_t hw) {
        return blocked_to_nhwc(v, n, hw, ch, block);
      };
      DeviceBuffer x_(backend.get(), lay(x, ihw)), dy_(backend.get(), lay(dy, ohw)),
          y_(backend.get(), want_y.size()), dx_(backend.get(), std::vector<float>(x.size(), 1e30f));
      op->forward(n, x_.data(), y_.data());
      EXPECT_TRUE(all_close(unlay(y_.to_host(), ohw), want_y, 0, 0)) << "y";
      op->backward(n, dy_.data(), dx_.data());
      EXPECT_TRUE(all_close(unlay(dx_.to_host(), ihw), want_dx, 1e-6, 1e-6)) << "dx";
    }
  }
}

TEST_P(PoolOpTest, OneOpServesSeveralBatchSizes) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  const Pool2dConfig c = config(PoolKind::kMax, 3, 4, 4, 2, 2, 0);
  auto op = backend->pool2d(c);
  for (int n : {3, 1, 3}) {
    const size_t nx = static_cast<size_t>(n) * 16 * 3, ny = static_cast<size_t>(n) * 4 * 3;
    const auto x = distinct_values(nx, 40 + n), dy = random_vector(ny, 50 + n);
    DeviceBuffer x_(backend.get(), x), y_(backend.get(), ny), dy_(backend.get(), dy),
        dx_(backend.get(), nx);
    op->forward(n, x_.data(), y_.data());
    op->backward(n, dy_.data(), dx_.data());
    std::vector<double> ry, rdx;
    pool_ref(c, n, x, dy, ry, rdx);
    EXPECT_TRUE(all_close(y_.to_host(), ry, 0, 0)) << "n=" << n;
    EXPECT_TRUE(all_close(dx_.to_host(), rdx, 0, 0)) << "n=" << n;
  }
}

TEST_P(PoolOpTest, RejectsBadConfigurations) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  const Pool2dConfig bad[] = {
      config(PoolKind::kMax, 0, 4, 4, 2, 2, 0),  // no channels
      config(PoolKind::kMax, 3, 4, 4, 0, 2, 0),  // kernel 0
      config(PoolKind::kAvg, 3, 4, 4, 2, 0, 0),  // stride 0
      config(PoolKind::kAvg, 3, 4, 4, 2, 2, 2),  // padding more than half the kernel
      config(PoolKind::kMax, 3, 2, 2, 5, 1, 1),  // window larger than the padded input
      config(PoolKind::kGlobalAvg, 3, 0, 4, 0, 0, 0),
  };
  for (const Pool2dConfig& c : bad) {
    try {
      backend->pool2d(c);
      ADD_FAILURE() << "accepted kernel=" << c.kernel << " stride=" << c.stride
                    << " padding=" << c.padding;
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("pool2d"), std::string::npos) << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, PoolOpTest, ::testing::ValuesIn(test_devices()),
                         device_param_name);

}  // namespace
}  // namespace ddpv::test
