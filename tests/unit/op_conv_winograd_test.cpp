// The CPU backend's Winograd convolution (Note [Winograd convolution]): its matrices, its op
// against the naive loops, its baseline loops against the AVX2 ones, and where it is chosen.
// The single-channel op and the fusions are in op_conv_fused_test.cpp, the residual-block
// fusions in op_residual_fusion_test.cpp.
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>

#include "backend/cpu/kernels/winograd/winograd.hpp"
#include "conv_ref.hpp"
#include "op_check.hpp"

namespace ddpv::test {
namespace {

// ---- Winograd convolution on the CPU (Note [Winograd convolution]) --------------------------

// The builds of the loops this CPU can run: baseline, AVX2 + FMA, AVX-512.
std::vector<const cpu::WinogradKernels*> kernel_builds(int m, int r) {
  std::vector<const cpu::WinogradKernels*> out{cpu::winograd_kernels_generic(m, r)};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      cpu::winograd_kernels_avx2(m, r) != nullptr)
    out.push_back(cpu::winograd_kernels_avx2(m, r));
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      cpu::winograd_kernels_avx512(m, r) != nullptr)
    out.push_back(cpu::winograd_kernels_avx512(m, r));
  return out;
}

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

// Forward, backward-data, backward-weights and bias against the naive loops, in NHWC and in
// blocks of 8 and 16: both tile sizes, 3x3 and 5x5, padding from 0 to more than the kernel
// half, sizes that do not fill the last tile, outputs too small for a 4x4 tile, and batches
// that take several chunks; on one thread and on three (the threads take whole chunks, or
// split a lone chunk's images and points). Then backward again, accumulating: every gradient
// doubles.
TEST(ConvOpWinograd, MatchesTheNaiveLoopInEveryLayout) {
  uint64_t seed = 1000;
  for (auto [block, threads] : {std::pair{0, 1}, {8, 1}, {16, 1}, {8, 3}, {0, 3}}) {
    auto backend = winograd_backend(block, threads);
    for (ConvCase cc :
         {ConvCase{2, 16, 16, 7, 9, 3, 1, 1, true}, ConvCase{3, 32, 16, 14, 14, 5, 1, 2, false},
          ConvCase{2, 16, 32, 5, 6, 5, 1, 0, true},  // 1x2 output: F(2x2, 5x5)
          ConvCase{1, 16, 16, 11, 4, 3, 1, 2, true}, ConvCase{13, 16, 16, 8, 8, 3, 1, 1, true},
          // 3 chunks of 4, 4 and 1 images: on three threads, one each (Note [Chunks between
          // threads])
          ConvCase{9, 16, 16, 16, 16, 3, 1, 1, true}}) {
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

// Note [Chunks between threads]: a team of threads gives the same result bit for bit from one
// call to the next (a run is reproducible for a fixed thread count), and to rounding what one
// thread gives; the forward, both gradients and the bias gradient, overwritten and
// accumulated.
TEST(ConvOpWinograd, ChunksBetweenThreadsRepeatBitForBit) {
  const ConvCase cc{11, 16, 32, 16, 16, 3, 1, 1, true};  // 3 chunks: 4, 4 and 3 images
  struct Result {
    std::vector<float> y, dx, dw, db;
  };
  auto run = [&](int threads) {
    auto backend = winograd_backend(8, threads);
    Conv2dConfig c = cc.config();
    c.in_block = block_for(c.in_channels, 8);
    c.out_block = block_for(c.out_channels, 8);
    auto op = backend->conv2d(c);
    uint64_t seed = 4242;  // the same data for every run
    ConvProblem p(backend.get(), c, cc.n, seed);
    p.forward(*op);
    p.backward(*op, true, false);
    p.backward(*op, true, true);  // dw and db accumulate; dx is overwritten
    return Result{p.y(), p.dx(), p.gw.to_host(), p.gb.to_host()};
  };
  const Result one = run(1), a = run(3), b = run(3);
  EXPECT_EQ(a.y, b.y);
  EXPECT_EQ(a.dx, b.dx);
  EXPECT_EQ(a.dw, b.dw);
  EXPECT_EQ(a.db, b.db);
  auto close = [](const std::vector<float>& x, const std::vector<float>& y) {
    return winograd_close(x, std::vector<double>(y.begin(), y.end()));
  };
  EXPECT_EQ(a.y, one.y);  // each image's tiles go through the same loops in the same order
  EXPECT_EQ(a.dx, one.dx);
  EXPECT_TRUE(close(a.dw, one.dw)) << "dw";  // summed per thread, then added
  EXPECT_TRUE(close(a.db, one.db)) << "db";
}

// The loops built for the baseline instruction set (what a CPU without AVX2 + FMA runs) give
// what the AVX2 ones (and the AVX-512 ones) give, transform by transform, on a geometry with
// partial tiles.
TEST(ConvOpWinograd, BaselineLoopsMatchTheAvx2Ones) {
  if (kernel_builds(4, 5).size() < 2)
    GTEST_SKIP() << "no AVX2 + FMA here: only the baseline loops exist";
  for (auto [m, r] : {std::pair{2, 3}, {4, 3}, {2, 5}, {4, 5}})
    for (const cpu::WinogradKernels* fast : kernel_builds(m, r)) {
      SCOPED_TRACE("F(" + std::to_string(m) + "," + std::to_string(r) + ")");
      const cpu::WinogradKernels* base = cpu::winograd_kernels_generic(m, r);
      ASSERT_NE(base, nullptr);
      if (fast == base) continue;
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
      const auto t_out =
          random_vector(size_t(rows * cpu::winograd_tile_stride(g.alpha, g.cout)), 34);
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
        k->output(g, mat.at.data(), t_out.data(), bias.data(), 0, n, y.data(), nullptr, nullptr);
        k->output_adjoint(g, mat.at.data(), dy.data(), nullptr, 0, n, dm.data(), db.data());
        k->input_adjoint(g, mat.bt.data(), t_in.data(), 0, n, dx.data());
        k->output(gp, mat.at.data(), t_out.data(), bias.data(), 0, n, pooled.data(), at.data(),
                  nullptr);
        k->output_adjoint(gp, mat.at.data(), dpooled.data(), at.data(), 0, n, dmp.data(),
                          dbp.data());
        return std::vector<std::vector<float>>{
            v, y, dm, dx, db, pooled, std::vector<float>(at.begin(), at.end()), dmp, dbp};
      };
      const auto want = run(fast), got = run(base);
      const char* names[] = {
          "input",         "output",    "output_adjoint",        "input_adjoint",   "bias sums",
          "output pooled", "positions", "output_adjoint pooled", "bias sums pooled"};
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_TRUE(winograd_close(got[i], to_double(want[i]))) << names[i];
    }
}

// The filter transform u = g w g^T and its adjoint (Note [Filter transforms in registers]),
// in every instance and instruction set, against g applied in double; the adjoint by
// <filter(w), du> = <w, filter_adjoint(du)>, and with accumulate, adding to what dw held.
TEST(ConvOpWinograd, FilterTransformsApplyTheMatrices) {
  const int cin = 16, cout = 24;
  for (auto [m, r] : {std::pair{2, 3}, {4, 3}, {2, 5}, {4, 5}}) {
    const cpu::WinogradMatrices mat = cpu::winograd_matrices(m, r);
    const cpu::WinogradMatricesF64 g64 = cpu::winograd_matrices_f64(m, r);
    const int a = mat.alpha;
    const auto w = random_vector(size_t(cout) * cin * r * r, 41);
    const auto du = random_vector(size_t(a) * a * cin * cout, 42);
    std::vector<double> u_want(du.size()), dw_want(w.size());
    for (int co = 0; co < cout; ++co)
      for (int ci = 0; ci < cin; ++ci)
        for (int i = 0; i < a; ++i)
          for (int j = 0; j < a; ++j) {
            const size_t at = (size_t(i * a + j) * cin + ci) * cout + co;
            for (int k = 0; k < r; ++k)
              for (int l = 0; l < r; ++l) {
                const double gg = g64.g[size_t(i * r + k)] * g64.g[size_t(j * r + l)];
                const size_t wat = (size_t(co) * cin + ci) * r * r + size_t(k * r + l);
                u_want[at] += gg * w[wat];
                dw_want[wat] += gg * du[at];
              }
          }
    double lhs = 0, rhs = 0;  // <u, du> and <w, dw>, both from the double transforms
    for (size_t i = 0; i < du.size(); ++i) lhs += u_want[i] * du[i];
    for (size_t i = 0; i < w.size(); ++i) rhs += w[i] * dw_want[i];
    ASSERT_NEAR(lhs, rhs, 1e-9 * std::max(1.0, std::abs(lhs)));
    cpu::WinogradGeometry geo;
    geo.m = m, geo.r = r, geo.alpha = a, geo.cin = cin, geo.cout = cout;
    for (const cpu::WinogradKernels* k : kernel_builds(m, r)) {
      SCOPED_TRACE("F(" + std::to_string(m) + "," + std::to_string(r) + ")");
      std::vector<float> u(du.size()), dw(w.size()), dw_added(w.size(), 0.5f);
      k->filter(geo, mat.g.data(), w.data(), u.data());
      k->filter_adjoint(geo, mat.g.data(), du.data(), dw.data(), false);
      k->filter_adjoint(geo, mat.g.data(), du.data(), dw_added.data(), true);
      EXPECT_TRUE(winograd_close(u, u_want)) << "filter";
      EXPECT_TRUE(winograd_close(dw, dw_want)) << "filter_adjoint";
      std::vector<double> plus_half = dw_want;
      for (double& v : plus_half) v += 0.5;
      EXPECT_TRUE(winograd_close(dw_added, plus_half)) << "filter_adjoint, accumulate";
    }
  }
}

// The per-point products against a naive loop in double, in every instruction set: A read in
// place (the forward and backward-data layouts) and as A^T with k strided, which goes through
// packed panels (Note [Packed weight-gradient panels]), with k past one panel, row counts that
// leave partial blocks, a last column block of 8, and accumulate on and off.
TEST(ConvOpWinograd, GemmsMatchNaiveProducts) {
  const int points = 3;
  // m % 8 != 0 (13) keeps A^T in place; the others pack it.
  // n = 56: the wide loops' 32- and 16-column blocks and an 8-column one (Note [Wide
  // Winograd GEMMs]); m = 40: partial blocks of both widths' row counts.
  for (auto [m, n, k] : {std::tuple{32, 64, 32},
                         {16, 24, 100},
                         {13, 24, 100},
                         {40, 8, 7},
                         {20, 56, 70},
                         {40, 56, 9}}) {
    for (bool transposed : {false, true}) {
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
                     (transposed ? " A^T" : " A") + (accumulate ? " accumulate" : ""));
        cpu::WinogradGemm g;
        g.points = points, g.m = m, g.n = n, g.k = k, g.accumulate = accumulate;
        // A_p(i, kk) at a[p * a_point + i * a_row + kk * a_col], rows padded as the buffers are
        const int64_t lda = (transposed ? m : k) + 5;
        g.a_point = (transposed ? k : m) * lda;
        g.a_row = transposed ? 1 : lda;
        g.a_col = transposed ? lda : 1;
        g.ldb = n + 3, g.b_point = k * g.ldb;
        g.ldc = n + 2, g.c_point = m * g.ldc;
        const auto a = random_vector(size_t(points * g.a_point), 51);
        const auto b = random_vector(size_t(points * g.b_point), 52);
        const auto c0 = random_vector(size_t(points * g.c_point), 53);
        std::vector<double> want(c0.begin(), c0.end());
        for (int p = 0; p < points; ++p)
          for (int i = 0; i < m; ++i)
            for (int j = 0; j < n; ++j) {
              double sum = accumulate ? c0[size_t(p * g.c_point + i * g.ldc + j)] : 0.0;
              for (int kk = 0; kk < k; ++kk)
                sum += double(a[size_t(p * g.a_point + i * g.a_row + kk * g.a_col)]) *
                       b[size_t(p * g.b_point + kk * g.ldb + j)];
              want[size_t(p * g.c_point + i * g.ldc + j)] = sum;
            }
        for (const cpu::WinogradKernels* kern : kernel_builds(4, 5)) {
          std::vector<float> c = c0;
          g.a = a.data(), g.b = b.data(), g.c = c.data();
          kern->gemm(g);
          EXPECT_TRUE(all_close(c, want, 1e-5, 1e-5 * k));
        }
      }
    }
  }
}

