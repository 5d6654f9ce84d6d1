// BatchNormOp against a naive double-precision loop and finite differences, on every device:
// training (batch statistics, PyTorch's running-statistics rule), inference, backward.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "bn_ref.hpp"
#include "cpu_fusable.hpp"
#include "op_check.hpp"

namespace ddpv::test {
namespace {

class BatchNormOpTest : public ::testing::TestWithParam<Device> {};

TEST_P(BatchNormOpTest, TrainingMatchesNaiveLoopAndFiniteDifferences) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  struct Case {
    int n, c, h, w;
  };
  uint64_t seed = 300;
  for (const Case& k : {Case{2, 3, 5, 3}, Case{4, 5, 3, 3}, Case{3, 16, 2, 3}, Case{2, 1, 1, 2}}) {
    SCOPED_TRACE("n=" + std::to_string(k.n) + " c=" + std::to_string(k.c) + " " +
                 std::to_string(k.h) + "x" + std::to_string(k.w));
    const BatchNormConfig c = bn_config(k.c, k.h, k.w);
    const size_t nx = static_cast<size_t>(k.n) * k.h * k.w * k.c, m = nx / k.c;
    auto x = random_vector(nx, ++seed, -2.0f, 3.0f), gamma = random_vector(k.c, ++seed, 0.5f, 1.5f),
         beta = random_vector(k.c, ++seed), r = random_vector(nx, ++seed);
    const auto rmean0 = random_vector(k.c, ++seed), rvar0 = random_vector(k.c, ++seed, 0.5f, 2.0f);
    auto op = backend->batchnorm2d(c);
    DeviceBuffer x_(backend.get(), x), g_(backend.get(), gamma), b_(backend.get(), beta),
        y_(backend.get(), nx), rm(backend.get(), rmean0), rv(backend.get(), rvar0),
        dy_(backend.get(), r), dx_(backend.get(), nx), dg(backend.get(), k.c),
        db(backend.get(), k.c);

    op->forward_train(k.n, x_.data(), g_.data(), b_.data(), y_.data(), rm.data(), rv.data());
    const BnRef ref = bn_train_ref(c, k.n, x, gamma, beta);
    EXPECT_TRUE(all_close(y_.to_host(), ref.y, 1e-4, 1e-4)) << "y";
    // PyTorch: running = (1 - m) * running + m * batch, the variance unbiased by M / (M - 1).
    std::vector<double> want_mean(k.c), want_var(k.c);
    for (int i = 0; i < k.c; ++i) {
      want_mean[i] = 0.9 * rmean0[i] + 0.1 * ref.mean[i];
      want_var[i] = 0.9 * rvar0[i] + 0.1 * ref.var[i] * m / (m - 1.0);
    }
    EXPECT_TRUE(all_close(rm.to_host(), want_mean, 1e-5, 1e-6)) << "running_mean";
    EXPECT_TRUE(all_close(rv.to_host(), want_var, 1e-5, 1e-6)) << "running_var";

    op->backward(k.n, x_.data(), g_.data(), dy_.data(), dx_.data(), dg.data(), db.data(), false);
    std::vector<double> rdx, rdg, rdb;
    bn_backward_ref(c, k.n, x, gamma, r, rdx, rdg, rdb);
    const auto dx_h = dx_.to_host(), dg_h = dg.to_host(), db_h = db.to_host();
    EXPECT_TRUE(all_close(dx_h, rdx, 1e-4, 1e-4)) << "dx";
    EXPECT_TRUE(all_close(dg_h, rdg, 1e-4, 1e-4)) << "dgamma";
    EXPECT_TRUE(all_close(db_h, rdb, 1e-4, 1e-4)) << "dbeta";

    DeviceBuffer rm_scratch(backend.get(), k.c), rv_scratch(backend.get(), k.c);
    auto loss = [&] {
      upload(x_, x);
      upload(g_, gamma);
      upload(b_, beta);
      op->forward_train(k.n, x_.data(), g_.data(), b_.data(), y_.data(), rm_scratch.data(),
                        rv_scratch.data());
      return dot(y_.to_host(), r);
    };
    const auto ix = sample_indices(nx, 12), ic = sample_indices(k.c, 4);
    EXPECT_TRUE(all_close(pick(dx_h, ix), numeric_gradient(loss, x, ix, 2e-3), 1e-2, 5e-3))
        << "dx FD";
    EXPECT_TRUE(all_close(pick(dg_h, ic), numeric_gradient(loss, gamma, ic, 2e-3), 1e-2, 5e-3))
        << "dgamma FD";
    EXPECT_TRUE(all_close(pick(db_h, ic), numeric_gradient(loss, beta, ic, 2e-3), 1e-2, 5e-3))
        << "dbeta FD";
  }
}

// Note [Blocked activations]: the CPU backend's batchnorm on blocked activations against the
// naive NHWC loops, through the test's own layout changes.
TEST(BatchNormOpBlocked, TrainingAndBackwardMatchTheNaiveLoop) {
  auto backend = backend_or_skip(Device::kCpu);
  for (int block : {8, 16}) {
    SCOPED_TRACE("block " + std::to_string(block));
    BatchNormConfig c;
    c.channels = 32;
    c.h = 5;
    c.w = 3;
    c.block = block;
    const int n = 3;
    const int64_t hw = c.h * c.w;
    const size_t total = static_cast<size_t>(n * hw * c.channels);
    const auto x = random_vector(total, 61), dy = random_vector(total, 62),
               gamma = random_vector(32, 63, 0.5f, 1.5f), beta = random_vector(32, 64);
    auto op = backend->batchnorm2d(c);
    DeviceBuffer x_(backend.get(), nhwc_to_blocked(x, n, hw, 32, block)), g_(backend.get(), gamma),
        b_(backend.get(), beta), y_(backend.get(), total), rm(backend.get(), 32),
        rv(backend.get(), std::vector<float>(32, 1.0f)),
        dy_(backend.get(), nhwc_to_blocked(dy, n, hw, 32, block)), dx_(backend.get(), total),
        dg(backend.get(), 32), db(backend.get(), 32);
    op->forward_train(n, x_.data(), g_.data(), b_.data(), y_.data(), rm.data(), rv.data());
    const BnRef ref = bn_train_ref(c, n, x, gamma, beta);
    EXPECT_TRUE(all_close(blocked_to_nhwc(y_.to_host(), n, hw, 32, block), ref.y, 1e-4, 1e-5));
    op->backward(n, x_.data(), g_.data(), dy_.data(), dx_.data(), dg.data(), db.data(), false);
    expect_naive_backward(c, n, x, gamma, dy, blocked_to_nhwc(dx_.to_host(), n, hw, 32, block),
                          dg.to_host(), db.to_host());
  }
}

// Note [BatchNorm + ReLU]: a fused op's forwards give max(0, y), and its backward takes the
// gradient of that output: the naive BatchNorm backward of dy masked where the reference y is
// positive. In NHWC and in blocks (where the backend has them).
TEST_P(BatchNormOpTest, FusedReluMatchesSeparateLayers) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  for (int block : {0, 8, 16}) {
    if (block > 0 && GetParam() != Device::kCpu) continue;
    SCOPED_TRACE("block " + std::to_string(block));
    BatchNormConfig c = bn_config(16, 4, 5);
    c.block = block;
    const int n = 3, ch = c.channels;
    const int64_t hw = c.h * c.w;
    const size_t total = static_cast<size_t>(n * hw * ch);
    const auto x = random_vector(total, 81), dy = random_vector(total, 82),
               gamma = random_vector(16, 83, 0.5f, 1.5f), beta = random_vector(16, 84, -0.5f, 0.5f);
    auto lay = [&](const std::vector<float>& v) { return nhwc_to_blocked(v, n, hw, ch, block); };
    auto unlay = [&](const std::vector<float>& v) { return blocked_to_nhwc(v, n, hw, ch, block); };
    auto op = as_fusable<cpu::FusableBatchNorm>(backend->batchnorm2d(c));
    if (!op || !op->fuse_relu()) GTEST_SKIP() << "this backend's BatchNorm fuses no ReLU";
    DeviceBuffer x_(backend.get(), lay(x)), g_(backend.get(), gamma), b_(backend.get(), beta),
        y_(backend.get(), total), rm(backend.get(), 16),
        rv(backend.get(), std::vector<float>(16, 1.0f)), dy_(backend.get(), lay(dy)),
        dx_(backend.get(), total), dg(backend.get(), 16), db(backend.get(), 16);
    op->forward_train(n, x_.data(), g_.data(), b_.data(), y_.data(), rm.data(), rv.data());
    BnRef ref = bn_train_ref(c, n, x, gamma, beta);
    std::vector<float> masked(dy);
    size_t zeros = 0;
    for (size_t i = 0; i < total; ++i) {
      if (ref.y[i] > 0) continue;
      ref.y[i] = 0;
      masked[i] = 0;
      ++zeros;
    }
    ASSERT_GT(zeros, total / 4);  // the mask matters
    EXPECT_TRUE(all_close(unlay(y_.to_host()), ref.y, 1e-4, 1e-5)) << "y";
    op->backward(n, x_.data(), g_.data(), dy_.data(), dx_.data(), dg.data(), db.data(), false);
    expect_naive_backward(c, n, x, gamma, masked, unlay(dx_.to_host()), dg.to_host(), db.to_host());

    // Inference: max(0, the running-statistics normalisation).
    op->forward_infer(n, x_.data(), g_.data(), b_.data(), rm.data(), rv.data(), y_.data());
    const auto mean = rm.to_host(), var = rv.to_host();
    std::vector<double> want(total);
    for (size_t i = 0; i < total; ++i) {
      const size_t k = i % 16;
      want[i] =
          std::max(0.0, gamma[k] * (x[i] - mean[k]) / std::sqrt(var[k] + double{c.eps}) + beta[k]);
    }
    EXPECT_TRUE(all_close(unlay(y_.to_host()), want, 1e-5, 1e-5)) << "inference y";

    // A NaN in channel 3's input: channel 3 comes out NaN, every other channel as before.
    std::vector<float> bad(x);
    bad[5 * 16 + 3] = std::nanf("");
    upload(x_, lay(bad));
    op->forward_train(n, x_.data(), g_.data(), b_.data(), y_.data(), rm.data(), rv.data());
    const auto got = unlay(y_.to_host());
    size_t nan3 = 0, other_bad = 0;
    for (size_t i = 0; i < total; ++i) {
      if (i % 16 == 3) {
        nan3 += std::isnan(got[i]) ? 1 : 0;
      } else {
        other_bad += std::abs(got[i] - ref.y[i]) > 1e-4 ? 1 : 0;
      }
    }
    EXPECT_EQ(nan3, total / 16) << "channel 3 should be NaN throughout";
    EXPECT_EQ(other_bad, 0u);
  }
}

