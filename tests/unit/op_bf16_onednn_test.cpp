// The CPU backend's ops on oneDNN's bf16 primitives (Note [bf16 on oneDNN]), under
// --precision bf16 --cpu-bf16 onednn, against naive loops in double. oneDNN computes on the
// bf16 inputs and the weights rounded to bf16 with f32 accumulation, so the loops take the
// same bf16 inputs and rounded weights, and each output must lie within the error that leaves:
// a bf16 output within one bf16 rounding (2^-8 of its size) plus the accumulation's error
// (a small multiple of f32's epsilon times the sum of the terms' magnitudes); an f32 output
// (weight and bias gradients, statistics) within the accumulation's error alone. A dropped or
// doubled term, a wrong layout or an f32 weight read as bf16 is far outside both.
//
// oneDNN 2.6 refuses bf16 primitives on a CPU without AVX-512 (the tests skip there, saying
// so); on AVX-512 without bf16 instructions it emulates them, and --cpu-bf16 onednn takes any
// kernel it has, its reference ones included, so the tests run wherever oneDNN has one.
#include <cmath>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.hpp"
#include "ddpv/core/dtype.hpp"
#include "support/test_support.hpp"

namespace ddpv {
namespace {

using Vec = std::vector<float>;
using Bits = std::vector<uint16_t>;
constexpr double kBf16Step = 1.0 / 256;  // 2^-8: twice bf16's rounding error, relative
constexpr double kAccum = 2e-5;          // f32 accumulation, relative to the terms' sum

float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }
using test::bf16_values;
using test::to_bf16;
Vec widen(const Bits& b) {
  Vec v(b.size());
  for (size_t i = 0; i < b.size(); ++i) v[i] = bf16_to_f32(b[i]);
  return v;
}
Vec rounded(const Vec& v) {
  Vec r(v);
  for (float& x : r) x = round_bf16(x);
  return r;
}

// An exact value and the bound on what oneDNN may give for it.
struct Expect {
  std::vector<double> value, mag;  // mag: the sum of the terms' magnitudes
  explicit Expect(size_t n = 0) : value(n, 0.0), mag(n, 0.0) {}
  void add(size_t i, double term) {
    value[i] += term;
    mag[i] += std::fabs(term);
  }
};

// Every element of `got` within the bound: one bf16 rounding where `bf16_output`, plus the
// accumulation's error.
void expect_within(const Vec& got, const Expect& want, bool bf16_output, const char* what,
                   double accum = kAccum) {
  ASSERT_EQ(got.size(), want.value.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol =
        (bf16_output ? kBf16Step * std::fabs(want.value[i]) : 0.0) + accum * want.mag[i] + 1e-30;
    if (!(std::fabs(got[i] - want.value[i]) <= tol) && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size()
                     << " elements outside the bf16 bound, first at " << first << ": " << got[first]
                     << " against " << want.value[first];
}

class OneDnnBf16OpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // oneDNN is asked once, through the convolution: where it has no bf16 primitive at all,
    // the op refuses with one line, and every test here skips.
    try {
      (void)be_->conv2d(Conv2dConfig{.in_channels = 8, .out_channels = 8, .in_h = 4, .in_w = 4});
    } catch (const Error& e) {
      GTEST_SKIP() << "oneDNN has no bf16 primitives on this CPU: " << e.what();
    }
  }
  // NHWC (i, s, c) <-> the backend's layout `block` for bf16 tensors.
  Bits to_layout(const Bits& x, int n, int h, int w, int c, int block) {
    if (block == 0) return x;
    Bits y(x.size());
    be_->relayout(n, h, w, c, 0, block, ConstAct(x.data(), DType::kBF16),
                  MutAct(y.data(), DType::kBF16));
    return y;
  }
  Bits from_layout(const Bits& x, int n, int h, int w, int c, int block) {
    if (block == 0) return x;
    Bits y(x.size());
    be_->relayout(n, h, w, c, block, 0, ConstAct(x.data(), DType::kBF16),
                  MutAct(y.data(), DType::kBF16));
    return y;
  }
  static ConstAct in(const Bits& b) { return {b.data(), DType::kBF16}; }
  static MutAct out(Bits& b) { return {b.data(), DType::kBF16}; }

  std::unique_ptr<Backend> be_ = make_backend(
      BackendOptions{.threads = 2, .precision = Precision::kBF16, .cpu_bf16 = CpuBf16::kOneDnn});
};

TEST_F(OneDnnBf16OpTest, TheBackendAndItsOpsSayTheyRunOnOneDnn) {
  EXPECT_NE(be_->name().find("bf16 on oneDNN"), std::string::npos) << be_->name();
  auto op = be_->conv2d(Conv2dConfig{.in_channels = 8, .out_channels = 8, .in_h = 4, .in_w = 4});
  EXPECT_NE(op->algorithm().find("bf16 on oneDNN"), std::string::npos) << op->algorithm();
  EXPECT_EQ(be_->caveat(), "") << "every op is oneDNN's: nothing to warn of";
  // The f32 fused blocks compose the f32 ops: declined here, every layer on oneDNN's bf16 one
  // (a conv -> BatchNorm -> ReLU chain excepted: Note [bf16 blocks on oneDNN]).
  FusedBlockConfig fb;
  fb.conv = Conv2dConfig{.in_channels = 8, .out_channels = 8, .in_h = 6, .in_w = 6, .padding = 1};
  fb.relu = true;
  EXPECT_EQ(be_->fused_block(fb), nullptr);
}

struct ConvCase {
  Conv2dConfig cfg;
  const char* name;
};

TEST_F(OneDnnBf16OpTest, ConvolutionMatchesNaiveLoopsOnRoundedWeights) {
  const int block = be_->activation_block();
  const ConvCase cases[] = {
      {{.in_channels = 8, .out_channels = 16, .in_h = 9, .in_w = 9, .kernel = 3, .padding = 1},
       "3x3 nhwc"},
      {{.in_channels = 16,
        .out_channels = 16,
        .in_h = 7,
        .in_w = 7,
        .kernel = 3,
        .padding = 1,
        .in_block = block,
        .out_block = block},
       "3x3 blocked"},
      {{.in_channels = 2 * block,  // channels that fill the ISA's blocks (8 or 16)
        .out_channels = block,
        .in_h = 8,
        .in_w = 8,
        .kernel = 1,
        .stride = 2,
        .in_block = block,
        .out_block = block},
       "1x1 stride 2 blocked"},
      {{.in_channels = 3,
        .out_channels = 16,
        .in_h = 12,
        .in_w = 12,
        .kernel = 7,
        .stride = 2,
        .padding = 3,
        .bias = true,
        .out_block = block},
       "7x7 stride 2 stem, rgb nhwc into blocks, bias"},
  };
  for (const ConvCase& cc : cases) {
    SCOPED_TRACE(cc.name);
    const Conv2dConfig& c = cc.cfg;
    const int n = 2, ci = c.in_channels, co = c.out_channels, k = c.kernel;
    const int oh = c.out_h(), ow = c.out_w();
    const size_t nx = static_cast<size_t>(n) * c.in_h * c.in_w * ci;
    const size_t ny = static_cast<size_t>(n) * oh * ow * co;
    const size_t nw = static_cast<size_t>(co) * ci * k * k;
    const Vec x = bf16_values(nx, 1), dy = bf16_values(ny, 2);
    const Vec w = test::random_vector(nw, 3, -0.3f, 0.3f),
              b = test::random_vector(static_cast<size_t>(co), 4);
    const Vec wr = rounded(w);  // what oneDNN computes with

    // Naive NHWC loops over every (output, tap) pair.
    Expect y(ny), dx(nx), dw(nw), db(static_cast<size_t>(co));
    for (int i = 0; i < n; ++i)
      for (int yo = 0; yo < oh; ++yo)
        for (int xo = 0; xo < ow; ++xo)
          for (int o = 0; o < co; ++o) {
            const size_t yi = ((static_cast<size_t>(i) * oh + yo) * ow + xo) * co + o;
            if (c.bias) y.add(yi, b[static_cast<size_t>(o)]);
            db.add(static_cast<size_t>(o), dy[yi]);
            for (int ky = 0; ky < k; ++ky)
              for (int kx = 0; kx < k; ++kx) {
                const int yy = yo * c.stride - c.padding + ky, xx = xo * c.stride - c.padding + kx;
                if (yy < 0 || yy >= c.in_h || xx < 0 || xx >= c.in_w) continue;
                for (int q = 0; q < ci; ++q) {
                  const size_t xi = ((static_cast<size_t>(i) * c.in_h + yy) * c.in_w + xx) * ci + q;
                  const size_t wi = ((static_cast<size_t>(o) * ci + q) * k + ky) * k + kx;
                  y.add(yi, double(x[xi]) * wr[wi]);
                  dx.add(xi, double(dy[yi]) * wr[wi]);
                  dw.add(wi, double(dy[yi]) * x[xi]);
                }
              }
          }

    auto op = be_->conv2d(c);
    const Bits xb = to_layout(to_bf16(x), n, c.in_h, c.in_w, ci, c.in_block);
    const Bits dyb = to_layout(to_bf16(dy), n, oh, ow, co, c.out_block);
    Bits yb(ny), dxb(nx);
    Vec dw_got(nw), db_got(static_cast<size_t>(co));
    const float* bias = c.bias ? b.data() : nullptr;
    op->forward(n, in(xb), w.data(), bias, out(yb));
    op->backward(n, in(xb), w.data(), in(dyb), out(dxb), dw_got.data(),
                 c.bias ? db_got.data() : nullptr, false);
    expect_within(widen(from_layout(yb, n, oh, ow, co, c.out_block)), y, true, "y");
    expect_within(widen(from_layout(dxb, n, c.in_h, c.in_w, ci, c.in_block)), dx, true, "dx");
    expect_within(dw_got, dw, false, "dw (f32)");
    if (c.bias) expect_within(db_got, db, false, "db (f32)");

    // Accumulating adds the same gradient to what dw holds.
    Vec dw_twice = dw_got;
    op->backward(n, in(xb), w.data(), in(dyb), nullptr, dw_twice.data(),
                 c.bias ? db_got.data() : nullptr, true);
    Expect dw2 = dw;  // the same terms twice
    for (size_t i = 0; i < nw; ++i) {
      dw2.value[i] *= 2;
      dw2.mag[i] *= 2;
    }
    expect_within(dw_twice, dw2, false, "dw accumulated");

    // The model's f32 input (the stem's NHWC images) gives what its bf16 rounding gives.
    if (c.in_block == 0) {
      Bits yb2(ny);
      op->forward(n, x.data(), w.data(), bias, out(yb2));
      EXPECT_EQ(yb2, yb) << "f32 input";
    }
  }
}

TEST_F(OneDnnBf16OpTest, BatchNormMatchesNaiveLoopsWithF32Statistics) {
  for (const int layout : {0, be_->activation_block()}) {
    SCOPED_TRACE(layout);
    const int n = 4, ch = 16, h = 5, w = 5;
    const BatchNormConfig cfg{.channels = ch, .h = h, .w = w, .block = layout};
    const size_t count = static_cast<size_t>(n) * h * w * ch, m = count / ch;
    const Vec x = bf16_values(count, 5, -2.f, 3.f), dy = bf16_values(count, 6);
    const Vec gamma = test::random_vector(static_cast<size_t>(ch), 7, 0.5f, 1.5f);
    const Vec beta = test::random_vector(static_cast<size_t>(ch), 8);

    // Naive, per channel in double: batch statistics, y, and backward through them.
    Expect y(count), dx(count), dg(static_cast<size_t>(ch)), dbt(static_cast<size_t>(ch)),
        rm(static_cast<size_t>(ch)), rv(static_cast<size_t>(ch)), yi(count);
    for (int c = 0; c < ch; ++c) {
      double mean = 0, var = 0, mdy = 0, mdyx = 0;
      for (size_t j = 0; j < m; ++j) mean += x[j * ch + static_cast<size_t>(c)];
      mean /= double(m);
      for (size_t j = 0; j < m; ++j) var += std::pow(x[j * ch + static_cast<size_t>(c)] - mean, 2);
      var /= double(m);
      const double sd = std::sqrt(var + double(cfg.eps)), g = gamma[static_cast<size_t>(c)];
      for (size_t j = 0; j < m; ++j) {
        const size_t e = j * ch + static_cast<size_t>(c);
        const double xh = (x[e] - mean) / sd;
        y.add(e, g * xh);
        y.add(e, beta[static_cast<size_t>(c)]);
        dg.add(static_cast<size_t>(c), dy[e] * xh);
        dbt.add(static_cast<size_t>(c), dy[e]);
        mdy += dy[e];
        mdyx += dy[e] * xh;
      }
      mdy /= double(m);
      mdyx /= double(m);
      for (size_t j = 0; j < m; ++j) {
        const size_t e = j * ch + static_cast<size_t>(c);
        const double xh = (x[e] - mean) / sd;
        dx.add(e, g / sd * dy[e]);
        dx.add(e, -g / sd * mdy);
        dx.add(e, -g / sd * xh * mdyx);
      }
      rm.add(static_cast<size_t>(c), cfg.momentum * mean);  // from 0
      rv.add(static_cast<size_t>(c), 1.0 - cfg.momentum);   // from 1
      rv.add(static_cast<size_t>(c), cfg.momentum * var * double(m) / double(m - 1));
    }

    auto op = be_->batchnorm2d(cfg);
    const Bits xb = to_layout(to_bf16(x), n, h, w, ch, layout);
    const Bits dyb = to_layout(to_bf16(dy), n, h, w, ch, layout);
    Bits yb(count), dxb(count), yib(count);
    Vec dg_got(static_cast<size_t>(ch)), dbt_got(static_cast<size_t>(ch)),
        rm_got(static_cast<size_t>(ch), 0.f), rv_got(static_cast<size_t>(ch), 1.f);
    op->forward_train(n, in(xb), gamma.data(), beta.data(), out(yb), rm_got.data(), rv_got.data());
    op->backward(n, in(xb), gamma.data(), in(dyb), out(dxb), dg_got.data(), dbt_got.data(), false);
    // Inference normalises with the running statistics it is given.
    op->forward_infer(n, in(xb), gamma.data(), beta.data(), rm_got.data(), rv_got.data(), out(yib));
    for (size_t e = 0; e < count; ++e) {
      const size_t c = e % static_cast<size_t>(ch);
      const double a = gamma[c] / std::sqrt(double(rv_got[c]) + double(cfg.eps));
      yi.add(e, a * (x[e] - double(rm_got[c])));
      yi.add(e, beta[c]);
    }
    // The statistics are f32 sums over bf16 values: 1e-4 of the terms covers their rounding.
    expect_within(widen(from_layout(yb, n, h, w, ch, layout)), y, true, "y (training)", 1e-4);
    expect_within(widen(from_layout(dxb, n, h, w, ch, layout)), dx, true, "dx", 1e-4);
    expect_within(widen(from_layout(yib, n, h, w, ch, layout)), yi, true, "y (inference)", 1e-4);
    expect_within(dg_got, dg, false, "dgamma (f32)", 1e-4);
    expect_within(dbt_got, dbt, false, "dbeta (f32)");
    expect_within(rm_got, rm, false, "running mean (f32)", 1e-4);
    expect_within(rv_got, rv, false, "running var (f32)", 1e-4);
  }
}

// Note [bf16 blocks on oneDNN]: conv -> BatchNorm -> ReLU as one block computes what the
// three layers compute one by one on the same backend, bit for bit (a zero's sign aside):
// forward, the running statistics, and backward's input, weight and BatchNorm gradients; and
// a NaN that reaches the BatchNorm's statistics stays NaN through the fused ReLU.
TEST_F(OneDnnBf16OpTest, ConvBatchNormReluBlockIsTheLayersOneByOne) {
  for (const int layout : {0, be_->activation_block()}) {
    SCOPED_TRACE(layout);
    const int n = 3, ch = 16, hw = 8;
    FusedBlockConfig f;
    f.conv = Conv2dConfig{.in_channels = ch,
                          .out_channels = ch,
                          .in_h = hw,
                          .in_w = hw,
                          .padding = 1,
                          .in_block = layout,
                          .out_block = layout};
    f.batch_norm = f.relu = true;
    f.bn = BatchNormConfig{.channels = ch, .h = hw, .w = hw, .block = layout};
    auto block = be_->fused_block(f);
    ASSERT_NE(block, nullptr);
    EXPECT_EQ(block->describe_batch_norm(), "+ relu");
    auto conv = be_->conv2d(f.conv);
    auto bn = be_->batchnorm2d(f.bn);

    const size_t count = size_t(n) * hw * hw * ch, nw = size_t(ch) * ch * 9, nc = size_t(ch);
    const Vec w = test::random_vector(nw, 21, -0.3f, 0.3f);
    const Vec gamma = test::random_vector(size_t(ch), 22, 0.5f, 1.5f);
    const Vec beta = test::random_vector(size_t(ch), 23);
    for (const bool with_nan : {false, true}) {
      SCOPED_TRACE(with_nan ? "a NaN in x" : "finite");
      Bits x = to_layout(to_bf16(bf16_values(count, 24)), n, hw, hw, ch, layout);
      if (with_nan) x[count / 2] = 0x7fc0;
      const Bits dy = to_layout(to_bf16(bf16_values(count, 25)), n, hw, hw, ch, layout);
      // The layers one by one.
      Bits c(count), b(count), y1(count), g(count), dc(count), dx1(count);
      Vec rm1(nc, 0.f), rv1(nc, 1.f), dw1(nw), dg1(nc), db1(nc);
      conv->forward(n, in(x), w.data(), nullptr, out(c));
      bn->forward_train(n, in(c), gamma.data(), beta.data(), out(b), rm1.data(), rv1.data());
      be_->relu_forward(int64_t(count), in(b), out(y1));
      be_->relu_backward(int64_t(count), in(y1), in(dy), out(g));
      bn->backward(n, in(c), gamma.data(), in(g), out(dc), dg1.data(), db1.data(), false);
      conv->backward(n, in(x), w.data(), in(dc), out(dx1), dw1.data(), nullptr, false);
      // The block.
      Vec saved(size_t(n * block->saved_per_sample())),
          scratch(size_t(n * block->scratch_per_sample()));
      Bits y2(count), dx2(count);
      Vec rm2(nc, 0.f), rv2(nc, 1.f), dw2(nw), dg2(nc), db2(nc);
      FusedBlockParams p;
      p.w = w.data();
      p.gamma = gamma.data();
      p.beta = beta.data();
      p.running_mean = rm2.data();
      p.running_var = rv2.data();
      p.dw = dw2.data();
      p.dgamma = dg2.data();
      p.dbeta = db2.data();
      block->forward(n, true, in(x), p, ConstAct(), saved.data(), out(y2));
      block->backward(n, in(x), p, saved.data(), in(y2), in(dy), scratch.data(), out(dx2), false);

      auto same = [](const Bits& a, const Bits& b2, const char* what) {
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < a.size(); ++i) {
          const bool nan_a = (a[i] & 0x7fff) > 0x7f80, nan_b = (b2[i] & 0x7fff) > 0x7f80;
          const bool ok = nan_a ? nan_b : ((a[i] | b2[i]) == 0x8000 || a[i] == b2[i]);
          if (!ok && bad++ == 0) first = i;
        }
        EXPECT_EQ(bad, 0u) << what << ": first at " << first << ": " << bf16_to_f32(b2[first])
                           << " against the layers' " << bf16_to_f32(a[first]);
      };
      same(y1, y2, "y");
      if (with_nan) continue;  // backward of a NaN batch is NaN on both; nothing to compare
      same(dx1, dx2, "dx");
      EXPECT_EQ(dw1, dw2) << "dw";
      EXPECT_EQ(dg1, dg2) << "dgamma";
      EXPECT_EQ(db1, db2) << "dbeta";
      EXPECT_EQ(rm1, rm2) << "running mean";
      EXPECT_EQ(rv1, rv2) << "running var";
    }
  }
}

