// The ops' side of the residual-block fusions (docs/architecture.md, "Layer fusion"): the
// Winograd convolution adding its input gradient and writing its output's batch statistics,
// and the CPU BatchNorm normalising with those statistics and adding the shortcut. Each
// against the naive loops of conv_ref.hpp and bn_ref.hpp.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "bn_ref.hpp"
#include "conv_ref.hpp"
#include "cpu_fusable.hpp"
#include "op_check.hpp"

namespace ddpv::test {
namespace {

// Note [Input gradient added]: once asked, backward adds the input gradient to what dx holds
// (the naive loops' dx plus the values put there first), in every layout, on one thread and
// on three, over several chunks; the weight and bias gradients are unchanged by it.
TEST(ConvOpWinograd, AddsTheInputGradientWhenAsked) {
  uint64_t seed = 5000;
  for_each_setup(
      {{0, 1}, {8, 1}, {16, 1}, {8, 3}},
      {ConvCase{2, 16, 16, 7, 9, 3, 1, 1, false}, ConvCase{3, 32, 16, 14, 14, 5, 1, 2, true},
       ConvCase{9, 16, 16, 16, 16, 3, 1, 1, true}},  // 3 chunks
      [&](Backend& backend, const Conv2dConfig& c, const ConvCase& cc) {
        auto op = as_fusable<cpu::FusableConv>(backend.conv2d(c));
        ASSERT_NE(op, nullptr);
        ASSERT_TRUE(op->add_input_grad());
        ConvProblem p(&backend, c, cc.n, seed);
        const std::vector<float> held = random_vector(p.x.size(), ++seed);
        upload(p.gx, nhwc_to_blocked(held, cc.n, p.ihw, c.in_channels, c.in_block));
        p.forward(*op);
        p.backward(*op, true, false);
        ConvGrads ref = p.grads_ref();
        std::vector<double> want = ref.dx;
        for (size_t i = 0; i < want.size(); ++i) want[i] += held[i];
        EXPECT_TRUE(winograd_close(p.dx(), want)) << "dx";
        EXPECT_TRUE(winograd_close(p.gw.to_host(), ref.dw)) << "dw";
        if (c.bias) {
          EXPECT_TRUE(winograd_close(p.gb.to_host(), ref.db)) << "db";
        }
      });
}

// Note [Batch statistics from the convolution]: once asked, forward writes the sums of y per
// output channel and of its squares (against the naive loops' y, summed in double), in every
// layout, on one thread and on three, over several chunks and partial tiles; y is unchanged
// by it, and null sums stop it.
TEST(ConvOpWinograd, WritesTheBatchStatisticsOfItsOutput) {
  uint64_t seed = 6000;
  for_each_setup(
      {{0, 1}, {8, 1}, {16, 1}, {16, 3}, {8, 3}},
      {ConvCase{2, 16, 16, 7, 9, 3, 1, 1, true}, ConvCase{3, 32, 16, 14, 14, 5, 1, 2, false},
       ConvCase{9, 16, 32, 16, 16, 3, 1, 1, false}},  // 3 chunks
      [&](Backend& backend, const Conv2dConfig& c, const ConvCase& cc) {
        auto op = as_fusable<cpu::FusableConv>(backend.conv2d(c));
        ASSERT_NE(op, nullptr);
        std::vector<double> sums(2 * size_t(c.out_channels), 1e30);
        ASSERT_TRUE(op->write_batch_stats(sums.data()));
        ConvProblem p(&backend, c, cc.n, seed);
        for (int round = 0; round < 2; ++round) {  // the second forward starts from its own sums
          p.forward(*op);
          const std::vector<double> y = p.y_ref();
          EXPECT_TRUE(winograd_close(p.y(), y)) << "y";
          std::vector<double> want(sums.size(), 0.0);
          for (size_t i = 0; i < y.size(); ++i) {
            want[i % c.out_channels] += y[i];
            want[c.out_channels + i % c.out_channels] += y[i] * y[i];
          }
          const std::vector<float> got(sums.begin(), sums.end());
          EXPECT_TRUE(all_close(got, want, 1e-4, 1e-4 * max_abs(want))) << "round " << round;
        }
        op->write_batch_stats(nullptr);  // evaluation: no sums, the same y
        std::fill(sums.begin(), sums.end(), 1e30);
        p.forward(*op);
        EXPECT_TRUE(winograd_close(p.y(), p.y_ref())) << "y without sums";
        EXPECT_EQ(sums, std::vector<double>(sums.size(), 1e30));
      });
}

// Note [Batch statistics from the convolution]: after take_given_stats(), forward_train
// normalises with the mean and variance of the sums written to given_stats(), not with x's
// own (the sums here are those of another tensor), updates the running statistics from them,
// and backward differentiates through the batch statistics as without them (the sums of x).
// NHWC and blocks of 16, with and without the fused ReLU; a channel whose sums are not finite
// comes out NaN under the ReLU, as its statistics would be.
TEST(BatchNormOpGivenStats, NormalisesWithTheSumsAndDifferentiatesThroughThem) {
  auto backend = backend_or_skip(Device::kCpu);
  for (const auto& [block, relu] : {std::pair{0, false}, {16, false}, {0, true}, {16, true}}) {
    SCOPED_TRACE("block " + std::to_string(block) + (relu ? ", relu" : ""));
    BatchNormConfig c = bn_config(16, 4, 5);
    c.block = block;
    const int n = 3, ch = c.channels;
    const int64_t hw = c.h * c.w;
    const size_t total = static_cast<size_t>(n * hw * ch), m = total / ch;
    const auto x = random_vector(total, 91, -1.0f, 2.0f), other = random_vector(total, 92),
               dy = random_vector(total, 93), gamma = random_vector(16, 94, 0.5f, 1.5f),
               beta = random_vector(16, 95, -0.5f, 0.5f);
    auto lay = [&](const std::vector<float>& v) { return nhwc_to_blocked(v, n, hw, ch, block); };
    auto unlay = [&](const std::vector<float>& v) { return blocked_to_nhwc(v, n, hw, ch, block); };
    auto op = as_fusable<cpu::FusableBatchNorm>(backend->batchnorm2d(c));
    ASSERT_NE(op, nullptr);
    if (relu) {
      ASSERT_TRUE(op->fuse_relu());
    }
    double* sums = op->given_stats();
    ASSERT_NE(sums, nullptr);
    EXPECT_FALSE(op->takes_given_stats());
    op->take_given_stats();
    EXPECT_TRUE(op->takes_given_stats());
    auto give = [&](const std::vector<float>& v) {
      std::fill(sums, sums + 2 * ch, 0.0);
      for (size_t i = 0; i < total; ++i) {
        sums[i % ch] += v[i];
        sums[ch + i % ch] += double{v[i]} * v[i];
      }
    };
    DeviceBuffer x_(backend.get(), lay(x)), g_(backend.get(), gamma), b_(backend.get(), beta),
        y_(backend.get(), total), rm(backend.get(), 16),
        rv(backend.get(), std::vector<float>(16, 1.0f)), dy_(backend.get(), lay(dy)),
        dx_(backend.get(), total), dg(backend.get(), 16), db(backend.get(), 16);

    // The statistics of `other`, applied to x.
    give(other);
    op->forward_train(n, x_.data(), g_.data(), b_.data(), y_.data(), rm.data(), rv.data());
    const BnRef theirs = bn_train_ref(c, n, other, gamma, beta);
    std::vector<double> want(total), want_rv(16);
    for (size_t i = 0; i < total; ++i) {
      const size_t k = i % 16;
      want[i] = gamma[k] * (x[i] - theirs.mean[k]) / std::sqrt(theirs.var[k] + c.eps) + beta[k];
      if (relu) want[i] = std::max(0.0, want[i]);
    }
    for (int k = 0; k < 16; ++k) want_rv[k] = 0.9 + 0.1 * theirs.var[k] * m / (m - 1.0);
    EXPECT_TRUE(all_close(unlay(y_.to_host()), want, 1e-4, 1e-5)) << "y";
    EXPECT_TRUE(all_close(rv.to_host(), want_rv, 1e-5, 1e-6)) << "running_var";

    // x's own sums: forward and backward as the naive loops.
    give(x);
    op->forward_train(n, x_.data(), g_.data(), b_.data(), y_.data(), rm.data(), rv.data());
    BnRef ref = bn_train_ref(c, n, x, gamma, beta);
    std::vector<float> masked(dy);
    for (size_t i = 0; i < total && relu; ++i) {
      if (ref.y[i] > 0) continue;
      ref.y[i] = 0;
      masked[i] = 0;
    }
    EXPECT_TRUE(all_close(unlay(y_.to_host()), ref.y, 1e-4, 1e-5)) << "y, x's sums";
    op->backward(n, x_.data(), g_.data(), dy_.data(), dx_.data(), dg.data(), db.data(), false);
    expect_naive_backward(c, n, x, gamma, masked, unlay(dx_.to_host()), dg.to_host(), db.to_host());

    if (!relu) continue;
    sums[3] = std::nan("");  // a NaN in channel 3's input makes its sum NaN
    op->forward_train(n, x_.data(), g_.data(), b_.data(), y_.data(), rm.data(), rv.data());
    const auto got = unlay(y_.to_host());
    size_t nan3 = 0;
    for (size_t i = 3; i < total; i += 16) nan3 += std::isnan(got[i]) ? 1 : 0;
    EXPECT_EQ(nan3, total / 16) << "channel 3 should be NaN throughout";
  }
}

// Note [BatchNorm + residual]: with the statistics given, forward_add_relu writes max(0, the
// naive normalisation + other) in training (a NaN in other kept), updates the running
// statistics as forward_train, and backward is then the normalisation's; in inference it
// uses the running statistics. Refused with the ReLU fused or without given statistics.
TEST(BatchNormOpGivenStats, AddsTheResidualAndRectifies) {
  auto backend = backend_or_skip(Device::kCpu);
  {
    auto plain = as_fusable<cpu::FusableBatchNorm>(backend->batchnorm2d(bn_config(16, 4, 5)));
    EXPECT_FALSE(plain->fuse_add_relu()) << "needs the statistics given";
    auto fused = as_fusable<cpu::FusableBatchNorm>(backend->batchnorm2d(bn_config(16, 4, 5)));
    fused->fuse_relu();
    fused->given_stats();
    fused->take_given_stats();
    EXPECT_FALSE(fused->fuse_add_relu()) << "not after fuse_relu";
  }
  // Blocks of 8: two per image, so each (image, block) plane takes its own channels.
  for (int block : {0, 8, 16}) {
    SCOPED_TRACE("block " + std::to_string(block));
    BatchNormConfig c = bn_config(16, 4, 5);
    c.block = block;
    const int n = 3, ch = c.channels;
    const int64_t hw = c.h * c.w;
    const size_t total = static_cast<size_t>(n * hw * ch), m = total / ch;
    const auto x = random_vector(total, 101, -1.0f, 2.0f), dy = random_vector(total, 102),
               gamma = random_vector(16, 103, 0.5f, 1.5f), beta = random_vector(16, 104);
    auto other = random_vector(total, 105);
    other[7] = std::nanf("");
    auto lay = [&](const std::vector<float>& v) { return nhwc_to_blocked(v, n, hw, ch, block); };
    auto unlay = [&](const std::vector<float>& v) { return blocked_to_nhwc(v, n, hw, ch, block); };
    auto op = as_fusable<cpu::FusableBatchNorm>(backend->batchnorm2d(c));
    ASSERT_NE(op, nullptr);
    double* sums = op->given_stats();
    op->take_given_stats();
    ASSERT_TRUE(op->fuse_add_relu());
    for (size_t i = 0; i < total; ++i) {
      sums[i % ch] += x[i];
      sums[ch + i % ch] += double{x[i]} * x[i];
    }
    const auto rmean0 = random_vector(16, 106), rvar0 = random_vector(16, 107, 0.5f, 2.0f);
    DeviceBuffer x_(backend.get(), lay(x)), g_(backend.get(), gamma), b_(backend.get(), beta),
        o_(backend.get(), lay(other)), y_(backend.get(), total), rm(backend.get(), rmean0),
        rv(backend.get(), rvar0), dy_(backend.get(), lay(dy)), dx_(backend.get(), total),
        dg(backend.get(), 16), db(backend.get(), 16);
    op->forward_add_relu(n, true, x_.data(), g_.data(), b_.data(), o_.data(), y_.data(), rm.data(),
                         rv.data());
    const BnRef ref = bn_train_ref(c, n, x, gamma, beta);
    std::vector<double> want(total), want_mean(16), want_var(16);
    for (size_t i = 0; i < total; ++i) want[i] = std::max(0.0, ref.y[i] + other[i]);
    auto got = unlay(y_.to_host());
    EXPECT_TRUE(std::isnan(got[7])) << "a NaN in other stays NaN";
    want[7] = got[7] = 0;
    EXPECT_TRUE(all_close(got, want, 1e-4, 1e-5)) << "y";
    for (int k = 0; k < 16; ++k) {
      want_mean[k] = 0.9 * rmean0[k] + 0.1 * ref.mean[k];
      want_var[k] = 0.9 * rvar0[k] + 0.1 * ref.var[k] * m / (m - 1.0);
    }
    EXPECT_TRUE(all_close(rm.to_host(), want_mean, 1e-5, 1e-6)) << "running_mean";
    EXPECT_TRUE(all_close(rv.to_host(), want_var, 1e-5, 1e-6)) << "running_var";

    op->backward(n, x_.data(), g_.data(), dy_.data(), dx_.data(), dg.data(), db.data(), false);
    expect_naive_backward(c, n, x, gamma, dy, unlay(dx_.to_host()), dg.to_host(), db.to_host());

    // Inference: the running statistics, whatever the sums say.
    std::fill(sums, sums + 2 * ch, 0.0);
    op->forward_add_relu(n, false, x_.data(), g_.data(), b_.data(), o_.data(), y_.data(), rm.data(),
                         rv.data());
    const auto mean = rm.to_host(), var = rv.to_host();
    for (size_t i = 0; i < total; ++i) {
      const size_t k = i % 16;
      want[i] = std::max(0.0, gamma[k] * (x[i] - mean[k]) / std::sqrt(var[k] + double{c.eps}) +
                                  beta[k] + other[i]);
    }
    auto inf = unlay(y_.to_host());
    want[7] = inf[7] = 0;
    EXPECT_TRUE(all_close(inf, want, 1e-5, 1e-5)) << "inference y";
  }
}

}  // namespace
}  // namespace ddpv::test
