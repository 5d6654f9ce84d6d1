// The CPU backend under --precision bf16 --cpu-bf16 fallback (Note [bf16 fallback on the CPU];
// op_bf16_onednn_test checks oneDNN's bf16 primitives): its activations are bf16 and its
// arithmetic f32, so every op handed bf16 activations must give exactly what the
// f32 op of the same configuration gives on the same values, with each activation output
// rounded once to bf16 (to nearest even) and each f32 output (weight gradients, running
// statistics, the loss) bit for bit. The f32 ops are checked against naive loops in their own
// tests (op_conv_test, op_batchnorm_test, ...), so this pins the bf16 path to those loops with
// exactly the error bf16 storage adds: one rounding of each stored value. The elementwise ops
// and relayout are checked against naive loops here, on bf16 and on mixed f32/bf16 views.
#include <algorithm>
#include <cstring>
#include <vector>

#include "ddpv/core/dtype.hpp"
#include "support/test_support.hpp"

namespace ddpv {
namespace {

// Values that bf16 holds exactly (test::bf16_values), so both paths start from the same numbers.
using test::bf16_values;
using test::to_bf16;

// Every element of `got` (bf16) is `want` (f32) rounded to bf16; counts the misses.
void expect_rounded(const std::vector<uint16_t>& got, const std::vector<float>& want,
                    const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != f32_to_bf16(want[i]) && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size()
                     << " elements are not the f32 result rounded, first at " << first << ": "
                     << bf16_to_f32(got[first]) << " against " << want[first];
}
void expect_same(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << what;
}

class Bf16OpTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> f32_ = make_backend(BackendOptions{.threads = 1});
  std::unique_ptr<Backend> bf16_ = make_backend(
      BackendOptions{.threads = 1, .precision = Precision::kBF16, .cpu_bf16 = CpuBf16::kFallback});
};

TEST_F(Bf16OpTest, TheBackendSaysItsActivationsAreBf16) {
  EXPECT_EQ(f32_->activation_dtype(), DType::kF32);
  EXPECT_EQ(bf16_->activation_dtype(), DType::kBF16);
  EXPECT_NE(bf16_->name().find("bf16 activations, f32 math"), std::string::npos) << bf16_->name();
  // The fallback runs fused blocks too (the f32 block inside one adapter); fusion off, none.
  FusedBlockConfig fb;
  fb.conv = Conv2dConfig{.in_channels = 8, .out_channels = 8, .in_h = 6, .in_w = 6, .padding = 1};
  fb.relu = true;
  EXPECT_NE(f32_->fused_block(fb), nullptr);
  const auto op = bf16_->fused_block(fb);
  ASSERT_NE(op, nullptr);
  EXPECT_NE(op->describe_conv().find("bf16 stored, f32 math"), std::string::npos)
      << op->describe_conv();
  EXPECT_EQ(make_backend(BackendOptions{.threads = 1,
                                        .precision = Precision::kBF16,
                                        .fuse_layers = false,
                                        .cpu_bf16 = CpuBf16::kFallback})
                ->fused_block(fb),
            nullptr);
}

// A fused block under the fallback computes what the f32 block computes on the same values:
// its activation outputs (y, dx) that result rounded once, its f32 outputs (the parameter
// gradients, the running statistics) bit for bit. The f32 block is held to the plain ops one
// by one in op_fused_block_test.
TEST_F(Bf16OpTest, FusedBlockIsTheF32BlockRoundedOnce) {
  const int block = bf16_->activation_block();
  struct Case {
    FusedBlockConfig cfg;
    const char* name;
  };
  auto conv = [](int cin, int cout, int hw, int k, int layout) {
    return Conv2dConfig{.in_channels = cin,
                        .out_channels = cout,
                        .in_h = hw,
                        .in_w = hw,
                        .kernel = k,
                        .padding = k / 2,
                        .in_block = layout,
                        .out_block = layout};
  };
  std::vector<Case> cases;
  for (int layout : {0, block}) {
    Case bn_relu{FusedBlockConfig{}, "conv + bn + relu"};
    bn_relu.cfg.conv = conv(layout == 0 ? 8 : layout, 16, 8, 3, layout);  // blocks of 8 or 16
    bn_relu.cfg.batch_norm = true;
    bn_relu.cfg.relu = true;
    bn_relu.cfg.bn = BatchNormConfig{.channels = 16, .h = 8, .w = 8, .block = layout};
    cases.push_back(bn_relu);
    Case residual = bn_relu;
    residual.cfg.add_residual = true;
    residual.name = "conv + bn + shortcut + relu";
    cases.push_back(residual);
    Case pooled = bn_relu;
    pooled.cfg.max_pool = true;
    pooled.cfg.pool = Pool2dConfig{.kind = PoolKind::kMax,
                                   .channels = 16,
                                   .in_h = 8,
                                   .in_w = 8,
                                   .kernel = 2,
                                   .stride = 2,
                                   .block = layout};
    pooled.name = "conv + bn + relu + maxpool";
    cases.push_back(pooled);
  }
  Case lenet{FusedBlockConfig{}, "lenet conv1 + pool"};
  lenet.cfg.conv = conv(1, 6, 12, 5, 0);
  lenet.cfg.relu = lenet.cfg.max_pool = true;
  lenet.cfg.conv.bias = true;
  lenet.cfg.pool = Pool2dConfig{
      .kind = PoolKind::kMax, .channels = 6, .in_h = 12, .in_w = 12, .kernel = 2, .stride = 2};
  cases.push_back(lenet);
  const int n = 3;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.name) + ", block " + std::to_string(c.cfg.conv.out_block));
    const FusedBlockConfig& f = c.cfg;
    const int64_t nx = int64_t{n} * f.conv.in_h * f.conv.in_w * f.conv.in_channels;
    const int64_t ny = f.max_pool
                           ? int64_t{n} * f.pool.out_h() * f.pool.out_w() * f.pool.channels
                           : int64_t{n} * f.conv.out_h() * f.conv.out_w() * f.conv.out_channels;
    const size_t nw =
        size_t(f.conv.out_channels) * f.conv.in_channels * f.conv.kernel * f.conv.kernel;
    const size_t ch = size_t(f.conv.out_channels);
    const std::vector<float> x = bf16_values(size_t(nx), 1), res = bf16_values(size_t(ny), 2),
                             dy = bf16_values(size_t(ny), 3);
    const std::vector<float> w = test::random_vector(nw, 4, -0.3f, 0.3f),
                             b = test::random_vector(ch, 5),
                             gamma = test::random_vector(ch, 6, 0.5f, 1.5f),
                             beta = test::random_vector(ch, 7);
    struct Out {
      std::vector<float> y_eval, y, dx, dw, db, dgamma, dbeta, mean, var;
    };
    auto run = [&](Backend& be) {
      Out o;
      o.dw.resize(nw);
      o.db.resize(ch);
      o.dgamma.resize(ch);
      o.dbeta.resize(ch);
      o.mean.assign(ch, 0.0f);
      o.var.assign(ch, 1.0f);
      FusedBlockParams p{.w = w.data(),
                         .b = f.conv.bias ? b.data() : nullptr,
                         .gamma = f.batch_norm ? gamma.data() : nullptr,
                         .beta = f.batch_norm ? beta.data() : nullptr,
                         .running_mean = f.batch_norm ? o.mean.data() : nullptr,
                         .running_var = f.batch_norm ? o.var.data() : nullptr,
                         .dw = o.dw.data(),
                         .db = f.conv.bias ? o.db.data() : nullptr,
                         .dgamma = f.batch_norm ? o.dgamma.data() : nullptr,
                         .dbeta = f.batch_norm ? o.dbeta.data() : nullptr};
      auto op = be.fused_block(f);
      EXPECT_NE(op, nullptr);
      if (op == nullptr) return o;
      std::vector<float> saved(size_t(n * op->saved_per_sample()) + 1),
          scratch(size_t(n * op->scratch_per_sample()) + 1);
      // Each backend's activations in its own dtype (bf16 values are exact in bf16).
      const DType t = be.activation_dtype();
      const test::DeviceBuffer xd(&be, x, t), rd(&be, res, t), dyd(&be, dy, t),
          yd(&be, static_cast<size_t>(ny), t), dxd(&be, static_cast<size_t>(nx), t);
      const ConstAct r = f.add_residual ? ConstAct(rd.act()) : ConstAct();
      op->forward(n, false, xd.act(), p, r, saved.data(), yd.act());
      o.y_eval = yd.to_host();
      op->forward(n, true, xd.act(), p, r, saved.data(), yd.act());
      o.y = yd.to_host();
      op->backward(n, xd.act(), p, saved.data(), yd.act(), dyd.act(), scratch.data(), dxd.act(),
                   false);
      o.dx = dxd.to_host();
      return o;
    };
    const Out want = run(*f32_), got = run(*bf16_);
    expect_rounded(to_bf16(got.y_eval), want.y_eval, "y (evaluation)");
    expect_rounded(to_bf16(got.y), want.y, "y (training)");
    expect_rounded(to_bf16(got.dx), want.dx, "dx");
    expect_same(got.dw, want.dw, "dw (f32)");
    expect_same(got.db, want.db, "db (f32)");
    expect_same(got.dgamma, want.dgamma, "dgamma (f32)");
    expect_same(got.dbeta, want.dbeta, "dbeta (f32)");
    expect_same(got.mean, want.mean, "running mean (f32)");
    expect_same(got.var, want.var, "running var (f32)");
  }
}

