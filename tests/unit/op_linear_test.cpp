// LinearOp against a naive double-precision loop and finite differences, on every device.
#include <string>

#include "op_check.hpp"

namespace ddpv::test {
namespace {

LinearConfig config(int in, int out, bool bias) {
  LinearConfig c;
  c.in_features = in;
  c.out_features = out;
  c.bias = bias;
  return c;
}

// y (N, out) = x (N, in) w^T + b, w: (out, in) as PyTorch keeps it.
std::vector<double> linear_ref(const LinearConfig& c, int n, const std::vector<float>& x,
                               const std::vector<float>& w, const std::vector<float>& b) {
  std::vector<double> y(static_cast<size_t>(n) * c.out_features);
  for (int i = 0; i < n; ++i)
    for (int o = 0; o < c.out_features; ++o) {
      double s = c.bias ? b[o] : 0.0;
      for (int k = 0; k < c.in_features; ++k)
        s += static_cast<double>(x[i * c.in_features + k]) * w[o * c.in_features + k];
      y[i * c.out_features + o] = s;
    }
  return y;
}

struct LinearGrads {
  std::vector<double> dx, dw, db;
};

LinearGrads linear_backward_ref(const LinearConfig& c, int n, const std::vector<float>& x,
                                const std::vector<float>& w, const std::vector<float>& dy) {
  LinearGrads g{std::vector<double>(x.size()), std::vector<double>(w.size()),
                std::vector<double>(c.out_features)};
  for (int i = 0; i < n; ++i)
    for (int o = 0; o < c.out_features; ++o) {
      const double d = dy[i * c.out_features + o];
      g.db[o] += d;
      for (int k = 0; k < c.in_features; ++k) {
        g.dx[i * c.in_features + k] += d * w[o * c.in_features + k];
        g.dw[o * c.in_features + k] += d * x[i * c.in_features + k];
      }
    }
  return g;
}

class LinearOpTest : public ::testing::TestWithParam<Device> {};

TEST_P(LinearOpTest, MatchesNaiveLoopAndFiniteDifferences) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  struct Case {
    int n, in, out;
    bool bias;
  };
  uint64_t seed = 700;
  for (const Case& k :
       {Case{3, 7, 5, true}, Case{1, 4, 10, false}, Case{5, 33, 17, true}, Case{8, 64, 10, true}}) {
    SCOPED_TRACE("n=" + std::to_string(k.n) + " in=" + std::to_string(k.in) +
                 " out=" + std::to_string(k.out) + (k.bias ? " bias" : " no-bias"));
    const LinearConfig c = config(k.in, k.out, k.bias);
    const size_t nx = static_cast<size_t>(k.n) * k.in, ny = static_cast<size_t>(k.n) * k.out,
                 nw = static_cast<size_t>(k.out) * k.in;
    auto x = random_vector(nx, ++seed), w = random_vector(nw, ++seed, -0.5f, 0.5f),
         b = random_vector(k.out, ++seed);
    const auto r = random_vector(ny, ++seed);
    auto op = backend->linear(c);
    DeviceBuffer x_(backend.get(), x), w_(backend.get(), w), b_(backend.get(), b),
        y_(backend.get(), std::vector<float>(ny, 1e30f)), dy_(backend.get(), r),
        gx(backend.get(), std::vector<float>(nx, 1e30f)),
        gw(backend.get(), std::vector<float>(nw, 1e30f)),
        gb(backend.get(), std::vector<float>(k.out, 1e30f));
    const float* bias = k.bias ? b_.data() : nullptr;
    op->forward(k.n, x_.data(), w_.data(), bias, y_.data());
    EXPECT_TRUE(all_close(y_.to_host(), linear_ref(c, k.n, x, w, b), 1e-5, 1e-5)) << "y";

    op->backward(k.n, x_.data(), w_.data(), dy_.data(), gx.data(), gw.data(),
                 k.bias ? gb.data() : nullptr, false);
    const LinearGrads ref = linear_backward_ref(c, k.n, x, w, r);
    const auto gx_h = gx.to_host(), gw_h = gw.to_host(), gb_h = gb.to_host();
    EXPECT_TRUE(all_close(gx_h, ref.dx, 1e-5, 1e-5)) << "dx";
    EXPECT_TRUE(all_close(gw_h, ref.dw, 1e-5, 1e-5)) << "dw";
    if (k.bias) {
      EXPECT_TRUE(all_close(gb_h, ref.db, 1e-5, 1e-5)) << "db";
    }

    auto loss = [&] {
      upload(x_, x);
      upload(w_, w);
      upload(b_, b);
      op->forward(k.n, x_.data(), w_.data(), bias, y_.data());
      return dot(y_.to_host(), r);
    };
    const auto ix = sample_indices(nx, 12), iw = sample_indices(nw, 12);
    EXPECT_TRUE(all_close(pick(gx_h, ix), numeric_gradient(loss, x, ix), 2e-3, 2e-3)) << "dx FD";
    EXPECT_TRUE(all_close(pick(gw_h, iw), numeric_gradient(loss, w, iw), 2e-3, 2e-3)) << "dw FD";
    if (k.bias) {
      const auto ib = sample_indices(b.size(), 5);
      EXPECT_TRUE(all_close(pick(gb_h, ib), numeric_gradient(loss, b, ib), 2e-3, 2e-3)) << "db FD";
    }
  }
}

TEST_P(LinearOpTest, AccumulateAddsAndDxMayBeSkipped) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  const LinearConfig c = config(6, 4, true);
  const int n = 3;
  const auto x = random_vector(18, 1), w = random_vector(24, 2), dy = random_vector(12, 3),
             old_w = random_vector(24, 4), old_b = random_vector(4, 5);
  DeviceBuffer x_(backend.get(), x), w_(backend.get(), w), dy_(backend.get(), dy),
      gw(backend.get(), old_w), gb(backend.get(), old_b);
  auto op = backend->linear(c);
  op->backward(n, x_.data(), w_.data(), dy_.data(), nullptr, gw.data(), gb.data(), true);
  LinearGrads ref = linear_backward_ref(c, n, x, w, dy);
  for (size_t i = 0; i < 24; ++i) ref.dw[i] += old_w[i];
  for (size_t i = 0; i < 4; ++i) ref.db[i] += old_b[i];
  EXPECT_TRUE(all_close(gw.to_host(), ref.dw, 1e-5, 1e-5)) << "dw";
  EXPECT_TRUE(all_close(gb.to_host(), ref.db, 1e-5, 1e-5)) << "db";
}

TEST_P(LinearOpTest, RejectsBadInput) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  EXPECT_THROW(backend->linear(config(0, 4, true)), Error);
  EXPECT_THROW(backend->linear(config(4, -1, true)), Error);
  auto op = backend->linear(config(4, 3, true));
  DeviceBuffer x(backend.get(), 8), w(backend.get(), 12), y(backend.get(), 6);
  EXPECT_THROW(op->forward(2, x.data(), w.data(), nullptr, y.data()), Error);  // bias missing
  EXPECT_THROW(op->forward(0, x.data(), w.data(), w.data(), y.data()), Error);
}

INSTANTIATE_TEST_SUITE_P(Devices, LinearOpTest, ::testing::ValuesIn(test_devices()),
                         device_param_name);

}  // namespace
}  // namespace ddpv::test
