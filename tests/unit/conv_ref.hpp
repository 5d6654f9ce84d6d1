// Conv2dOp test helpers shared by op_conv_test.cpp, op_conv_winograd_test.cpp and
// op_conv_fused_test.cpp: a case's shape, the naive double-precision loops every algorithm is
// checked against, and the Winograd backend with its tolerance.
#pragma once

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "op_check.hpp"

namespace ddpv::test {

struct ConvCase {
  int n, cin, cout, h, w, k, s, p;
  bool bias;
  Conv2dConfig config() const {
    Conv2dConfig c;
    c.in_channels = cin;
    c.out_channels = cout;
    c.in_h = h;
    c.in_w = w;
    c.kernel = k;
    c.stride = s;
    c.padding = p;
    c.bias = bias;
    return c;
  }
  std::string str() const {
    return "n=" + std::to_string(n) + " cin=" + std::to_string(cin) +
           " cout=" + std::to_string(cout) + " " + std::to_string(h) + "x" + std::to_string(w) +
           " k=" + std::to_string(k) + " s=" + std::to_string(s) + " p=" + std::to_string(p) +
           (bias ? " bias" : " no-bias");
  }
};

// y (N, OH, OW, Cout) = b + sum over (ci, kh, kw) of x (N, H, W, Cin) * w (Cout, Cin, K, K)
inline std::vector<double> conv_forward_ref(const Conv2dConfig& c, int n,
                                            const std::vector<float>& x,
                                            const std::vector<float>& w,
                                            const std::vector<float>& b) {
  const int oh = c.out_h(), ow = c.out_w(), k = c.kernel;
  std::vector<double> y(static_cast<size_t>(n) * oh * ow * c.out_channels);
  for (int i = 0; i < n; ++i)
    for (int yo = 0; yo < oh; ++yo)
      for (int xo = 0; xo < ow; ++xo)
        for (int co = 0; co < c.out_channels; ++co) {
          double s = c.bias ? b[co] : 0.0;
          for (int kh = 0; kh < k; ++kh)
            for (int kw = 0; kw < k; ++kw) {
              const int yi = yo * c.stride - c.padding + kh, xi = xo * c.stride - c.padding + kw;
              if (yi < 0 || yi >= c.in_h || xi < 0 || xi >= c.in_w) continue;
              for (int ci = 0; ci < c.in_channels; ++ci)
                s +=
                    static_cast<double>(x[((i * c.in_h + yi) * c.in_w + xi) * c.in_channels + ci]) *
                    w[((co * c.in_channels + ci) * k + kh) * k + kw];
            }
          y[((i * oh + yo) * ow + xo) * c.out_channels + co] = s;
        }
  return y;
}

struct ConvGrads {
  std::vector<double> dx, dw, db;
};

inline ConvGrads conv_backward_ref(const Conv2dConfig& c, int n, const std::vector<float>& x,
                                   const std::vector<float>& w, const std::vector<float>& dy) {
  const int oh = c.out_h(), ow = c.out_w(), k = c.kernel;
  ConvGrads g{std::vector<double>(x.size()), std::vector<double>(w.size()),
              std::vector<double>(c.out_channels)};
  for (int i = 0; i < n; ++i)
    for (int yo = 0; yo < oh; ++yo)
      for (int xo = 0; xo < ow; ++xo)
        for (int co = 0; co < c.out_channels; ++co) {
          const double d = dy[((i * oh + yo) * ow + xo) * c.out_channels + co];
          g.db[co] += d;
          for (int kh = 0; kh < k; ++kh)
            for (int kw = 0; kw < k; ++kw) {
              const int yi = yo * c.stride - c.padding + kh, xi = xo * c.stride - c.padding + kw;
              if (yi < 0 || yi >= c.in_h || xi < 0 || xi >= c.in_w) continue;
              for (int ci = 0; ci < c.in_channels; ++ci) {
                const size_t xi_idx = ((i * c.in_h + yi) * c.in_w + xi) * c.in_channels + ci;
                const size_t wi_idx = ((co * c.in_channels + ci) * k + kh) * k + kw;
                g.dx[xi_idx] += d * w[wi_idx];
                g.dw[wi_idx] += d * x[xi_idx];
              }
            }
        }
  return g;
}

// One convolution's data for a test in the activation layouts: random inputs on the host in
// NHWC (x, w, b, and r, the dy of the probe loss sum(y * r)) and their device copies in the
// config's layouts; outputs and gradients start as junk (1e30), so an entry an op skips shows.
struct ConvProblem {
  Conv2dConfig c;
  int n;
  int64_t ihw, ohw;  // input and output positions per image
  std::vector<float> x, w, b, r;
  DeviceBuffer x_, w_, b_, dy_, y_, gx, gw, gb;