struct ConvCase {
  Conv2dConfig cfg;
  const char* name;
};

TEST_F(Bf16OpTest, ConvolutionIsTheF32OpRoundedOnce) {
  const int block = bf16_->activation_block();
  const ConvCase cases[] = {
      {{.in_channels = 8, .out_channels = 16, .in_h = 9, .in_w = 9, .kernel = 3, .padding = 1},
       "3x3 nhwc"},
      {{.in_channels = block,  // the ISA's block: 8 or 16
        .out_channels = 16,
        .in_h = 9,
        .in_w = 9,
        .kernel = 3,
        .padding = 1,
        .in_block = block,
        .out_block = block},
       "3x3 blocked"},
      {{.in_channels = 16, .out_channels = 8, .in_h = 8, .in_w = 8, .kernel = 1, .stride = 2},
       "1x1 stride 2"},
      {{.in_channels = 1, .out_channels = 6, .in_h = 12, .in_w = 12, .kernel = 5, .bias = true},
       "5x5 one channel, bias"},
  };
  for (const ConvCase& c : cases) {
    SCOPED_TRACE(c.name);
    const int n = 3;
    const int64_t nx = int64_t{n} * c.cfg.in_h * c.cfg.in_w * c.cfg.in_channels;
    const int64_t ny = int64_t{n} * c.cfg.out_h() * c.cfg.out_w() * c.cfg.out_channels;
    const int64_t nw =
        int64_t{c.cfg.out_channels} * c.cfg.in_channels * c.cfg.kernel * c.cfg.kernel;
    const std::vector<float> x = bf16_values(static_cast<size_t>(nx), 1),
                             dy = bf16_values(static_cast<size_t>(ny), 2);
    const std::vector<float> w = test::random_vector(static_cast<size_t>(nw), 3, -0.3f, 0.3f);
    const std::vector<float> b = test::random_vector(static_cast<size_t>(c.cfg.out_channels), 4);
    auto ref = f32_->conv2d(c.cfg);
    auto op = bf16_->conv2d(c.cfg);
    EXPECT_NE(op->algorithm().find("bf16 stored"), std::string::npos) << op->algorithm();

    std::vector<float> y(static_cast<size_t>(ny)), dx(static_cast<size_t>(nx)),
        dw(static_cast<size_t>(nw)), db(b.size());
    ref->forward(n, x.data(), w.data(), c.cfg.bias ? b.data() : nullptr, y.data());
    ref->backward(n, x.data(), w.data(), dy.data(), dx.data(), dw.data(),
                  c.cfg.bias ? db.data() : nullptr, false);

    const std::vector<uint16_t> xb = to_bf16(x), dyb = to_bf16(dy);
    std::vector<uint16_t> yb(static_cast<size_t>(ny)), dxb(static_cast<size_t>(nx));
    std::vector<float> dw2(static_cast<size_t>(nw)), db2(b.size());
    op->forward(n, ConstAct(xb.data(), DType::kBF16), w.data(), c.cfg.bias ? b.data() : nullptr,
                MutAct(yb.data(), DType::kBF16));
    op->backward(n, ConstAct(xb.data(), DType::kBF16), w.data(), ConstAct(dyb.data(), DType::kBF16),
                 MutAct(dxb.data(), DType::kBF16), dw2.data(), c.cfg.bias ? db2.data() : nullptr,
                 false);
    expect_rounded(yb, y, "y");
    expect_rounded(dxb, dx, "dx");
    expect_same(dw2, dw, "dw (f32)");
    if (c.cfg.bias) expect_same(db2, db, "db (f32)");

    // The model's f32 input into a bf16 output: the same y.
    std::vector<uint16_t> yb2(static_cast<size_t>(ny));
    op->forward(n, x.data(), w.data(), c.cfg.bias ? b.data() : nullptr,
                MutAct(yb2.data(), DType::kBF16));
    EXPECT_EQ(yb2, yb) << "f32 input";
  }
}

