// The CPU backend's own convolutions against the naive loops: Winograd (Note [Winograd
// convolution]), the single-channel stem (Note [Single-channel convolution]) and the fused
// ReLU (Note [Fused ReLU]).
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "backend/cpu/cpu_ops.hpp"
#include "backend/cpu/winograd.hpp"
#include "conv_ref.hpp"
#include "op_check.hpp"

namespace ddpv::test {
namespace {

// ---- Winograd convolution on the CPU (Note [Winograd convolution]) --------------------------

// The matrices compute a 1-D correlation y_i = sum_k g_k d_{i+k} exactly (in double), and to
// float rounding when narrowed to the float matrices the loops use.
TEST(WinogradMatrices, ComputeTheOneDimensionalCorrelation) {
  uint64_t seed = 900;
  for (auto [m, r] : {std::pair{2, 3}, {4, 3}, {2, 5}, {4, 5}}) {
    SCOPED_TRACE("F(" + std::to_string(m) + "," + std::to_string(r) + ")");
    const cpu::WinogradMatricesF64 f = cpu::winograd_matrices_f64(m, r);
    const cpu::WinogradMatrices w = cpu::winograd_matrices(m, r);
    ASSERT_EQ(f.alpha, m + r - 1);
    const int a = f.alpha;
    const auto d = random_vector(a, ++seed), g = random_vector(r, ++seed);
    for (int i = 0; i < m; ++i) {
      double naive = 0, exact = 0, narrowed = 0;
      for (int k = 0; k < r; ++k) naive += double(g[k]) * d[i + k];
      for (int p = 0; p < a; ++p) {
        double gg = 0, dd = 0, ggf = 0, ddf = 0;
        for (int k = 0; k < r; ++k) gg += f.g[p * r + k] * g[k], ggf += w.g[p * r + k] * g[k];
        for (int j = 0; j < a; ++j) dd += f.bt[p * a + j] * d[j], ddf += w.bt[p * a + j] * d[j];
        exact += f.at[i * a + p] * gg * dd;
        narrowed += w.at[i * a + p] * ggf * ddf;
      }
      EXPECT_NEAR(exact, naive, 1e-12) << "output " << i;
      EXPECT_NEAR(narrowed, naive, 1e-5) << "output " << i;
    }
  }
}

// Note [Known entries]: every instance has the entries the transform loops use without
// reading them, and changing any one of those entries is caught.
TEST(WinogradMatrices, HaveTheEntriesTheLoopsAssume) {
  for (auto [m, r] : {std::pair{2, 3}, {4, 3}, {2, 5}, {4, 5}}) {
    SCOPED_TRACE("F(" + std::to_string(m) + "," + std::to_string(r) + ")");
    const cpu::WinogradMatrices w = cpu::winograd_matrices(m, r);
    const int a = w.alpha;
    ASSERT_TRUE(cpu::winograd_known_entries(w));
    // The ones and zeros, read off the matrices here rather than through the check.
    for (int i = 0; i < m; ++i) EXPECT_EQ(w.at[i * a + 1], 1.0f) << "at column 1";
    for (int k = 0; k < a - 1; ++k) EXPECT_EQ(w.at[k], 1.0f) << "at row 0";
    for (int p = 1; p < a - 1; ++p) {
      EXPECT_EQ(w.bt[p * a], 0.0f) << "bt row " << p;
      EXPECT_EQ(w.bt[p * a + a - 1], 0.0f) << "bt row " << p;
    }
    for (int p = 0; p < a - 1; ++p) EXPECT_EQ(w.bt[p * a + a - 2], 1.0f) << "bt row " << p;
    EXPECT_EQ(w.bt[a * a - 1], 1.0f);
    struct Change {
      bool in_at;
      int index;
      float value;
    };
    const Change changes[] = {
        {true, 1, 2.0f},                 // at column 1
        {true, (m - 1) * a + 1, 0.5f},   // at column 1, last row
        {true, 2, 0.5f},                 // at row 0
        {true, (m - 1) * a + a - 1, 0},  // infinity's 1 in at
        {true, a + 2, 3.0f},             // the pair of the point 1 in row 1: no longer -1
        {false, a, 0.25f},               // bt column 0 in a paired row
        {false, 2 * a - 1, 0.25f},       // bt column A - 1 in a paired row
        {false, a - 2, 2.0f},            // bt row 0, column A - 2
        {false, 2 * a + a - 2, 0.5f},    // bt row 2, column A - 2
        {false, a * a - 1, -1.0f},       // infinity's 1 in bt
        {false, 1, 0.5f},                // bt row 0 on an odd column
        {false, 2 * a + 1, 7.0f},        // the rows of +1 and -1 no longer opposite
    };
    for (const Change& c : changes) {
      cpu::WinogradMatrices bad = w;
      (c.in_at ? bad.at : bad.bt)[size_t(c.index)] = c.value;
      EXPECT_FALSE(cpu::winograd_known_entries(bad))
          << (c.in_at ? "at[" : "bt[") << c.index << "] = " << c.value;
    }
  }
}

// A CPU backend whose stride-1 3x3 and 5x5 convolutions all take the Winograd path.
std::unique_ptr<Backend> winograd_backend(int block, int threads) {
  BackendOptions o;
  o.threads = threads;
  o.activation_block = block;
  o.conv_algorithm = ConvAlgorithm::kWinograd;
  return make_backend(o);
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// Winograd's rounding follows the magnitude of a whole tile: entries are compared to 1e-5 of
// the largest (a wrong transform or a lost tile misses by far more than that).
::testing::AssertionResult winograd_close(const std::vector<float>& got,
                                          const std::vector<double>& want) {
  return all_close(got, want, 1e-4, 1e-5 * std::max(1.0, max_abs(want)));
}

// Forward, backward-data, backward-weights and bias against the naive loops, in NHWC and in
// blocks of 8 and 16: both tile sizes, 3x3 and 5x5, padding from 0 to more than the kernel
// half, sizes that do not fill the last tile, outputs too small for a 4x4 tile, and batches
// that take several chunks; on one thread and on three (the loops split images, channel
// groups and points between threads). Then backward again, accumulating: every gradient
// doubles.
TEST(ConvOpWinograd, MatchesTheNaiveLoopInEveryLayout) {
  uint64_t seed = 1000;
  for (auto [block, threads] : {std::pair{0, 1}, {8, 1}, {16, 1}, {8, 3}, {0, 3}}) {
    auto backend = winograd_backend(block, threads);
    for (ConvCase cc :
         {ConvCase{2, 16, 16, 7, 9, 3, 1, 1, true}, ConvCase{3, 32, 16, 14, 14, 5, 1, 2, false},
          ConvCase{2, 16, 32, 5, 6, 5, 1, 0, true},  // 1x2 output: F(2x2, 5x5)
          ConvCase{1, 16, 16, 11, 4, 3, 1, 2, true},
          ConvCase{13, 16, 16, 8, 8, 3, 1, 1, true}}) {  // 2 chunks of images
      Conv2dConfig c = cc.config();
      c.in_block = block_for(c.in_channels, block);
      c.out_block = block_for(c.out_channels, block);
      auto op = backend->conv2d(c);
      SCOPED_TRACE(cc.str() + " block " + std::to_string(block) + ", " + std::to_string(threads) +
                   " threads: " + op->algorithm());
      EXPECT_NE(op->algorithm().find("winograd"), std::string::npos);
      ConvProblem p(backend.get(), c, cc.n, seed);
      p.forward(*op);
      EXPECT_TRUE(winograd_close(p.y(), p.y_ref())) << "y";
      p.backward(*op, true, false);
      ConvGrads ref = p.grads_ref();
      EXPECT_TRUE(winograd_close(p.dx(), ref.dx)) << "dx";
      EXPECT_TRUE(winograd_close(p.gw.to_host(), ref.dw)) << "dw";
      if (c.bias) {
        EXPECT_TRUE(winograd_close(p.gb.to_host(), ref.db)) << "db";
      }
      p.backward(*op, false, true);
      for (double& v : ref.dw) v *= 2;
      for (double& v : ref.db) v *= 2;
      EXPECT_TRUE(winograd_close(p.gw.to_host(), ref.dw)) << "dw accumulated";
      if (c.bias) {
        EXPECT_TRUE(winograd_close(p.gb.to_host(), ref.db)) << "db accumulated";
      }
      // New weights in the same buffer (as after an optimizer step) are seen: the op keeps
      // transformed weights between calls.
      p.w = random_vector(p.w.size(), ++seed, -0.5f, 0.5f);
      upload(p.w_, p.w);
      p.forward(*op);
      EXPECT_TRUE(winograd_close(p.y(), p.y_ref())) << "y after new weights";
      p.backward(*op, true, false);
      EXPECT_TRUE(winograd_close(p.dx(), p.grads_ref().dx)) << "dx after new weights";
    }
  }
}

// The loops built for the baseline instruction set (what a CPU without AVX2 + FMA runs) give
// what the AVX2 ones give, transform by transform, on a geometry with partial tiles.
TEST(ConvOpWinograd, BaselineLoopsMatchTheAvx2Ones) {
  const cpu::WinogradKernels* avx2 = cpu::winograd_kernels_avx2(4, 5);
  if (avx2 == nullptr || !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
    GTEST_SKIP() << "no AVX2 + FMA here: only the baseline loops exist";
  for (auto [m, r] : {std::pair{2, 3}, {4, 3}, {2, 5}, {4, 5}}) {
    SCOPED_TRACE("F(" + std::to_string(m) + "," + std::to_string(r) + ")");
    const cpu::WinogradKernels* fast = cpu::winograd_kernels_avx2(m, r);
    const cpu::WinogradKernels* base = cpu::winograd_kernels_generic(m, r);
    ASSERT_NE(fast, nullptr);
    ASSERT_NE(base, nullptr);
    const cpu::WinogradMatrices mat = cpu::winograd_matrices(m, r);
    cpu::WinogradGeometry g;
    g.m = m;
    g.r = r;
    g.alpha = mat.alpha;
    g.pad = r / 2;
    g.in_h = 9;
    g.in_w = 7;
    g.out_h = g.in_h + 2 * g.pad - r + 1;
    g.out_w = g.in_w + 2 * g.pad - r + 1;
    g.tiles_h = (g.out_h + m - 1) / m;
    g.tiles_w = (g.out_w + m - 1) / m;
    g.cin = g.in_block = 16;
    g.cout = 24;
    g.out_block = 8;
    const int n = 2;
    const int64_t rows = int64_t{n} * g.tiles();
    const auto x = random_vector(size_t(n) * g.in_h * g.in_w * g.cin, 31);
    const auto dy = random_vector(size_t(n) * g.out_h * g.out_w * g.cout, 32);
    const auto t_in = random_vector(size_t(rows * cpu::winograd_tile_stride(g.alpha, g.cin)), 33);
    const auto t_out = random_vector(size_t(rows * cpu::winograd_tile_stride(g.alpha, g.cout)), 34);
    const auto bias = random_vector(size_t(g.cout), 35);
    cpu::WinogradGeometry gp = g;  // Note [Max pooling fused into the convolution]
    gp.relu = true;
    gp.pool = 2;
    const size_t cells = size_t(n) * (g.out_h / 2) * (g.out_w / 2) * g.cout;
    const auto dpooled = random_vector(cells, 36);
    auto run = [&](const cpu::WinogradKernels* k) {
      std::vector<float> v(t_in.size()), y(dy.size()), dm(t_out.size()), dx(x.size(), 0.5f),
          db(bias), pooled(cells), dmp(t_out.size()), dbp(bias);
      std::vector<int32_t> at(cells);
      k->input(g, mat.bt.data(), x.data(), 0, n, v.data());
      k->output(g, mat.at.data(), t_out.data(), bias.data(), 0, n, y.data(), nullptr);
      k->output_adjoint(g, mat.at.data(), dy.data(), nullptr, 0, n, dm.data());
      k->input_adjoint(g, mat.bt.data(), t_in.data(), 0, n, dx.data());
      k->bias_grad(g, dy.data(), nullptr, 0, n, db.data());
      k->output(gp, mat.at.data(), t_out.data(), bias.data(), 0, n, pooled.data(), at.data());
      k->output_adjoint(gp, mat.at.data(), dpooled.data(), at.data(), 0, n, dmp.data());
      k->bias_grad(gp, dpooled.data(), at.data(), 0, n, dbp.data());
      return std::vector<std::vector<float>>{
          v, y, dm, dx, db, pooled, std::vector<float>(at.begin(), at.end()), dmp, dbp};
    };
    const auto want = run(fast), got = run(base);
    const char* names[] = {
        "input",         "output",    "output_adjoint",        "input_adjoint",   "bias_grad",
        "output pooled", "positions", "output_adjoint pooled", "bias_grad pooled"};
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_TRUE(winograd_close(got[i], to_double(want[i]))) << names[i];
  }
}

// kAuto takes Winograd where it was measured faster (5x5, 16 channels or more, stride 1) and
// the direct kernels elsewhere; kDirect never takes it.
TEST(ConvOpWinograd, AutoPicksPerLayer) {
  BackendOptions o;
  o.threads = 1;
  auto autob = make_backend(o);
  o.conv_algorithm = ConvAlgorithm::kDirect;
  auto direct = make_backend(o);
  const int b = autob->activation_block();
  auto conv = [&](Backend& be, ConvCase cc) {
    Conv2dConfig c = cc.config();
    c.in_block = block_for(c.in_channels, b);
    c.out_block = block_for(c.out_channels, b);
    return be.conv2d(c)->algorithm();
  };
  const ConvCase lenet_conv2{64, 32, 64, 14, 14, 5, 1, 2, true};
  EXPECT_EQ(conv(*autob, lenet_conv2), "winograd F(4x4,5x5)");
  EXPECT_EQ(conv(*direct, lenet_conv2), "direct");
  EXPECT_EQ(conv(*autob, ConvCase{64, 1, 32, 28, 28, 5, 1, 2, true}), "single-channel direct");
  EXPECT_EQ(conv(*direct, ConvCase{64, 1, 32, 28, 28, 5, 1, 2, true}), "direct");
  EXPECT_EQ(conv(*autob, ConvCase{64, 32, 64, 14, 14, 5, 2, 2, true}), "direct");  // stride 2
  EXPECT_EQ(conv(*autob, ConvCase{64, 32, 32, 16, 16, 1, 1, 0, true}), "direct");  // 1x1
}

// Note [Single-channel convolution]: a stem from one channel runs on our own loops (unless the
// direct algorithm is asked for), in every output layout, with stride, padding and partial
// windows, against the naive loops, on one thread and on three; then backward again,
// accumulating.
TEST(ConvOpSingleChannel, MatchesTheNaiveLoopInEveryLayout) {
  uint64_t seed = 1500;
  for (auto [block, threads] : {std::pair{0, 1}, {8, 1}, {16, 1}, {8, 3}}) {
    BackendOptions o;
    o.threads = threads;
    o.activation_block = block;
    auto backend = make_backend(o);
    for (ConvCase cc :
         {ConvCase{3, 1, 32, 28, 28, 5, 1, 2, true}, ConvCase{2, 1, 16, 7, 9, 3, 2, 1, false},
          ConvCase{2, 1, 8, 3, 3, 5, 1, 1, true},  // windows mostly padding
          ConvCase{1, 1, 16, 6, 5, 3, 1, 0, true}}) {
      Conv2dConfig c = cc.config();
      c.out_block = block_for(c.out_channels, block);
      auto op = backend->conv2d(c);
      SCOPED_TRACE(cc.str() + " block " + std::to_string(block) + ", " + std::to_string(threads) +
                   " threads");
      EXPECT_EQ(op->algorithm(), "single-channel direct");
      ConvProblem p(backend.get(), c, cc.n, seed);
      p.forward(*op);
      EXPECT_TRUE(all_close(p.y(), p.y_ref(), 1e-5, 1e-5)) << "y";
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
// loops) and 4 (the dense path), strides 1 and 2, NHWC and blocks of 8.
TEST(ConvOpSingleChannel, BaselineLoopsMatchTheAvx2Ones) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
    GTEST_SKIP() << "no AVX2 + FMA here: the backend runs the baseline loops everywhere";
  struct Case {
    ConvCase cc;
    int block;
  };
  const Case cases[] = {{{3, 1, 32, 28, 28, 5, 1, 2, true}, 8},
                        {{2, 1, 16, 9, 7, 3, 1, 1, true}, 0},
                        {{2, 1, 24, 13, 13, 7, 2, 3, false}, 8},
                        {{2, 1, 16, 10, 10, 4, 1, 1, true}, 0}};
  uint64_t seed = 2700;
  for (const Case& k : cases) {
    Conv2dConfig c = k.cc.config();
    c.out_block = block_for(c.out_channels, k.block);
    SCOPED_TRACE(k.cc.str() + " block " + std::to_string(k.block));
    const int n = k.cc.n, oh = c.out_h(), ow = c.out_w(), co = c.out_channels;
    const size_t ny = size_t(n) * oh * ow * co, npooled = size_t(n) * (oh / 2) * (ow / 2) * co;
    const auto x = random_vector(size_t(n) * c.in_h * c.in_w, ++seed);
    const auto w = random_vector(size_t(co) * c.kernel * c.kernel, ++seed);
    const auto b = random_vector(size_t(co), ++seed);
    const auto dy = random_vector(ny, ++seed), dpooled = random_vector(npooled, ++seed);
    auto run = [&](bool baseline) {
      cpu::CpuContext ctx;
      ctx.threads = 1;
      auto plain = cpu::make_single_channel_conv2d(ctx, c, baseline);
      auto fused = cpu::make_single_channel_conv2d(ctx, c, baseline);
      EXPECT_TRUE(fused->fuse_relu());
      EXPECT_TRUE(fused->fuse_max_pool(2));
      std::vector<float> y(ny), dx(x.size()), dw(w.size()), db(b.size()), pooled(npooled),
          pdw(w.size()), pdb(b.size());
      std::vector<int32_t> at(npooled);
      const float* bias = c.bias ? b.data() : nullptr;
      plain->forward(n, x.data(), w.data(), bias, y.data());
      plain->backward(n, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), false);
      fused->forward_pooled(n, x.data(), w.data(), bias, pooled.data(), at.data());
      fused->backward_pooled(n, x.data(), w.data(), dpooled.data(), at.data(), nullptr, pdw.data(),
                             pdb.data(), false);
      return std::vector<std::vector<float>>{
          y, dx, dw, db, pooled, std::vector<float>(at.begin(), at.end()), pdw, pdb};
    };
    const auto want = run(false), got = run(true);
    const char* names[] = {"y", "dx", "dw", "db", "pooled", "positions", "pooled dw", "pooled db"};
    for (size_t i = 0; i < want.size(); ++i) {
      if (!c.bias && (i == 3 || i == 7)) continue;  // no bias: db is not written
      EXPECT_TRUE(all_close(got[i], to_double(want[i]), 1e-5, 1e-5)) << names[i];
    }
    size_t open = 0;
    for (float q : want[5]) open += q >= 0;
    EXPECT_GT(open, npooled / 4) << "the pooled case must send gradient down";
    EXPECT_LT(open, npooled) << "and have windows the ReLU closed";
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
    auto op = backend->conv2d(c);
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
  const auto direct = backend->conv2d(ConvCase{2, 8, 8, 6, 6, 3, 2, 1, true}.config());
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
  std::unique_ptr<Conv2dOp> op;
  std::unique_ptr<Pool2dOp> pool;
  int32_t* positions = nullptr;
};
FusedPooling fuse_pooling(Backend& backend, const Conv2dConfig& c, int n, int pk) {
  FusedPooling f;
  f.op = backend.conv2d(c);
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
  f.pool = backend.pool2d(pc);
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
    for (int pk : {2, 3}) {
      BackendOptions o;
      o.threads = 1;
      o.activation_block = block;
      auto backend = make_backend(o);
      const ConvCase cc{2, 1, 16, 9, 7, 3, 1, 1, true};  // output 9x7: partial windows at the edge
      Conv2dConfig c = cc.config();
      c.out_block = block_for(c.out_channels, block);
      SCOPED_TRACE(cc.str() + " block " + std::to_string(block) + " pool " + std::to_string(pk));
      FusedPooling f = fuse_pooling(*backend, c, cc.n, pk);
      ASSERT_EQ(f.op->algorithm(), "single-channel direct");
      ASSERT_NE(f.positions, nullptr);

      ConvProblem p(backend.get(), c, cc.n, seed);
      const int oh = c.out_h(), ow = c.out_w(), co = 16;
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
// pooling, strides 1 and 2. Winograd: F(4x4, 5x5) and F(4x4, 3x3), 2 x 2 pooling (odd outputs
// leave a row and a column out). Both layouts, one thread and three, overwriting and
// accumulating.
TEST(ConvOpFusedMaxPool, MatchesTheNaiveLoopsForwardAndBackward) {
  struct Case {
    ConvCase cc;
    int pk, block, threads;
    bool with_dx;
    const char* algorithm;
  };
  const char* single = "single-channel direct";
  const Case cases[] = {
      {{2, 1, 16, 9, 7, 3, 1, 1, true}, 2, 0, 1, false, single},  // partial windows at the edge
      {{2, 1, 16, 9, 7, 3, 1, 1, true}, 3, 8, 1, false, single},
      {{3, 1, 24, 12, 11, 5, 1, 2, true}, 2, 8, 1, false, single},
      {{3, 1, 8, 13, 13, 7, 2, 3, false}, 2, 0, 1, false, single},   // stride 2, no bias
      {{16, 1, 16, 28, 28, 5, 1, 2, true}, 2, 0, 3, false, single},  // threads: image slices
      {{16, 1, 32, 28, 28, 5, 1, 2, true}, 2, 8, 3, false, single},
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
