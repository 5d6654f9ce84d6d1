// The CPU backend's single-channel convolution (Note [Single-channel convolution]) against
// the naive loops, and the fusions of the CPU convolutions: the ReLU (Note [Fused ReLU]) and
// the max pooling (Note [Max pooling fused into the convolution], Note [Pooled weight
// gradient]), single-channel and Winograd.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "backend/cpu/cpu_ops.hpp"
#include "conv_ref.hpp"
#include "cpu_fusable.hpp"
#include "op_check.hpp"

namespace ddpv::test {
namespace {

// Note [Single-channel convolution]: a stem from one channel runs on our own loops (unless the
// direct algorithm is asked for), in every output layout, with stride, padding and partial
// windows, against the naive loops, on one thread and on three; then backward again,
// accumulating. Stride 1 with 5x5 or 3x3 kernels and outputs of whole 4x4 tiles runs forward
// by Winograd (Note [Single-channel Winograd forward]), to its tolerance.
TEST(ConvOpSingleChannel, MatchesTheNaiveLoopInEveryLayout) {
  uint64_t seed = 1500;
  const std::string direct = "single-channel direct";
  const std::pair<ConvCase, std::string> cases[] = {
      {{3, 1, 32, 28, 28, 5, 1, 2, true}, "single-channel winograd F(4x4,5x5)"},  // lenet's conv1
      {{2, 1, 16, 8, 12, 3, 1, 1, false}, "single-channel winograd F(4x4,3x3)"},
      {{2, 1, 24, 12, 8, 5, 1, 2, true}, "single-channel winograd F(4x4,5x5)"},
      {{2, 1, 16, 7, 9, 3, 2, 1, false}, direct},
      {{2, 1, 8, 3, 3, 5, 1, 1, true}, direct},  // windows mostly padding
      {{1, 1, 16, 6, 5, 3, 1, 0, true}, direct},
      {{2, 1, 24, 7, 9, 5, 1, 2, true}, direct}};  // a pair of channel groups and a lone one
  for (auto [block, threads] : {std::pair{0, 1}, {8, 1}, {16, 1}, {8, 3}}) {
    BackendOptions o;
    o.threads = threads;
    o.activation_block = block;
    auto backend = make_backend(o);
    for (const auto& [cc, algorithm] : cases) {
      Conv2dConfig c = cc.config();
      c.out_block = block_for(c.out_channels, block);
      auto op = backend->conv2d(c);
      SCOPED_TRACE(cc.str() + " block " + std::to_string(block) + ", " + std::to_string(threads) +
                   " threads");
      EXPECT_EQ(op->algorithm(), algorithm);
      ConvProblem p(backend.get(), c, cc.n, seed);
      p.forward(*op);
      if (algorithm == direct) {
        EXPECT_TRUE(all_close(p.y(), p.y_ref(), 1e-5, 1e-5)) << "y";
      } else {
        EXPECT_TRUE(winograd_close(p.y(), p.y_ref())) << "y";
      }
      p.backward(*op, true, false);
      ConvGrads ref = p.grads_ref();
      EXPECT_TRUE(all_close(p.dx(), ref.dx, 1e-5, 1e-5)) << "dx";
      EXPECT_TRUE(all_close(p.gw.to_host(), ref.dw, 1e-5, 1e-5)) << "dw";
      if (c.bias) {
        EXPECT_TRUE(all_close(p.gb.to_host(), ref.db, 1e-5, 1e-5)) << "db";
      }
      p.backward(*op, false, true);
      for (double& v : ref.dw) v *= 2;
      for (double& v : ref.db) v *= 2;
      EXPECT_TRUE(all_close(p.gw.to_host(), ref.dw, 1e-5, 1e-5)) << "dw accumulated";
      if (c.bias) {
        EXPECT_TRUE(all_close(p.gb.to_host(), ref.db, 1e-5, 1e-5)) << "db accumulated";
      }
    }
  }
}

// The single-channel loops are compiled twice (Note [Single-channel convolution]); on an AVX2
// machine the backend only ever runs the AVX2 copy, so the baseline copy, which other CPUs
// run, is compared with it here: forward, backward (dx, dw, db), and with the ReLU and the
// max pooling fused, forward_pooled and backward_pooled. Kernels 3, 5 and 7 (the pooled
// loops) and 4 (the dense path), strides 1 and 2, NHWC and blocks of 8. The direct loops are
// asked for by the context; by default the first two cases run forward by Winograd (Note
// [Single-channel Winograd forward]), whose copies round differently: their outputs agree to
// its tolerance, and so do the windows' positions but for near ties. Where the CPU has
// AVX-512, backward_pooled's weight gradient on 16-channel runs comes from its AVX-512 loop
// (Note [Pooled weight gradient by channel vectors]), compared here too.
TEST(ConvOpSingleChannel, BaselineLoopsMatchTheAvx2Ones) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
    GTEST_SKIP() << "no AVX2 + FMA here: the backend runs the baseline loops everywhere";
  struct Case {
    ConvCase cc;
    int block;
  };
  const Case cases[] = {{{3, 1, 32, 28, 28, 5, 1, 2, true}, 8},
                        {{2, 1, 16, 8, 12, 3, 1, 1, true}, 0},
                        {{2, 1, 16, 9, 7, 3, 1, 1, true}, 0},
                        {{2, 1, 24, 13, 13, 7, 2, 3, false}, 8},
                        {{2, 1, 16, 10, 10, 4, 1, 1, true}, 0}};
  uint64_t seed = 2700;
  for (const ConvAlgorithm algorithm : {ConvAlgorithm::kDirect, ConvAlgorithm::kAuto}) {
    for (const Case& k : cases) {
      Conv2dConfig c = k.cc.config();
      c.out_block = block_for(c.out_channels, k.block);
      const int n = k.cc.n, oh = c.out_h(), ow = c.out_w(), co = c.out_channels;
      const size_t ny = size_t(n) * oh * ow * co, npooled = size_t(n) * (oh / 2) * (ow / 2) * co;
      const auto x = random_vector(size_t(n) * c.in_h * c.in_w, ++seed);
      const auto w = random_vector(size_t(co) * c.kernel * c.kernel, ++seed);
      const auto b = random_vector(size_t(co), ++seed);
      const auto dy = random_vector(ny, ++seed), dpooled = random_vector(npooled, ++seed);
      std::string name;
      auto run = [&](bool baseline) {
        cpu::CpuContext ctx;
        ctx.threads = 1;
        ctx.conv = algorithm;
        auto plain = cpu::make_single_channel_conv2d(ctx, c, baseline);
        auto fused = cpu::make_single_channel_conv2d(ctx, c, baseline);
        EXPECT_TRUE(fused->fuse_relu());
        EXPECT_TRUE(fused->fuse_max_pool(2));
        name = fused->algorithm();
        std::vector<float> y(ny), dx(x.size()), dw(w.size()), db(b.size()), pooled(npooled),
            pdw(w.size()), pdb(b.size());
        std::vector<int32_t> at(npooled);
        const float* bias = c.bias ? b.data() : nullptr;
        plain->forward(n, x.data(), w.data(), bias, y.data());
        plain->backward(n, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), false);
        fused->forward_pooled(n, x.data(), w.data(), bias, pooled.data(), at.data());
        fused->backward_pooled(n, x.data(), w.data(), dpooled.data(), at.data(), nullptr,
                               pdw.data(), pdb.data(), false);
        return std::vector<std::vector<float>>{
            y, dx, dw, db, pooled, std::vector<float>(at.begin(), at.end()), pdw, pdb};
      };
      const auto want = run(false), got = run(true);
      SCOPED_TRACE(k.cc.str() + " block " + std::to_string(k.block) + ": " + name);
      const bool winograd = name != "single-channel direct";
      EXPECT_EQ(winograd, algorithm == ConvAlgorithm::kAuto && k.cc.s == 1 && oh % 4 == 0 &&
                              ow % 4 == 0 && (k.cc.k == 3 || k.cc.k == 5));
      const char* names[] = {"y",      "dx",        "dw",        "db",
                             "pooled", "positions", "pooled dw", "pooled db"};
      for (size_t i = 0; i < want.size(); ++i) {
        if (!c.bias && (i == 3 || i == 7)) continue;  // no bias: db is not written
        if (winograd && (i == 0 || i == 4)) {
          EXPECT_TRUE(winograd_close(got[i], to_double(want[i]))) << names[i];
        } else if (winograd && i >= 5) {  // positions and what they route: near ties may differ
          size_t differ = 0;
          for (size_t j = 0; j < want[5].size(); ++j) differ += got[5][j] != want[5][j];
          EXPECT_LE(differ, want[5].size() / 1000) << names[i];
        } else {
          EXPECT_TRUE(all_close(got[i], to_double(want[i]), 1e-5, 1e-5)) << names[i];
        }
      }
      size_t open = 0;
      for (float q : want[5]) open += q >= 0;
      EXPECT_GT(open, npooled / 4) << "the pooled case must send gradient down";
      EXPECT_LT(open, npooled) << "and have windows the ReLU closed";
    }
  }
}