TEST_F(Bf16OpTest, BatchNormIsTheF32OpRoundedOnce) {
  const int block = bf16_->activation_block();
  for (int layout : {0, block}) {
    SCOPED_TRACE(layout);
    const BatchNormConfig cfg{.channels = 16, .h = 5, .w = 5, .block = layout};
    const int n = 4;
    const size_t count = static_cast<size_t>(n) * 5 * 5 * 16;
    const std::vector<float> x = bf16_values(count, 5, -2.f, 3.f), dy = bf16_values(count, 6);
    const std::vector<float> gamma = test::random_vector(16, 7, 0.5f, 1.5f);
    const std::vector<float> beta = test::random_vector(16, 8);
    auto ref = f32_->batchnorm2d(cfg);
    auto op = bf16_->batchnorm2d(cfg);
    std::vector<float> y(count), dx(count), dg(16), dbt(16), rm(16, 0.f), rv(16, 1.f);
    std::vector<float> yi(count);
    ref->forward_train(n, x.data(), gamma.data(), beta.data(), y.data(), rm.data(), rv.data());
    ref->backward(n, x.data(), gamma.data(), dy.data(), dx.data(), dg.data(), dbt.data(), false);
    ref->forward_infer(n, x.data(), gamma.data(), beta.data(), rm.data(), rv.data(), yi.data());

    const std::vector<uint16_t> xb = to_bf16(x), dyb = to_bf16(dy);
    std::vector<uint16_t> yb(count), dxb(count), yib(count);
    std::vector<float> dg2(16), dbt2(16), rm2(16, 0.f), rv2(16, 1.f);
    const ConstAct xa(xb.data(), DType::kBF16);
    op->forward_train(n, xa, gamma.data(), beta.data(), MutAct(yb.data(), DType::kBF16), rm2.data(),
                      rv2.data());
    op->backward(n, xa, gamma.data(), ConstAct(dyb.data(), DType::kBF16),
                 MutAct(dxb.data(), DType::kBF16), dg2.data(), dbt2.data(), false);
    op->forward_infer(n, xa, gamma.data(), beta.data(), rm2.data(), rv2.data(),
                      MutAct(yib.data(), DType::kBF16));
    expect_rounded(yb, y, "y (training)");
    expect_rounded(dxb, dx, "dx");
    expect_rounded(yib, yi, "y (inference)");
    expect_same(dg2, dg, "dgamma (f32)");
    expect_same(dbt2, dbt, "dbeta (f32)");
    expect_same(rm2, rm, "running mean (f32)");
    expect_same(rv2, rv, "running var (f32)");
  }
}

