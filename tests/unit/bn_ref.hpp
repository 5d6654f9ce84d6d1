// Naive double-precision BatchNorm for the op tests (op_batchnorm_test.cpp,
// op_residual_fusion_test.cpp): training forward with batch statistics, the textbook backward,
// and the check of an op's gradients against it.
#pragma once

#include <cmath>
#include <vector>

#include "op_check.hpp"

namespace ddpv::test {

struct BnRef {
  std::vector<double> y, mean, var;  // var: biased, as normalisation uses it
};

// x, y: (N, H, W, C); statistics per channel over M = N * H * W values.
inline BnRef bn_train_ref(const BatchNormConfig& c, int n, const std::vector<float>& x,
                          const std::vector<float>& gamma, const std::vector<float>& beta) {
  const size_t m = static_cast<size_t>(n) * c.h * c.w, ch = c.channels;
  BnRef r{std::vector<double>(x.size()), std::vector<double>(ch), std::vector<double>(ch)};
  for (size_t i = 0; i < m; ++i)
    for (size_t k = 0; k < ch; ++k) r.mean[k] += x[i * ch + k] / static_cast<double>(m);
  for (size_t i = 0; i < m; ++i)
    for (size_t k = 0; k < ch; ++k) {
      const double d = x[i * ch + k] - r.mean[k];
      r.var[k] += d * d / static_cast<double>(m);
    }
  for (size_t i = 0; i < m; ++i)
    for (size_t k = 0; k < ch; ++k)
      r.y[i * ch + k] =
          gamma[k] * (x[i * ch + k] - r.mean[k]) / std::sqrt(r.var[k] + c.eps) + beta[k];
  return r;
}

// The textbook gradient of batch normalisation with batch statistics.
inline void bn_backward_ref(const BatchNormConfig& c, int n, const std::vector<float>& x,
                            const std::vector<float>& gamma, const std::vector<float>& dy,
                            std::vector<double>& dx, std::vector<double>& dgamma,
                            std::vector<double>& dbeta) {
  const BnRef s = bn_train_ref(c, n, x, gamma, std::vector<float>(gamma.size()));
  const size_t m = static_cast<size_t>(n) * c.h * c.w, ch = c.channels;
  dx.assign(x.size(), 0);
  dgamma.assign(ch, 0);
  dbeta.assign(ch, 0);
  std::vector<double> xhat(x.size());
  for (size_t i = 0; i < m; ++i)
    for (size_t k = 0; k < ch; ++k) {
      xhat[i * ch + k] = (x[i * ch + k] - s.mean[k]) / std::sqrt(s.var[k] + c.eps);
      dbeta[k] += dy[i * ch + k];
      dgamma[k] += dy[i * ch + k] * xhat[i * ch + k];
    }
  for (size_t i = 0; i < m; ++i)
    for (size_t k = 0; k < ch; ++k)
      dx[i * ch + k] = gamma[k] / std::sqrt(s.var[k] + c.eps) *
                       (dy[i * ch + k] - dbeta[k] / m - xhat[i * ch + k] * dgamma[k] / m);
}

// The op's gradients (dx in NHWC) against the naive backward of dy (already masked where a
// fused ReLU closed), to 1e-4 relative and 1e-5 absolute.
inline void expect_naive_backward(const BatchNormConfig& c, int n, const std::vector<float>& x,
                                  const std::vector<float>& gamma, const std::vector<float>& dy,
                                  const std::vector<float>& dx, const std::vector<float>& dgamma,
                                  const std::vector<float>& dbeta) {
  std::vector<double> want_dx, want_dg, want_db;
  bn_backward_ref(c, n, x, gamma, dy, want_dx, want_dg, want_db);
  EXPECT_TRUE(all_close(dx, want_dx, 1e-4, 1e-5)) << "dx";
  EXPECT_TRUE(all_close(dgamma, want_dg, 1e-4, 1e-5)) << "dgamma";
  EXPECT_TRUE(all_close(dbeta, want_db, 1e-4, 1e-5)) << "dbeta";
}

inline BatchNormConfig bn_config(int channels, int h, int w) {
  BatchNormConfig c;
  c.channels = channels;
  c.h = h;
  c.w = w;
  c.momentum = 0.1f;
  return c;
}

}  // namespace ddpv::test
