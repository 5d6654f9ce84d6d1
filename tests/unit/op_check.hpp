// Helpers shared by the op tests (tests/unit/op_*_test.cpp): closeness checks against
// double-precision references, host <-> device round trips, and the scalar probe loss.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <vector>

#include "support/test_support.hpp"

namespace ddpv::test {

// Every |actual_i - expected_i| <= atol + rtol * |expected_i|; names the worst entry otherwise.
inline ::testing::AssertionResult all_close(const std::vector<float>& actual,
                                            const std::vector<double>& expected, double rtol,
                                            double atol) {
  if (actual.size() != expected.size())
    return ::testing::AssertionFailure()
           << "size " << actual.size() << " != expected size " << expected.size();
  size_t worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double err = std::abs(static_cast<double>(actual[i]) - expected[i]);
    const double excess = std::isnan(err) ? INFINITY : err - (atol + rtol * std::abs(expected[i]));
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  if (worst_excess <= 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "entry " << worst << " of " << actual.size() << ": got " << actual[worst]
         << ", expected " << expected[worst] << " (rtol " << rtol << ", atol " << atol << ")";
}

// The entries `indices` of a full gradient, for comparison with numeric_gradient.
inline std::vector<float> pick(const std::vector<float>& full, const std::vector<size_t>& indices) {
  std::vector<float> out;
  for (size_t i : indices) out.push_back(full[i]);
  return out;
}

// sum_i a_i * b_i in double: the probe loss L = sum(y * r) whose gradient wrt y is r.
inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Overwrites a device buffer with host values.
inline void upload(DeviceBuffer& d, const std::vector<float>& host) {
  ASSERT_EQ(static_cast<size_t>(d.t.numel()), host.size());
  d.backend->copy(d.data(), d.backend->device(), host.data(), Device::kCpu,
                  host.size() * sizeof(float));
}

// An NHWC tensor's values laid out with channel block `block` (Note [Blocked activations]; 0
// is NHWC itself), and back; index loops of their own, independent of Backend::relayout.
inline size_t blocked_offset(int block, int c, int64_t hw, int64_t i, int64_t s, int64_t ch) {
  if (block == 0) return static_cast<size_t>((i * hw + s) * c + ch);
  return static_cast<size_t>(((i * (c / block) + ch / block) * hw + s) * block + ch % block);
}
inline std::vector<float> change_layout(const std::vector<float>& v, int n, int64_t hw, int c,
                                        int from_block, int to_block) {
  std::vector<float> out(v.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t s = 0; s < hw; ++s)
      for (int64_t ch = 0; ch < c; ++ch)
        out[blocked_offset(to_block, c, hw, i, s, ch)] =
            v[blocked_offset(from_block, c, hw, i, s, ch)];
  return out;
}
inline std::vector<float> nhwc_to_blocked(const std::vector<float>& v, int n, int64_t hw, int c,
                                          int block) {
  return change_layout(v, n, hw, c, 0, block);
}
inline std::vector<float> blocked_to_nhwc(const std::vector<float>& v, int n, int64_t hw, int c,
                                          int block) {
  return change_layout(v, n, hw, c, block, 0);
}

inline std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

}  // namespace ddpv::test