TEST_F(Bf16OpTest, PoolingIsTheF32OpRoundedOnce) {
  for (PoolKind kind : {PoolKind::kMax, PoolKind::kAvg, PoolKind::kGlobalAvg}) {
    SCOPED_TRACE(static_cast<int>(kind));
    const Pool2dConfig cfg{.kind = kind, .channels = 8, .in_h = 8, .in_w = 8};
    const int n = 2;
    const size_t nx = static_cast<size_t>(n) * 8 * 8 * 8;
    const size_t ny = static_cast<size_t>(n) * static_cast<size_t>(cfg.out_h()) *
                      static_cast<size_t>(cfg.out_w()) * 8;
    const std::vector<float> x = bf16_values(nx, 9), dy = bf16_values(ny, 10);
    auto ref = f32_->pool2d(cfg);
    auto op = bf16_->pool2d(cfg);
    std::vector<float> y(ny), dx(nx);
    ref->forward(n, x.data(), y.data());
    ref->backward(n, dy.data(), dx.data());
    const std::vector<uint16_t> xb = to_bf16(x), dyb = to_bf16(dy);
    std::vector<uint16_t> yb(ny), dxb(nx);
    op->forward(n, ConstAct(xb.data(), DType::kBF16), MutAct(yb.data(), DType::kBF16));
    op->backward(n, ConstAct(dyb.data(), DType::kBF16), MutAct(dxb.data(), DType::kBF16));
    expect_rounded(yb, y, "y");
    expect_rounded(dxb, dx, "dx");
  }
}

