// The Winograd transform matrices (Note [Winograd convolution] in kernels/winograd/conv2d.cpp): the
// Cook-Toom construction in double precision, its float copy, and the check of the entries
// the tile loops assume.
#include <algorithm>
#include <iterator>
#include <utility>
#include <vector>

#include "backend/cpu/kernels/winograd/winograd.hpp"
#include "ddpv/core/error.hpp"

namespace ddpv::cpu {
namespace {

// Cook-Toom points: alpha - 1 finite ones, then infinity. The loops rely on this order: 0,
// then pairs +x, -x (Note [Paired points] in kernels/winograd/per_isa_kernels.hpp).
constexpr double kPoints[] = {0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, -3.0};

}  // namespace

WinogradMatricesF64 winograd_matrices_f64(int m, int r) {
  const int a = m + r - 1;
  DDPV_CHECK(m >= 1 && r >= 1 && a - 1 <= static_cast<int>(std::size(kPoints)),
             "winograd: no points for F(", m, "x", m, ",", r, "x", r, ")");
  WinogradMatricesF64 w{m,
                        r,
                        a,
                        std::vector<double>(size_t(m) * a),
                        std::vector<double>(size_t(a) * r),
                        std::vector<double>(size_t(a) * a)};
  const int finite = a - 1;
  for (int p = 0; p < finite; ++p) {
    const double x = kPoints[p];
    double scale = 1.0;  // prod over the other finite points q of (x - x_q)
    for (int q = 0; q < finite; ++q)
      if (q != p) scale *= x - kPoints[q];
    double power = 1.0;
    for (int i = 0; i < std::max(m, r); ++i, power *= x) {
      if (i < m) w.at[size_t(i) * a + p] = power;
      if (i < r) w.g[size_t(p) * r + i] = power / scale;
    }
  }
  w.at[size_t(m - 1) * a + finite] = 1.0;  // the point at infinity
  w.g[size_t(finite) * r + r - 1] = 1.0;
  // Row p of Bt: the coefficients of prod over the finite q != p of (z - x_q), which is x_p's
  // Lagrange basis polynomial times the scale G divides by; the row of infinity: prod over all
  // finite q of (z - x_q), which carries the one power (z^(alpha-1)) interpolation misses.
  for (int p = 0; p <= finite; ++p) {
    std::vector<double> poly{1.0};  // coefficients, lowest power first
    for (int q = 0; q < finite; ++q) {
      if (q == p) continue;
      std::vector<double> next(poly.size() + 1, 0.0);
      for (size_t k = 0; k < poly.size(); ++k) {
        next[k + 1] += poly[k];
        next[k] -= kPoints[q] * poly[k];
      }
      poly = std::move(next);
    }
    for (size_t j = 0; j < poly.size(); ++j) w.bt[size_t(p) * a + j] = poly[j];
  }
  return w;
}

WinogradMatrices winograd_matrices(int m, int r) {
  const WinogradMatricesF64 d = winograd_matrices_f64(m, r);
  auto narrow = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  return {d.m, d.r, d.alpha, narrow(d.at), narrow(d.g), narrow(d.bt)};
}

bool winograd_known_entries(const WinogradMatrices& w) {
  const int a = w.alpha, m = w.m, pairs = (a - 2) / 2;
  auto at = [&](int i, int k) { return w.at[size_t(i) * a + k]; };
  auto bt = [&](int p, int j) { return w.bt[size_t(p) * a + j]; };
  bool ok = a % 2 == 0 && m >= 2 && pairs >= 1;
  for (int i = 0; ok && i < m; ++i) {
    ok = at(i, 0) == (i == 0 ? 1.0f : 0.0f) && at(i, a - 1) == (i == m - 1 ? 1.0f : 0.0f) &&
         at(i, 1) == 1.0f;
    for (int q = 0; ok && q < pairs; ++q)  // +x, -x: x^i and (-x)^i
      ok = at(i, 2 + 2 * q) == (i % 2 == 0 ? 1.0f : -1.0f) * at(i, 1 + 2 * q);
  }
  for (int k = 0; ok && k < a - 1; ++k) ok = at(0, k) == 1.0f;
  for (int j = 0; ok && j < a; ++j) {
    ok = (j % 2 == 0 || bt(0, j) == 0.0f) && (j % 2 == 1 || bt(a - 1, j) == 0.0f);
    for (int q = 0; ok && q < pairs; ++q)  // the rows of +x and -x: equal on even columns
      ok = bt(2 + 2 * q, j) == (j % 2 == 0 ? 1.0f : -1.0f) * bt(1 + 2 * q, j);
  }
  for (int p = 1; ok && p < a - 1; ++p) ok = bt(p, 0) == 0.0f && bt(p, a - 1) == 0.0f;
  for (int p = 0; ok && p < a - 1; ++p) ok = bt(p, a - 2) == 1.0f;
  return ok && bt(a - 1, a - 1) == 1.0f;
}

}  // namespace ddpv::cpu