// kAuto takes Winograd where it was measured faster (3x3 and 5x5, 16 channels or more, stride
// 1) and the direct kernels elsewhere; kDirect never takes it.
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
  EXPECT_EQ(conv(*autob, ConvCase{64, 1, 32, 28, 28, 5, 1, 2, true}),
            "single-channel winograd F(4x4,5x5)");
  EXPECT_EQ(conv(*autob, ConvCase{64, 1, 32, 28, 28, 5, 2, 2, true}), "single-channel direct");
  EXPECT_EQ(conv(*direct, ConvCase{64, 1, 32, 28, 28, 5, 1, 2, true}), "direct");
  EXPECT_EQ(conv(*autob, ConvCase{64, 32, 64, 14, 14, 5, 2, 2, true}), "direct");  // stride 2
  EXPECT_EQ(conv(*autob, ConvCase{64, 32, 32, 16, 16, 1, 1, 0, true}), "direct");  // 1x1
  const ConvCase resnet20_stage1{64, 16, 16, 32, 32, 3, 1, 1, false};
  EXPECT_EQ(conv(*autob, resnet20_stage1), "winograd F(4x4,3x3)");
  EXPECT_EQ(conv(*direct, resnet20_stage1), "direct");
  EXPECT_EQ(conv(*autob, ConvCase{64, 8, 16, 32, 32, 3, 1, 1, false}), "direct");   // 8 channels
  EXPECT_EQ(conv(*autob, ConvCase{64, 16, 32, 32, 32, 3, 2, 1, false}), "direct");  // stride 2
}

}  // namespace
}  // namespace ddpv::test