TEST_P(BatchNormOpTest, InferenceUsesRunningStatistics) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  const BatchNormConfig c = bn_config(6, 3, 5);
  const int n = 3;
  const size_t nx = static_cast<size_t>(n) * 3 * 5 * 6;
  const auto x = random_vector(nx, 1, -2, 2), gamma = random_vector(6, 2),
             beta = random_vector(6, 3), rmean = random_vector(6, 4),
             rvar = random_vector(6, 5, 0.2f, 3.0f);
  DeviceBuffer x_(backend.get(), x), g_(backend.get(), gamma), b_(backend.get(), beta),
      rm(backend.get(), rmean), rv(backend.get(), rvar), y_(backend.get(), nx);
  auto op = backend->batchnorm2d(c);
  op->forward_infer(n, x_.data(), g_.data(), b_.data(), rm.data(), rv.data(), y_.data());
  std::vector<double> want(nx);
  for (size_t i = 0; i < nx; ++i) {
    const size_t k = i % 6;
    want[i] =
        gamma[k] * (x[i] - rmean[k]) / std::sqrt(rvar[k] + static_cast<double>(c.eps)) + beta[k];
  }
  EXPECT_TRUE(all_close(y_.to_host(), want, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(rm.to_host(), to_double(rmean), 0, 0)) << "inference left running_mean";
  EXPECT_TRUE(all_close(rv.to_host(), to_double(rvar), 0, 0)) << "inference left running_var";
}