struct PoolCase {
  Pool2dConfig cfg;
  const char* name;
};

TEST_F(OneDnnBf16OpTest, PoolingMatchesNaiveLoops) {
  const int block = be_->activation_block();
  const PoolCase cases[] = {
      {{.kind = PoolKind::kMax, .channels = 8, .in_h = 8, .in_w = 8}, "max 2x2"},
      {{.kind = PoolKind::kMax,
        .channels = 16,
        .in_h = 7,
        .in_w = 7,
        .kernel = 3,
        .stride = 2,
        .padding = 1,
        .block = block},
       "max 3x3 stride 2 padded, overlapping, blocked"},
      {{.kind = PoolKind::kAvg,
        .channels = 8,
        .in_h = 7,
        .in_w = 7,
        .kernel = 3,
        .stride = 2,
        .padding = 1},
       "avg 3x3 stride 2, padding counted"},
      {{.kind = PoolKind::kGlobalAvg, .channels = 16, .in_h = 4, .in_w = 4, .block = block},
       "global avg blocked"},
  };
  for (const PoolCase& pc : cases) {
    SCOPED_TRACE(pc.name);
    const Pool2dConfig& c = pc.cfg;
    const int n = 2, ch = c.channels, oh = c.out_h(), ow = c.out_w();
    const bool global = c.kind == PoolKind::kGlobalAvg;
    const int k = global ? c.in_h : c.kernel, stride = global ? 1 : c.stride;
    const int pad = global ? 0 : c.padding;
    const size_t nx = static_cast<size_t>(n) * c.in_h * c.in_w * ch,
                 ny = static_cast<size_t>(n) * oh * ow * ch;
    // Max pooling: values distinct within every window (k / 64 for k < 251 repeats only 251
    // elements apart), so that the maximum has one position.
    Vec x(nx);
    for (size_t i = 0; i < nx; ++i) x[i] = float(double((i * 37) % 251) / 64.0 - 2.0);
    const Vec dy = bf16_values(ny, 9);

    Expect y(ny), dx(nx);
    for (int i = 0; i < n; ++i)
      for (int yo = 0; yo < oh; ++yo)
        for (int xo = 0; xo < ow; ++xo)
          for (int q = 0; q < ch; ++q) {
            const size_t yi = ((static_cast<size_t>(i) * oh + yo) * ow + xo) * ch + q;
            size_t best = nx;
            for (int ky = 0; ky < k; ++ky)
              for (int kx = 0; kx < k; ++kx) {
                const int yy = yo * stride - pad + ky, xx = xo * stride - pad + kx;
                if (yy < 0 || yy >= c.in_h || xx < 0 || xx >= c.in_w) continue;
                const size_t xi = ((static_cast<size_t>(i) * c.in_h + yy) * c.in_w + xx) * ch + q;
                if (c.kind != PoolKind::kMax) {
                  const double area = double(k) * k;  // padding counted; global: the plane
                  y.add(yi, x[xi] / area);
                  dx.add(xi, dy[yi] / area);
                } else if (best == nx || x[xi] > x[best]) {
                  best = xi;
                }
              }
            if (c.kind == PoolKind::kMax) {
              y.add(yi, x[best]);
              dx.add(best, dy[yi]);
            }
          }

    auto op = be_->pool2d(c);
    const Bits xb = to_layout(to_bf16(x), n, c.in_h, c.in_w, ch, c.block);
    const Bits dyb = to_layout(to_bf16(dy), n, oh, ow, ch, c.block);
    Bits yb(ny), dxb(nx);
    op->forward(n, in(xb), out(yb));
    op->backward(n, in(dyb), out(dxb));
    expect_within(widen(from_layout(yb, n, oh, ow, ch, c.block)), y, true, "y");
    expect_within(widen(from_layout(dxb, n, c.in_h, c.in_w, ch, c.block)), dx, true, "dx");
  }
}

