// Note [Fused blocks]: every chain the model zoo builds, as the CPU backend's one op, against
// the same chain run as plain ops one by one: output, input gradient, every parameter
// gradient and the running statistics, in training and evaluation, in NHWC and in the ISA's
// blocks; the residual add, the input gradient added to what dx holds, and the fusion switch.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "op_check.hpp"

namespace ddpv::test {
namespace {

struct Chain {
  std::string name;
  int n, cin, cout, hw, kernel, stride, padding;
  bool bias, batch_norm, residual, relu;
  int pool_kernel = 0, pool_stride = 0, pool_padding = 0;  // 0: no pooling
  bool add_dx = false;
};

FusedBlockConfig config(const Chain& k, int block) {
  FusedBlockConfig f;
  Conv2dConfig& c = f.conv;
  c.in_channels = k.cin;
  c.out_channels = k.cout;
  c.in_h = c.in_w = k.hw;
  c.kernel = k.kernel;
  c.stride = k.stride;
  c.padding = k.padding;
  c.bias = k.bias;
  c.in_block = block_for(k.cin, block);
  c.out_block = block_for(k.cout, block);
  f.batch_norm = k.batch_norm;
  f.bn.channels = k.cout;
  f.bn.h = c.out_h();
  f.bn.w = c.out_w();
  f.bn.block = c.out_block;
  f.add_residual = k.residual;
  f.relu = k.relu;
  f.max_pool = k.pool_kernel > 0;
  f.pool.kind = PoolKind::kMax;
  f.pool.channels = k.cout;
  f.pool.in_h = c.out_h();
  f.pool.in_w = c.out_w();
  f.pool.kernel = k.pool_kernel;
  f.pool.stride = k.pool_stride;
  f.pool.padding = k.pool_padding;
  f.pool.block = c.out_block;
  f.add_input_grad = k.add_dx;
  return f;
}

// The tensors of one run of a chain.
struct ChainRun {
  std::vector<float> y, y_eval, dx, dw, db, dgamma, dbeta, mean, var;
};

// The chain as plain ops, one layer after the other, as nn runs them when the backend declines.
ChainRun plain(Backend& be, const FusedBlockConfig& f, int n, const std::vector<float>& x,
               const std::vector<float>& w, const std::vector<float>& b,
               const std::vector<float>& gamma, const std::vector<float>& beta,
               const std::vector<float>& residual, const std::vector<float>& dy,
               const std::vector<float>& dx_held) {
  const int64_t out = int64_t{n} * f.conv.out_h() * f.conv.out_w() * f.conv.out_channels;
  ChainRun r;
  r.mean.assign(size_t(f.conv.out_channels), 0.0f);
  r.var.assign(size_t(f.conv.out_channels), 1.0f);
  auto conv = be.conv2d(f.conv);
  std::unique_ptr<BatchNormOp> bn = f.batch_norm ? be.batchnorm2d(f.bn) : nullptr;
  std::unique_ptr<Pool2dOp> pool = f.max_pool ? be.pool2d(f.pool) : nullptr;
  std::vector<float> c(static_cast<size_t>(out)), bo(static_cast<size_t>(out));
  auto forward = [&](bool training, std::vector<float>& y) {
    conv->forward(n, x.data(), w.data(), f.conv.bias ? b.data() : nullptr, c.data());
    std::vector<float>* v = &c;
    if (bn) {
      if (training)
        bn->forward_train(n, c.data(), gamma.data(), beta.data(), bo.data(), r.mean.data(),
                          r.var.data());
      else
        bn->forward_infer(n, c.data(), gamma.data(), beta.data(), r.mean.data(), r.var.data(),
                          bo.data());
      v = &bo;
    }
    if (f.add_residual) {
      y.resize(size_t(out));
      be.add_relu(out, v->data(), residual.data(), y.data());
      return;
    }
    if (f.relu) be.relu_forward(out, v->data(), v->data());
    if (pool) {
      y.resize(size_t(int64_t{n} * f.pool.out_h() * f.pool.out_w() * f.pool.channels));
      pool->forward(n, v->data(), y.data());
    } else {
      y = *v;
    }
  };
  forward(false, r.y_eval);
  forward(true, r.y);
  std::vector<float> g = dy, tmp(static_cast<size_t>(out));
  if (pool) {
    pool->backward(n, g.data(), tmp.data());
    g = tmp;
  }
  if (f.relu && !f.add_residual) be.relu_backward(out, (bn ? bo : c).data(), g.data(), g.data());
  if (bn) {
    r.dgamma.resize(size_t(f.conv.out_channels));
    r.dbeta.resize(size_t(f.conv.out_channels));
    bn->backward(n, c.data(), gamma.data(), g.data(), tmp.data(), r.dgamma.data(), r.dbeta.data(),
                 false);
    g = tmp;
  }
  r.dx.resize(x.size());
  r.dw.resize(w.size());
  r.db.resize(b.size());
  conv->backward(n, x.data(), w.data(), g.data(), r.dx.data(), r.dw.data(),
                 f.conv.bias ? r.db.data() : nullptr, false);
  if (!dx_held.empty())
    for (size_t i = 0; i < r.dx.size(); ++i) r.dx[i] += dx_held[i];
  return r;
}

ChainRun fused(FusedBlockOp& op, const FusedBlockConfig& f, int n, const std::vector<float>& x,
               const std::vector<float>& w, const std::vector<float>& b,
               const std::vector<float>& gamma, const std::vector<float>& beta,
               const std::vector<float>& residual, const std::vector<float>& dy,
               const std::vector<float>& dx_held, size_t y_size) {
  ChainRun r;
  r.mean.assign(size_t(f.conv.out_channels), 0.0f);
  r.var.assign(size_t(f.conv.out_channels), 1.0f);
  r.dw.resize(w.size());
  r.db.resize(b.size());
  r.dgamma.resize(f.batch_norm ? size_t(f.conv.out_channels) : 0);
  r.dbeta.resize(r.dgamma.size());
  FusedBlockParams p;
  p.w = w.data();
  p.dw = r.dw.data();
  if (f.conv.bias) {
    p.b = b.data();
    p.db = r.db.data();
  }
  if (f.batch_norm) {
    p.gamma = gamma.data();
    p.beta = beta.data();
    p.dgamma = r.dgamma.data();
    p.dbeta = r.dbeta.data();
    p.running_mean = r.mean.data();
    p.running_var = r.var.data();
  }
  std::vector<float> saved(size_t(n * op.saved_per_sample()) + 1),
      scratch(size_t(n * op.scratch_per_sample()) + 1);
  r.y_eval.resize(y_size);
  r.y.resize(y_size);
  const float* res = f.add_residual ? residual.data() : nullptr;
  op.forward(n, false, x.data(), p, res, saved.data(), r.y_eval.data());
  op.forward(n, true, x.data(), p, res, saved.data(), r.y.data());
  r.dx = dx_held.empty() ? std::vector<float>(x.size(), 1e30f) : dx_held;
  op.backward(n, x.data(), p, saved.data(), r.y.data(), dy.data(), scratch.data(), r.dx.data(),
              false);
  return r;
}

TEST(FusedBlockOp, ComputesWhatThePlainOpsComputeOneByOne) {
  const Chain chains[] = {
      // resnet20's: conv3x3 + bn + relu, the same with the shortcut added, the first of an
      // identity block adding its input gradient (also at the shapes of stages 1 to 3), the stem
      // (3 channels, direct), a projection
      {"winograd + bn + relu", 3, 16, 16, 8, 3, 1, 1, false, true, false, true},
      {"winograd + bn + shortcut + relu", 3, 16, 16, 8, 3, 1, 1, false, true, true, true},
      {"winograd + bn + relu, dx added", 3, 16, 16, 8, 3, 1, 1, false, true, false, true, 0, 0, 0,
       true},
      {"winograd 32ch 16x16 + bn + relu, dx added", 2, 32, 32, 16, 3, 1, 1, false, true, false,
       true, 0, 0, 0, true},
      {"winograd 16ch 32x32 + bn + relu, dx added", 2, 16, 16, 32, 3, 1, 1, false, true, false,
       true, 0, 0, 0, true},
      {"winograd 32ch 16x16 + bn + shortcut + relu", 2, 32, 32, 16, 3, 1, 1, false, true, true,
       true},
      {"winograd 64ch 8x8 + bn + relu, dx added", 2, 64, 64, 8, 3, 1, 1, false, true, false, true,
       0, 0, 0, true},
      {"stem + bn + relu", 2, 3, 16, 8, 3, 1, 1, false, true, false, true},
      {"projection 1x1/2 + bn", 2, 16, 32, 8, 1, 2, 0, false, true, false, false},
      // lenet's: single channel and Winograd with ReLU and 2x2 pooling (pooled in the conv),
      // and a direct convolution whose ReLU the pooling folds
      {"single channel + relu + maxpool", 2, 1, 16, 12, 5, 1, 2, true, false, false, true, 2, 2},
      {"winograd 5x5 + relu + maxpool", 2, 16, 16, 8, 5, 1, 2, true, false, false, true, 2, 2},
      {"direct 3x3/2 + relu + maxpool", 2, 16, 16, 9, 3, 2, 1, true, false, false, true, 2, 2},
      {"winograd + relu", 2, 16, 16, 8, 3, 1, 1, true, false, false, true},
      // resnet18/50's stem: BatchNorm + ReLU, then a 3x3/2 pooling with padding
      {"stem + bn + relu + maxpool 3/2/1", 2, 3, 16, 12, 3, 2, 1, false, true, false, true, 3, 2,
       1},
  };
  uint64_t seed = 7000;
  for (int block : {0, -1}) {
    BackendOptions o;
    o.threads = 1;
    o.activation_block = block;
    auto be = make_backend(o);
    for (const Chain& k : chains) {
      const FusedBlockConfig f = config(k, be->activation_block());
      SCOPED_TRACE(k.name + ", block " + std::to_string(be->activation_block()));
      auto op = be->fused_block(f);
      ASSERT_NE(op, nullptr);
      const int64_t in = int64_t{k.n} * k.hw * k.hw * k.cin;
      const int64_t out = int64_t{k.n} * f.conv.out_h() * f.conv.out_w() * k.cout;
      const int64_t y_size =
          f.max_pool ? int64_t{k.n} * f.pool.out_h() * f.pool.out_w() * k.cout : out;
      const auto x = random_vector(size_t(in), ++seed),
                 w = random_vector(size_t(k.cout) * k.cin * k.kernel * k.kernel, ++seed, -0.3f,
                                   0.3f),
                 b = random_vector(size_t(k.cout), ++seed),
                 gamma = random_vector(size_t(k.cout), ++seed, 0.5f, 1.5f),
                 beta = random_vector(size_t(k.cout), ++seed, -0.5f, 0.5f),
                 residual = random_vector(size_t(out), ++seed),
                 dy = random_vector(size_t(y_size), ++seed);
      const std::vector<float> held =
          k.add_dx ? random_vector(size_t(in), ++seed) : std::vector<float>{};
      if (k.add_dx) {
        ASSERT_TRUE(op->adds_input_grad()) << "a Winograd convolution adds its input gradient";
      }
      const ChainRun want = plain(*be, f, k.n, x, w, b, gamma, beta, residual, dy, held);
      const ChainRun got =
          fused(*op, f, k.n, x, w, b, gamma, beta, residual, dy, held, size_t(y_size));
      // Where the BatchNorm takes its statistics from the convolution they are summed in
      // double, not by oneDNN in float, and a weight gradient entry, a sum with cancellation,
      // moves by more than its own size's share: errors are judged against the largest entry.
      auto close = [](const std::vector<float>& a, const std::vector<float>& e) {
        double largest = 0;
        for (float v : e) largest = std::max(largest, double(std::abs(v)));
        return all_close(a, to_double(e), 1e-4, 1e-4 * largest + 1e-7);
      };
      EXPECT_TRUE(close(got.y, want.y)) << "y";
      EXPECT_TRUE(close(got.y_eval, want.y_eval)) << "y in evaluation";
      EXPECT_TRUE(close(got.dx, want.dx)) << "dx";
      EXPECT_TRUE(close(got.dw, want.dw)) << "dw";
      if (k.bias) {
        EXPECT_TRUE(close(got.db, want.db)) << "db";
      }
      if (k.batch_norm) {
        EXPECT_TRUE(close(got.dgamma, want.dgamma)) << "dgamma";
        EXPECT_TRUE(close(got.dbeta, want.dbeta)) << "dbeta";
        EXPECT_TRUE(close(got.mean, want.mean)) << "running mean";
        EXPECT_TRUE(close(got.var, want.var)) << "running var";
      }
    }
  }
}

// A direct convolution cannot add its input gradient, so its block says no; with fusion off
// the backend declines every block (nn then runs the plain ops).
TEST(FusedBlockOp, SaysWhatItTakesInAndIsDeclinedWithFusionOff) {
  BackendOptions o;
  o.threads = 1;
  auto be = make_backend(o);
  Chain k{"direct 3x3/2 + bn + relu", 2, 16, 16, 9, 3, 2, 1, false, true, false, true};
  k.add_dx = true;
  auto op = be->fused_block(config(k, be->activation_block()));
  ASSERT_NE(op, nullptr);
  EXPECT_FALSE(op->adds_input_grad());
  EXPECT_EQ(op->describe_conv(), "direct");
  EXPECT_EQ(op->describe_batch_norm(), "+ relu");
  o.fuse_layers = false;
  EXPECT_EQ(make_backend(o)->fused_block(config(k, 0)), nullptr);
}

}  // namespace
}  // namespace ddpv::test