// Note [Fused ReLU]: the Winograd and single-channel ops rectify their output when asked (and
// then only), and their backward still takes the gradient of the convolution's own output;
// oneDNN's direct op declines.
TEST(ConvOpFusedRelu, RectifiesTheOutputWhereTheOpCan) {
  BackendOptions o;
  o.threads = 1;
  auto backend = make_backend(o);
  const int b = backend->activation_block();
  uint64_t seed = 2000;
  for (ConvCase cc : {ConvCase{2, 32, 16, 9, 9, 5, 1, 2, true},    // Winograd
                      ConvCase{2, 1, 16, 9, 7, 5, 1, 2, true}}) {  // single channel
    Conv2dConfig c = cc.config();
    c.in_block = block_for(c.in_channels, b);
    c.out_block = block_for(c.out_channels, b);
    auto op = as_fusable<cpu::FusableConv>(backend->conv2d(c));
    ASSERT_NE(op, nullptr);
    SCOPED_TRACE(cc.str() + ": " + op->algorithm());
    ConvProblem p(backend.get(), c, cc.n, seed);
    std::vector<double> want = p.y_ref();
    p.forward(*op);
    EXPECT_TRUE(winograd_close(p.y(), want)) << "not rectified before fuse_relu";
    ASSERT_TRUE(op->fuse_relu());
    p.forward(*op);
    size_t negatives = 0;
    for (double& v : want) {
      negatives += v < 0;
      v = std::max(v, 0.0);
    }
    ASSERT_GT(negatives, want.size() / 4) << "the case must have outputs to rectify";
    EXPECT_TRUE(winograd_close(p.y(), want)) << "rectified";
    p.backward(*op, c.in_channels > 1, false);
    EXPECT_TRUE(winograd_close(p.gw.to_host(), p.grads_ref().dw))
        << "dw of the convolution's own output";
  }
  const auto direct = as_fusable<cpu::FusableConv>(
      backend->conv2d(ConvCase{2, 8, 8, 6, 6, 3, 2, 1, true}.config()));
  EXPECT_EQ(direct->algorithm(), "direct");
  EXPECT_FALSE(direct->fuse_relu());
}