TEST_F(OneDnnBf16OpTest, LinearMatchesNaiveLoopsOnRoundedWeights) {
  for (const bool bias : {true, false}) {
    SCOPED_TRACE(bias);
    const int n = 5, fin = 40, fout = 10;
    const LinearConfig cfg{.in_features = fin, .out_features = fout, .bias = bias};
    const Vec x = bf16_values(static_cast<size_t>(n) * fin, 11),
              dy = bf16_values(static_cast<size_t>(n) * fout, 12);
    const Vec w = test::random_vector(static_cast<size_t>(fin) * fout, 13, -0.2f, 0.2f);
    const Vec b = test::random_vector(static_cast<size_t>(fout), 14), wr = rounded(w);
    Expect y(static_cast<size_t>(n) * fout), dx(static_cast<size_t>(n) * fin),
        dw(static_cast<size_t>(fin) * fout), db(static_cast<size_t>(fout));
    for (int i = 0; i < n; ++i)
      for (int o = 0; o < fout; ++o) {
        const size_t yi = static_cast<size_t>(i) * fout + static_cast<size_t>(o);
        if (bias) y.add(yi, b[static_cast<size_t>(o)]);
        db.add(static_cast<size_t>(o), dy[yi]);
        for (int f = 0; f < fin; ++f) {
          const size_t xi = static_cast<size_t>(i) * fin + static_cast<size_t>(f),
                       wi = static_cast<size_t>(o) * fin + static_cast<size_t>(f);
          y.add(yi, double(x[xi]) * wr[wi]);
          dx.add(xi, double(dy[yi]) * wr[wi]);
          dw.add(wi, double(dy[yi]) * x[xi]);
        }
      }
    auto op = be_->linear(cfg);
    const Bits xb = to_bf16(x), dyb = to_bf16(dy);
    Bits yb(y.value.size()), dxb(x.size());
    Vec dw_got(w.size()), db_got(b.size());
    op->forward(n, in(xb), w.data(), bias ? b.data() : nullptr, out(yb));
    op->backward(n, in(xb), w.data(), in(dyb), out(dxb), dw_got.data(),
                 bias ? db_got.data() : nullptr, false);
    expect_within(widen(yb), y, true, "y");
    expect_within(widen(dxb), dx, true, "dx");
    expect_within(dw_got, dw, false, "dw (f32)");
    if (bias) expect_within(db_got, db, false, "db (f32)");
    Bits yb2(yb.size());  // an f32 input: its bf16 rounding's result
    op->forward(n, x.data(), w.data(), bias ? b.data() : nullptr, out(yb2));
    EXPECT_EQ(yb2, yb) << "f32 input";
  }
}

