// SoftmaxCrossEntropyOp against a naive double-precision loop and finite differences, on every
// device: loss sum, top-1 count, gradient, numerical stability, labels out of range.
#include <cmath>
#include <string>

#include "op_check.hpp"

namespace ddpv::test {
namespace {

struct XentRef {
  double loss_sum = 0;
  int64_t correct = 0;
  std::vector<double> dlogits;  // (softmax - onehot) * scale
};

XentRef xent_ref(int n, int k, const std::vector<float>& logits, const std::vector<int32_t>& labels,
                 double scale) {
  XentRef r;
  r.dlogits.resize(logits.size());
  for (int i = 0; i < n; ++i) {
    const float* row = logits.data() + static_cast<size_t>(i) * k;
    double z = 0;
    int arg = 0;
    for (int j = 0; j < k; ++j) {
      z += std::exp(static_cast<double>(row[j]));
      if (row[j] > row[arg]) arg = j;
    }
    r.loss_sum += -std::log(std::exp(static_cast<double>(row[labels[i]])) / z);
    if (arg == labels[i]) ++r.correct;
    for (int j = 0; j < k; ++j)
      r.dlogits[static_cast<size_t>(i) * k + j] =
          (std::exp(static_cast<double>(row[j])) / z - (j == labels[i] ? 1.0 : 0.0)) * scale;
  }
  return r;
}

class LossOpTest : public ::testing::TestWithParam<Device> {};

TEST_P(LossOpTest, MatchesNaiveLoopAndFiniteDifferences) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  struct Case {
    int n, k;
  };
  uint64_t seed = 900;
  for (const Case& cs : {Case{5, 3}, Case{16, 10}, Case{7, 1}, Case{3, 100}}) {
    SCOPED_TRACE("n=" + std::to_string(cs.n) + " k=" + std::to_string(cs.k));
    const int n = cs.n, k = cs.k;
    auto logits = random_vector(static_cast<size_t>(n) * k, ++seed, -3.0f, 3.0f);
    std::vector<int32_t> labels(n);
    const auto u = random_vector(n, ++seed, 0.0f, 1.0f);
    for (int i = 0; i < n; ++i) labels[i] = std::min(k - 1, static_cast<int>(u[i] * k));
    // Make every other sample correctly classified, so the count is not trivially 0.
    for (int i = 0; i < n; i += 2) logits[static_cast<size_t>(i) * k + labels[i]] = 5.0f;
    auto op = backend->softmax_cross_entropy(k);
    DeviceBuffer l_(backend.get(), logits), d_(backend.get(), std::vector<float>(logits.size(), 7));
    DeviceLabels y_(backend.get(), labels);
    const double scale = 1.0 / n;
    const LossResult got = op->forward(n, l_.data(), y_.data());
    const XentRef ref = xent_ref(n, k, logits, labels, scale);
    EXPECT_NEAR(got.loss_sum, ref.loss_sum, 1e-5 * std::max(1.0, ref.loss_sum));
    EXPECT_EQ(got.correct, ref.correct);
    EXPECT_GE(got.correct, (n + 1) / 2);
    op->backward(n, y_.data(), d_.data(), static_cast<float>(scale));
    const auto d_h = d_.to_host();
    EXPECT_TRUE(all_close(d_h, ref.dlogits, 1e-5, 1e-6)) << "dlogits";

    // d(loss_sum * scale) / dlogits by finite differences.
    auto loss = [&] {
      upload(l_, logits);
      return op->forward(n, l_.data(), y_.data()).loss_sum * scale;
    };
    const auto idx = sample_indices(logits.size(), 16);
    EXPECT_TRUE(all_close(pick(d_h, idx), numeric_gradient(loss, logits, idx, 1e-3), 1e-2, 1e-4))
        << "dlogits FD";
  }
}

TEST_P(LossOpTest, StableForLargeLogits) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  // exp(1000) overflows a float and a double: only the max-shifted form survives.
  const std::vector<float> logits{1000.0f, 990.0f, -1000.0f, -2000.0f, -1990.0f, -2010.0f};
  const std::vector<int32_t> labels{1, 0};
  auto op = backend->softmax_cross_entropy(3);
  DeviceBuffer l_(backend.get(), logits), d_(backend.get(), 6);
  DeviceLabels y_(backend.get(), labels);
  const LossResult got = op->forward(2, l_.data(), y_.data());
  // Sample 0: 1000 + log(1 + e^-10 + e^-2000) - 990; sample 1: -1990 + log(1 + e^-10 + e^-20) +
  // 2000.
  const double want =
      10 + std::log1p(std::exp(-10.0)) + 10 + std::log1p(std::exp(-10.0) + std::exp(-20.0));
  EXPECT_NEAR(got.loss_sum, want, 1e-3);
  EXPECT_EQ(got.correct, 0);
  op->backward(2, y_.data(), d_.data(), 1.0f);
  for (float g : d_.to_host()) EXPECT_TRUE(std::isfinite(g));
}

TEST_P(LossOpTest, RejectsLabelsOutOfRange) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  EXPECT_THROW(backend->softmax_cross_entropy(0), Error);
  auto op = backend->softmax_cross_entropy(4);
  DeviceBuffer l_(backend.get(), random_vector(8, 1));
  for (int32_t bad : {4, -1, 1000}) {
    DeviceLabels y_(backend.get(), {0, bad});
    try {
      op->forward(2, l_.data(), y_.data());
      ADD_FAILURE() << "label " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("label " + std::to_string(bad)), std::string::npos) << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, LossOpTest, ::testing::ValuesIn(test_devices()),
                         device_param_name);

}  // namespace
}  // namespace ddpv::test