// The separate ReLU and max pooling layers, naively, on a convolution's output y (NHWC): the
// pooled output (each window's largest rectified value) and the gradient of y that the
// pooling's backward gives for dpooled (at each window's first largest value where that value
// is positive, zero elsewhere, uncovered rows and columns included).
struct NaivePooling {
  std::vector<double> pooled, dy;
};
NaivePooling naive_relu_max_pool(std::vector<double> y, const std::vector<float>& dpooled, int n,
                                 int oh, int ow, int co, int pk) {
  const int ph = oh / pk, pw = ow / pk;
  NaivePooling r{std::vector<double>(static_cast<size_t>(n) * ph * pw * co),
                 std::vector<double>(y.size(), 0.0)};
  for (double& v : y) v = std::max(v, 0.0);
  for (int i = 0; i < n; ++i)
    for (int py = 0; py < ph; ++py)
      for (int px = 0; px < pw; ++px)
        for (int k = 0; k < co; ++k) {
          size_t best = 0;
          double m = -1;
          for (int a = 0; a < pk; ++a)
            for (int b = 0; b < pk; ++b) {
              const size_t at = ((size_t(i) * oh + py * pk + a) * ow + px * pk + b) * co + k;
              if (y[at] > m) m = y[at], best = at;
            }
          const size_t o = ((size_t(i) * ph + py) * pw + px) * co + k;
          r.pooled[o] = m;
          if (m > 0) r.dy[best] = dpooled[o];
        }
  return r;
}