// Under --cpu-bf16 auto a CPU with bf16 instructions runs oneDNN's bf16 kernels and any other
// the fallback: read from /proc/cpuinfo here, independently of oneDNN's own detection.
bool cpuinfo_has(const char* flag) {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("flags", 0) == 0)
      return (line + " ").find(std::string(" ") + flag + " ") != std::string::npos;
  }
  return false;
}
bool cpuinfo_has_bf16() { return cpuinfo_has("avx512_bf16") || cpuinfo_has("amx_bf16"); }

TEST(CpuBf16Choice, AutoUsesOneDnnWhereTheCpuHasBf16AndFallbackPicksTheF32Kernels) {
  auto autob = make_backend(BackendOptions{.threads = 1, .precision = Precision::kBF16});
  auto fallback = make_backend(
      BackendOptions{.threads = 1, .precision = Precision::kBF16, .cpu_bf16 = CpuBf16::kFallback});
  const Conv2dConfig c{.in_channels = 16, .out_channels = 16, .in_h = 8, .in_w = 8, .padding = 1};
  EXPECT_NE(fallback->conv2d(c)->algorithm().find("bf16 stored, f32 math"), std::string::npos);
  EXPECT_NE(fallback->caveat().find("computes in f32"), std::string::npos) << fallback->caveat();
  const std::string how = autob->conv2d(c)->algorithm();
  if (cpuinfo_has_bf16()) {
    EXPECT_NE(how.find("bf16 on oneDNN"), std::string::npos) << how;
    EXPECT_NE(autob->name().find("bf16 on oneDNN"), std::string::npos) << autob->name();
  } else {
    EXPECT_NE(how.find("bf16 stored, f32 math"), std::string::npos) << how;
    EXPECT_NE(autob->caveat().find("no bf16 instructions"), std::string::npos) << autob->caveat();
  }
}