TEST_F(Bf16OpTest, LinearAndLossAreTheF32OpsRoundedOnce) {
  const LinearConfig cfg{.in_features = 40, .out_features = 10};
  const int n = 5;
  const std::vector<float> x = bf16_values(static_cast<size_t>(n) * 40, 11),
                           dy = bf16_values(static_cast<size_t>(n) * 10, 12);
  const std::vector<float> w = test::random_vector(400, 13, -0.2f, 0.2f);
  const std::vector<float> b = test::random_vector(10, 14);
  auto ref = f32_->linear(cfg);
  auto op = bf16_->linear(cfg);
  std::vector<float> y(static_cast<size_t>(n) * 10), dx(x.size()), dw(400), db(10), dw2(400),
      db2(10);
  ref->forward(n, x.data(), w.data(), b.data(), y.data());
  ref->backward(n, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), false);
  const std::vector<uint16_t> xb = to_bf16(x), dyb = to_bf16(dy);
  std::vector<uint16_t> yb(y.size()), dxb(x.size());
  op->forward(n, ConstAct(xb.data(), DType::kBF16), w.data(), b.data(),
              MutAct(yb.data(), DType::kBF16));
  op->backward(n, ConstAct(xb.data(), DType::kBF16), w.data(), ConstAct(dyb.data(), DType::kBF16),
               MutAct(dxb.data(), DType::kBF16), dw2.data(), db2.data(), false);
  expect_rounded(yb, y, "y");
  expect_rounded(dxb, dx, "dx");
  expect_same(dw2, dw, "dw (f32)");
  expect_same(db2, db, "db (f32)");

  // The loss reads bf16 logits as their f32 values; the loss and the counts are f32 results.
  const std::vector<int32_t> labels{3, 0, 9, 9, 1};
  const std::vector<float> logits = bf16_values(static_cast<size_t>(n) * 10, 15, -3.f, 3.f);
  auto lref = f32_->softmax_cross_entropy(10);
  auto lop = bf16_->softmax_cross_entropy(10);
  const LossResult r = lref->forward(n, logits.data(), labels.data());
  std::vector<float> dl(logits.size());
  lref->backward(n, labels.data(), dl.data(), 0.2f);
  const std::vector<uint16_t> lb = to_bf16(logits);
  std::vector<uint16_t> dlb(logits.size());
  const LossResult r2 = lop->forward(n, ConstAct(lb.data(), DType::kBF16), labels.data());
  lop->backward(n, labels.data(), MutAct(dlb.data(), DType::kBF16), 0.2f);
  EXPECT_EQ(r2.loss_sum, r.loss_sum);
  EXPECT_EQ(r2.correct, r.correct);
  expect_rounded(dlb, dl, "dlogits");
}