// A single-channel conv with its max pooling fused (Note [Max pooling fused into the
// convolution]) and the pooling op whose positions it records.
struct FusedPooling {
  std::unique_ptr<cpu::FusableConv> op;
  std::unique_ptr<cpu::FusablePool> pool;
  int32_t* positions = nullptr;
};
FusedPooling fuse_pooling(Backend& backend, const Conv2dConfig& c, int n, int pk) {
  FusedPooling f;
  f.op = as_fusable<cpu::FusableConv>(backend.conv2d(c));
  EXPECT_FALSE(f.op->fuse_max_pool(pk)) << "pooling before the ReLU is fused";
  EXPECT_TRUE(f.op->fuse_relu());
  EXPECT_TRUE(f.op->fuse_max_pool(pk));
  Pool2dConfig pc;
  pc.kind = PoolKind::kMax;
  pc.channels = c.out_channels;
  pc.in_h = c.out_h();
  pc.in_w = c.out_w();
  pc.kernel = pc.stride = pk;
  pc.block = c.out_block;
  f.pool = as_fusable<cpu::FusablePool>(backend.pool2d(pc));
  EXPECT_EQ(f.pool->positions_for(n), nullptr) << "before the ReLU's backward is folded";
  EXPECT_TRUE(f.pool->fold_relu_backward());
  f.positions = f.pool->positions_for(n);
  EXPECT_NE(f.positions, nullptr);
  return f;
}

// Note [Max pooling fused into the convolution]: the single-channel op's forward_pooled gives
// the max pooling of its rectified output, and the positions it records make the pooling's
// backward give what the separate layers give.
TEST(ConvOpSingleChannel, PoolsItsOwnOutputWhenFused) {
  uint64_t seed = 2500;
  for (int block : {0, 8}) {
    for (auto [pk, co] : {std::pair{2, 16}, {3, 16}, {2, 24}}) {  // 24: a lone channel group
      BackendOptions o;
      o.threads = 1;
      o.activation_block = block;
      auto backend = make_backend(o);
      const ConvCase cc{2, 1, co, 9, 7, 3, 1, 1, true};  // output 9x7: partial windows at the edge
      Conv2dConfig c = cc.config();
      c.out_block = block_for(c.out_channels, block);
      SCOPED_TRACE(cc.str() + " block " + std::to_string(block) + " pool " + std::to_string(pk));
      FusedPooling f = fuse_pooling(*backend, c, cc.n, pk);
      ASSERT_EQ(f.op->algorithm(), "single-channel direct");
      ASSERT_NE(f.positions, nullptr);

      ConvProblem p(backend.get(), c, cc.n, seed);
      const int oh = c.out_h(), ow = c.out_w();
      const int64_t ohw = int64_t{oh} * ow, phw = int64_t{oh / pk} * (ow / pk);
      const size_t npooled = static_cast<size_t>(cc.n * phw * co);
      const auto dy = random_vector(npooled, seed++);
      DeviceBuffer pooled(backend.get(), std::vector<float>(npooled, 1e30f)),
          dy_(backend.get(), nhwc_to_blocked(dy, cc.n, phw, co, c.out_block)),
          dx_(backend.get(), std::vector<float>(static_cast<size_t>(cc.n * ohw * co), 1e30f));
      f.op->forward_pooled(cc.n, p.x_.data(), p.w_.data(), p.b_.data(), pooled.data(), f.positions);
      f.pool->backward(cc.n, dy_.data(), dx_.data());

      const NaivePooling want = naive_relu_max_pool(p.y_ref(), dy, cc.n, oh, ow, co, pk);
      EXPECT_TRUE(all_close(blocked_to_nhwc(pooled.to_host(), cc.n, phw, co, c.out_block),
                            want.pooled, 1e-5, 1e-5))
          << "pooled";
      EXPECT_TRUE(
          all_close(blocked_to_nhwc(dx_.to_host(), cc.n, ohw, co, c.out_block), want.dy, 0, 0))
          << "dx of the pooling";
    }
  }
}