TEST_P(BatchNormOpTest, AccumulateAddsToParameterGradients) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  const BatchNormConfig c = bn_config(4, 3, 3);
  const int n = 2;
  const size_t nx = 2ul * 3 * 3 * 4;
  const auto x = random_vector(nx, 11), gamma = random_vector(4, 12), beta = random_vector(4, 13),
             dy = random_vector(nx, 14), old_g = random_vector(4, 15), old_b = random_vector(4, 16);
  DeviceBuffer x_(backend.get(), x), g_(backend.get(), gamma), b_(backend.get(), beta),
      y_(backend.get(), nx), rm(backend.get(), 4), rv(backend.get(), 4), dy_(backend.get(), dy),
      dx_(backend.get(), nx), dg(backend.get(), old_g), db(backend.get(), old_b);
  auto op = backend->batchnorm2d(c);
  op->forward_train(n, x_.data(), g_.data(), b_.data(), y_.data(), rm.data(), rv.data());
  op->backward(n, x_.data(), g_.data(), dy_.data(), dx_.data(), dg.data(), db.data(), true);
  std::vector<double> rdx, rdg, rdb;
  bn_backward_ref(c, n, x, gamma, dy, rdx, rdg, rdb);
  for (int i = 0; i < 4; ++i) {
    rdg[i] += old_g[i];
    rdb[i] += old_b[i];
  }
  EXPECT_TRUE(all_close(dg.to_host(), rdg, 1e-4, 1e-4)) << "dgamma";
  EXPECT_TRUE(all_close(db.to_host(), rdb, 1e-4, 1e-4)) << "dbeta";
  EXPECT_TRUE(all_close(dx_.to_host(), rdx, 1e-4, 1e-4)) << "dx";
}

TEST_P(BatchNormOpTest, RejectsBadInput) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  EXPECT_THROW(backend->batchnorm2d(bn_config(0, 3, 3)), Error);
  EXPECT_THROW(backend->batchnorm2d(bn_config(4, 0, 3)), Error);
  // One value per channel has no batch variance (PyTorch refuses it too).
  auto op = backend->batchnorm2d(bn_config(2, 1, 1));
  DeviceBuffer x(backend.get(), 2), g(backend.get(), 2), y(backend.get(), 2);
  try {
    op->forward_train(1, x.data(), g.data(), g.data(), y.data(), g.data(), g.data());
    ADD_FAILURE() << "training on one value per channel was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("batchnorm2d"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, BatchNormOpTest, ::testing::ValuesIn(test_devices()),
                         device_param_name);

}  // namespace
}  // namespace ddpv::test