// Elementwise ops against naive loops on the widened values, one rounding of the f32 result:
// bf16 in and out, and the model's f32 input into a bf16 output.
TEST_F(Bf16OpTest, ElementwiseOpsRoundTheirF32ResultOnce) {
  const int64_t count = 70000;  // above the threshold where the loops take a team
  const std::vector<float> a = bf16_values(static_cast<size_t>(count), 16),
                           b = bf16_values(static_cast<size_t>(count), 17);
  const std::vector<uint16_t> ab = to_bf16(a), bb = to_bf16(b);
  const ConstAct av(ab.data(), DType::kBF16), bv(bb.data(), DType::kBF16);
  std::vector<float> want(static_cast<size_t>(count));
  std::vector<uint16_t> got(static_cast<size_t>(count));
  const MutAct out(got.data(), DType::kBF16);
  auto relu = [](float v) { return v <= 0.0f ? 0.0f : v; };

  bf16_->relu_forward(count, av, out);
  for (size_t i = 0; i < want.size(); ++i) want[i] = relu(a[i]);
  expect_rounded(got, want, "relu");
  bf16_->relu_forward(count, a.data(), out);  // f32 in
  expect_rounded(got, want, "relu, f32 input");

  bf16_->relu_backward(count, av, bv, out);  // mask from y = a
  for (size_t i = 0; i < want.size(); ++i) want[i] = a[i] > 0.0f ? b[i] : 0.0f;
  expect_rounded(got, want, "relu backward");

  bf16_->add(count, av, b.data(), out);  // one bf16 and one f32 operand
  for (size_t i = 0; i < want.size(); ++i) want[i] = a[i] + b[i];
  expect_rounded(got, want, "add");

  bf16_->add_relu(count, av, bv, out);
  for (size_t i = 0; i < want.size(); ++i) want[i] = relu(a[i] + b[i]);
  expect_rounded(got, want, "add_relu (one rounding of the rectified sum)");

  std::vector<uint16_t> inplace = ab;  // in place, as the ops allow
  bf16_->relu_forward(count, ConstAct(inplace.data(), DType::kBF16),
                      MutAct(inplace.data(), DType::kBF16));
  for (size_t i = 0; i < want.size(); ++i) want[i] = relu(a[i]);
  expect_rounded(inplace, want, "relu in place");
}

// Note [bf16 elementwise loops]: where every view is bf16 the ops run vectorised loops on the
// bits. Every one of the 65536 bf16 values (NaNs of both signs, infinities, -0, subnormals)
// against the rule applied to its widened value and rounded by f32_to_bf16, bit for bit, on a
// team of two threads, from an odd offset and over counts that no vector width divides: one
// whose halves are a whole number of vectors but for its last element, which a split by the
// halves' floor would drop.
class Bf16LoopsTest : public ::testing::TestWithParam<size_t> {};