  // Draws x, w, b and r from seeds after `seed`, advancing it by four.
  ConvProblem(Backend* be, const Conv2dConfig& cfg, int batch, uint64_t& seed)
      : c(cfg),
        n(batch),
        ihw(int64_t{cfg.in_h} * cfg.in_w),
        ohw(int64_t{cfg.out_h()} * cfg.out_w()),
        x(random_vector(static_cast<size_t>(n * ihw * c.in_channels), ++seed)),
        w(random_vector(static_cast<size_t>(c.out_channels) * c.in_channels * c.kernel * c.kernel,
                        ++seed, -0.5f, 0.5f)),
        b(random_vector(static_cast<size_t>(c.out_channels), ++seed)),
        r(random_vector(static_cast<size_t>(n * ohw * c.out_channels), ++seed)),
        x_(be, nhwc_to_blocked(x, n, ihw, c.in_channels, c.in_block)),
        w_(be, w),
        b_(be, b),
        dy_(be, nhwc_to_blocked(r, n, ohw, c.out_channels, c.out_block)),
        y_(be, junk(r.size())),
        gx(be, junk(x.size())),
        gw(be, junk(w.size())),
        gb(be, junk(b.size())) {}

  void forward(Conv2dOp& op) {
    op.forward(n, x_.data(), w_.data(), c.bias ? b_.data() : nullptr, y_.data());
  }
  void backward(Conv2dOp& op, bool with_dx, bool accumulate) {
    op.backward(n, x_.data(), w_.data(), dy_.data(), with_dx ? gx.data() : nullptr, gw.data(),
                c.bias ? gb.data() : nullptr, accumulate);
  }
  // The op's y and dx, back in NHWC.
  std::vector<float> y() const {
    return blocked_to_nhwc(y_.to_host(), n, ohw, c.out_channels, c.out_block);
  }
  std::vector<float> dx() const {
    return blocked_to_nhwc(gx.to_host(), n, ihw, c.in_channels, c.in_block);
  }
  // The naive loops' y and gradients for these data (weights `w`, or others).
  std::vector<double> y_ref() const { return conv_forward_ref(c, n, x, w, b); }
  ConvGrads grads_ref() const { return conv_backward_ref(c, n, x, w, r); }

 private:
  static std::vector<float> junk(size_t count) { return std::vector<float>(count, 1e30f); }
};

// A CPU backend whose stride-1 3x3 and 5x5 convolutions all take the Winograd path.
inline std::unique_ptr<Backend> winograd_backend(int block, int threads) {
  BackendOptions o;
  o.threads = threads;
  o.activation_block = block;
  o.conv_algorithm = ConvAlgorithm::kWinograd;
  return make_backend(o);
}

// f(backend, config, case) for each (activation block, threads) setup and each case, the
// config in that setup's layout, under a trace naming both.
template <class F>
inline void for_each_setup(std::initializer_list<std::pair<int, int>> setups,
                           std::initializer_list<ConvCase> cases, const F& f) {
  for (auto [block, threads] : setups) {
    auto backend = winograd_backend(block, threads);
    for (const ConvCase& cc : cases) {
      Conv2dConfig c = cc.config();
      c.in_block = block_for(c.in_channels, block);
      c.out_block = block_for(c.out_channels, block);
      SCOPED_TRACE(cc.str() + " block " + std::to_string(block) + ", " + std::to_string(threads) +
                   " threads");
      f(*backend, c, cc);
    }
  }
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// Winograd's rounding follows the magnitude of a whole tile: entries are compared to 1e-5 of
// the largest (a wrong transform or a lost tile misses by far more than that).
inline ::testing::AssertionResult winograd_close(const std::vector<float>& got,
                                                 const std::vector<double>& want) {
  return all_close(got, want, 1e-4, 1e-5 * std::max(1.0, max_abs(want)));
}

}  // namespace ddpv::test