// Note [Max pooling fused into the convolution] and Note [Pooled weight gradient]: with the
// pooling fused, forward_pooled gives the naive pooling of the rectified output and
// backward_pooled the naive loops' weight, bias (and, when asked, input) gradients for the
// gradient the separate pooling and ReLU would pass down. The single-channel op: kernels its
// pooled loops take (3, 5, 7) and one it leaves to the dense path (4), 2 x 2 and 3 x 3
// pooling, strides 1 and 2, forward by Winograd where the output is whole 4x4 tiles and the
// pooling 2 x 2, blocks of 16 (the AVX-512 weight gradient's runs where the CPU has it: Note
// [Pooled weight gradient by channel vectors]). Winograd: F(4x4, 5x5) and F(4x4, 3x3), 2 x 2
// pooling (odd outputs leave a row and a column out). Both layouts, one thread and three,
// overwriting and accumulating.
TEST(ConvOpFusedMaxPool, MatchesTheNaiveLoopsForwardAndBackward) {
  struct Case {
    ConvCase cc;
    int pk, block, threads;
    bool with_dx;
    const char* algorithm;
  };
  const char* single = "single-channel direct";
  const char* single_winograd = "single-channel winograd F(4x4,5x5)";
  const Case cases[] = {
      {{2, 1, 16, 9, 7, 3, 1, 1, true}, 2, 0, 1, false, single},  // partial windows at the edge
      {{2, 1, 16, 9, 7, 3, 1, 1, true}, 3, 8, 1, false, single},
      {{3, 1, 24, 12, 11, 5, 1, 2, true}, 2, 8, 1, false, single},
      {{3, 1, 8, 13, 13, 7, 2, 3, false}, 2, 0, 1, false, single},            // stride 2, no bias
      {{16, 1, 16, 28, 28, 5, 1, 2, true}, 2, 0, 3, false, single_winograd},  // threads: slices
      {{16, 1, 32, 28, 28, 5, 1, 2, true}, 2, 8, 3, false, single_winograd},
      // blocks of 16: two blocks of lanes for the AVX-512 weight gradient, kernels 5 and 3
      {{16, 1, 32, 28, 28, 5, 1, 2, true}, 2, 16, 3, false, single_winograd},
      {{3, 1, 32, 9, 7, 3, 1, 1, true}, 2, 16, 1, false, single},
      {{4, 1, 32, 12, 12, 5, 1, 2, false}, 2, 0, 1, false, single_winograd},  // NHWC: 2 runs a cell
      {{2, 1, 16, 8, 12, 3, 1, 1, false}, 2, 8, 1, false, "single-channel winograd F(4x4,3x3)"},
      {{2, 1, 16, 8, 12, 3, 1, 1, true}, 3, 0, 1, false, single},   // 3 x 3 pooling: direct
      {{2, 1, 16, 10, 10, 4, 1, 1, true}, 2, 0, 1, false, single},  // dense path: 4 taps
      {{2, 1, 16, 9, 9, 5, 1, 2, true}, 2, 8, 1, true, single},     // dense path: dx wanted
      {{2, 16, 16, 9, 9, 5, 1, 2, true}, 2, 0, 1, true, "winograd F(4x4,5x5)"},
      {{2, 32, 32, 10, 10, 3, 1, 1, false}, 2, 8, 1, false, "winograd F(4x4,3x3)"},
      {{8, 32, 16, 14, 14, 5, 1, 2, true}, 2, 8, 3, true, "winograd F(4x4,5x5)"},
  };
  uint64_t seed = 2600;
  for (const Case& k : cases) {
    BackendOptions o;
    o.threads = k.threads;
    o.activation_block = k.block;
    auto backend = make_backend(o);
    Conv2dConfig c = k.cc.config();
    c.in_block = block_for(c.in_channels, k.block);
    c.out_block = block_for(c.out_channels, k.block);
    SCOPED_TRACE(k.cc.str() + " block " + std::to_string(k.block) + " pool " +
                 std::to_string(k.pk) + " threads " + std::to_string(k.threads) +
                 (k.with_dx ? " with dx" : ""));
    FusedPooling f = fuse_pooling(*backend, c, k.cc.n, k.pk);
    ASSERT_EQ(f.op->algorithm(), k.algorithm);
    ASSERT_NE(f.positions, nullptr);
    ConvProblem p(backend.get(), c, k.cc.n, seed);
    const int oh = c.out_h(), ow = c.out_w(), co = c.out_channels;
    const int64_t phw = int64_t{oh / k.pk} * (ow / k.pk);
    const size_t npooled = static_cast<size_t>(k.cc.n * phw * co);
    const auto dpooled = random_vector(npooled, seed++);
    DeviceBuffer pooled(backend.get(), std::vector<float>(npooled, 1e30f)),
        dp(backend.get(), nhwc_to_blocked(dpooled, k.cc.n, phw, co, c.out_block));
    f.op->forward_pooled(k.cc.n, p.x_.data(), p.w_.data(), c.bias ? p.b_.data() : nullptr,
                         pooled.data(), f.positions);

    const NaivePooling want = naive_relu_max_pool(p.y_ref(), dpooled, k.cc.n, oh, ow, co, k.pk);
    EXPECT_TRUE(winograd_close(blocked_to_nhwc(pooled.to_host(), k.cc.n, phw, co, c.out_block),
                               want.pooled))
        << "pooled";
    size_t live = 0;
    for (double v : want.dy) live += v != 0;
    ASSERT_GT(live, npooled / 4) << "the case must send gradient down";
    ASSERT_LT(live, npooled) << "the case must have windows the ReLU closes";
    const ConvGrads ref =
        conv_backward_ref(c, k.cc.n, p.x, p.w, std::vector<float>(want.dy.begin(), want.dy.end()));
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
      const auto w0 = random_vector(p.w.size(), seed++), b0 = random_vector(p.b.size(), seed++);
      DeviceBuffer gw(backend.get(), w0), gb(backend.get(), b0);
      f.op->backward_pooled(k.cc.n, p.x_.data(), p.w_.data(), dp.data(), f.positions,
                            k.with_dx ? p.gx.data() : nullptr, gw.data(),
                            c.bias ? gb.data() : nullptr, accumulate);
      std::vector<double> dw = ref.dw, db = ref.db;
      if (accumulate) {
        for (size_t i = 0; i < dw.size(); ++i) dw[i] += w0[i];
        for (size_t i = 0; i < db.size(); ++i) db[i] += b0[i];
      }
      EXPECT_TRUE(winograd_close(gw.to_host(), dw)) << "dw";
      if (c.bias) {
        EXPECT_TRUE(winograd_close(gb.to_host(), db)) << "db";
      } else {
        EXPECT_TRUE(all_close(gb.to_host(), std::vector<double>(b0.begin(), b0.end()), 0, 0))
            << "no bias: db untouched";
      }
      if (k.with_dx) {
        EXPECT_TRUE(winograd_close(p.dx(), ref.dx)) << "dx";
      }
    }
  }
}

}  // namespace
}  // namespace ddpv::test