// Note [Fewer multiplications or faster ones]: without AMX, a block whose f32 convolution is
// Winograd F(4x4, 5x5) or the single-channel loops stays f32 between bf16 edges; with AMX, or
// where the f32 convolution would be direct or a 3x3 Winograd, oneDNN's bf16 layers run.
TEST(CpuBf16Choice, BlocksWithFarFewerF32MultiplicationsStayF32WithoutAmx) {
  const Conv2dConfig lenet1{.in_channels = 1,
                            .out_channels = 32,
                            .in_h = 28,
                            .in_w = 28,
                            .kernel = 5,
                            .padding = 2,
                            .bias = true};
  const Conv2dConfig lenet2{.in_channels = 32,
                            .out_channels = 64,
                            .in_h = 14,
                            .in_w = 14,
                            .kernel = 5,
                            .padding = 2,
                            .bias = true};
  const Conv2dConfig resnet{
      .in_channels = 16, .out_channels = 16, .in_h = 32, .in_w = 32, .padding = 1};
  const Conv2dConfig small5{.in_channels = 8,
                            .out_channels = 8,
                            .in_h = 14,
                            .in_w = 14,
                            .kernel = 5,
                            .padding = 2};  // too few channels for Winograd
  using cpu::f32_block_is_faster;
  EXPECT_TRUE(f32_block_is_faster(false, ConvAlgorithm::kAuto, lenet1));
  EXPECT_TRUE(f32_block_is_faster(false, ConvAlgorithm::kAuto, lenet2));
  EXPECT_FALSE(f32_block_is_faster(false, ConvAlgorithm::kAuto, resnet));
  EXPECT_FALSE(f32_block_is_faster(false, ConvAlgorithm::kAuto, small5));
  EXPECT_FALSE(f32_block_is_faster(false, ConvAlgorithm::kDirect, lenet2)) << "--cpu-conv direct";
  for (const auto& c : {lenet1, lenet2, resnet})
    EXPECT_FALSE(f32_block_is_faster(true, ConvAlgorithm::kAuto, c)) << "AMX";

  // The backend asks the rule with what this CPU has: lenet's second block and resnet20's.
  auto autob = make_backend(BackendOptions{.threads = 1, .precision = Precision::kBF16});
  auto forced = make_backend(
      BackendOptions{.threads = 1, .precision = Precision::kBF16, .cpu_bf16 = CpuBf16::kOneDnn});
  auto block = [](const Conv2dConfig& c) {
    FusedBlockConfig f;
    f.conv = c;
    f.relu = true;
    return f;
  };
  auto lenet_block = autob->fused_block(block(lenet2));
  auto resnet_block = autob->fused_block(block(resnet));
  if (!cpuinfo_has_bf16()) {  // the fallback: every block, f32 inside
    EXPECT_NE(lenet_block, nullptr);
    EXPECT_NE(resnet_block, nullptr);
    return;
  }
  EXPECT_EQ(resnet_block, nullptr) << "oneDNN's bf16 layers";
  if (cpuinfo_has("amx_bf16")) {
    EXPECT_EQ(lenet_block, nullptr) << "AMX: oneDNN's bf16 layers";
  } else {
    ASSERT_NE(lenet_block, nullptr) << "AVX512-BF16: the f32 block";
    EXPECT_NE(lenet_block->describe_conv().find("bf16 stored, f32 math"), std::string::npos)
        << lenet_block->describe_conv();
  }
  EXPECT_EQ(forced->fused_block(block(lenet2)), nullptr) << "--cpu-bf16 onednn: oneDNN's layers";
}

// Notes [Blocked activations] and [Channels last for AMX]: blocks of the ISA's width, except
// under bf16 on AMX, whose convolutions oneDNN runs on NHWC only; this CPU's default follows.
TEST(CpuBf16Choice, ActivationsAreNhwcUnderBf16OnAmxOnly) {
  EXPECT_EQ(cpu::preferred_activation_block(false, false), 8);
  EXPECT_EQ(cpu::preferred_activation_block(true, false), 16);
  EXPECT_EQ(cpu::preferred_activation_block(true, true), 0);
  auto f32 = make_backend(BackendOptions{.threads = 1});
  auto bf16 = make_backend(BackendOptions{.threads = 1, .precision = Precision::kBF16});
  const int isa_block = cpuinfo_has("avx512f") ? 16 : 8;
  EXPECT_EQ(f32->activation_block(), isa_block);
  EXPECT_EQ(bf16->activation_block(), cpuinfo_has("amx_bf16") ? 0 : isa_block);
  auto chosen = make_backend(
      BackendOptions{.threads = 1, .precision = Precision::kBF16, .activation_block = 0});
  EXPECT_EQ(chosen->activation_block(), 0) << "--cpu-layout nhwc";
}

}  // namespace
}  // namespace ddpv