TEST_P(Bf16LoopsTest, GiveTheRoundedRuleForEveryValue) {
  auto be = make_backend(
      BackendOptions{.threads = 2, .precision = Precision::kBF16, .cpu_bf16 = CpuBf16::kFallback});
  const size_t count = GetParam(), off = 3;
  constexpr uint16_t kUnwritten = 0x3f9d;  // 1.2265625: what no op gives for the last element
  std::vector<uint16_t> a(count + off), b(count + off), got(count + off, kUnwritten);
  for (size_t i = 0; i < count; ++i) {
    a[off + i] = static_cast<uint16_t>(i);
    b[off + i] = static_cast<uint16_t>(i * 40503u + 11u);  // every value again, shuffled
  }
  const ConstAct av(a.data() + off, DType::kBF16), bv(b.data() + off, DType::kBF16);
  const MutAct out(got.data() + off, DType::kBF16);
  auto f = [](uint16_t h) { return bf16_to_f32(h); };
  auto relu = [](float v) { return v <= 0.0f ? 0.0f : v; };
  auto check = [&](const char* what, auto rule) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < count; ++i)
      if (got[off + i] != f32_to_bf16(rule(a[off + i], b[off + i])) && bad++ == 0) first = i;
    EXPECT_EQ(bad, 0u) << what << ": first at a=0x" << std::hex << a[off + first] << " b=0x"
                       << b[off + first] << ": 0x" << got[off + first];
    EXPECT_EQ(got[off - 1], kUnwritten) << what << ": wrote before its view";
  };
  std::fill(got.begin(), got.end(), kUnwritten);
  be->relu_forward(int64_t(count), av, out);
  check("relu", [&](uint16_t x, uint16_t) { return relu(f(x)); });
  std::fill(got.begin(), got.end(), kUnwritten);
  be->relu_backward(int64_t(count), av, bv, out);
  check("relu backward", [&](uint16_t y, uint16_t g) { return f(y) > 0.0f ? f(g) : 0.0f; });
  std::fill(got.begin(), got.end(), kUnwritten);
  be->add(int64_t(count), av, bv, out);
  check("add", [&](uint16_t x, uint16_t y) { return f(x) + f(y); });
  std::fill(got.begin(), got.end(), kUnwritten);
  be->add_relu(int64_t(count), av, bv, out);
  check("add_relu", [&](uint16_t x, uint16_t y) { return relu(f(x) + f(y)); });
}
INSTANTIATE_TEST_SUITE_P(Counts, Bf16LoopsTest, ::testing::Values(65536 + 37, 65536 + 1));

TEST_F(Bf16OpTest, RelayoutMovesBf16AndConvertsF32) {
  const int n = 2, h = 3, w = 5, c = 16, block = bf16_->activation_block();
  const size_t count = static_cast<size_t>(n) * h * w * c;
  const std::vector<float> x = bf16_values(count, 18);
  // Naive: NHWC (i, s, ch) -> NCHW (i, ch, s), and -> blocks (i, ch / b, s, ch % b).
  std::vector<float> nchw(count), blocked(count);
  for (int i = 0; i < n; ++i)
    for (int s = 0; s < h * w; ++s)
      for (int ch = 0; ch < c; ++ch) {
        const float v = x[(static_cast<size_t>(i) * h * w + s) * c + ch];
        nchw[(static_cast<size_t>(i) * c + ch) * h * w + s] = v;
        blocked[((static_cast<size_t>(i) * (c / block) + ch / block) * h * w + s) * block +
                ch % block] = v;
      }
  const std::vector<uint16_t> xb = to_bf16(x);
  std::vector<uint16_t> got(count);
  bf16_->relayout(n, h, w, c, 0, Backend::kNchw, ConstAct(xb.data(), DType::kBF16),
                  MutAct(got.data(), DType::kBF16));
  expect_rounded(got, nchw, "nhwc -> nchw, bf16");
  bf16_->relayout(n, h, w, c, 0, block, x.data(), MutAct(got.data(), DType::kBF16));
  expect_rounded(got, blocked, "nhwc f32 -> blocked bf16");
  std::vector<float> back(count);
  bf16_->relayout(n, h, w, c, block, 0, ConstAct(got.data(), DType::kBF16), back.data());
  expect_same(back, x, "blocked bf16 -> nhwc f32");
}

TEST_F(Bf16OpTest, AnOpHandedTheWrongDtypeFailsLoudly) {
  // The f32 backend's ops read f32 only: a bf16 view is an internal error, not reinterpreted.
  auto op = f32_->pool2d(Pool2dConfig{.channels = 8, .in_h = 4, .in_w = 4});
  std::vector<uint16_t> x(2 * 4 * 4 * 8), y(2 * 2 * 2 * 8);
  EXPECT_THROW(op->forward(2, ConstAct(x.data(), DType::kBF16), MutAct(y.data(), DType::kBF16)),
               Error);
}

}  // namespace
}  // namespace ddpv
