// SoftmaxCrossEntropyOp on the CPU: fused, numerically stable softmax + cross-entropy over a
// batch of logits, with the top-1 count; forward and backward side by side.
#include <cmath>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_ops.hpp"

namespace ddpv::cpu {
namespace {

class CpuSoftmaxCrossEntropy final : public F32SoftmaxCrossEntropyOp {
 public:
  CpuSoftmaxCrossEntropy(const CpuContext& ctx, int classes) : ctx_(ctx), classes_(classes) {
    DDPV_CHECK(classes > 0, "softmax_cross_entropy: the number of classes must be positive, got ",
               classes);
  }

  // logits: (N, K), labels: (N) in [0, K)
  LossResult forward_f32(int n, const float* logits, const int32_t* labels) override {
    check_batch("softmax_cross_entropy forward", n);
    const int k = classes_;
    for (int i = 0; i < n; ++i)
      DDPV_CHECK(labels[i] >= 0 && labels[i] < k, "softmax_cross_entropy: label ", labels[i],
                 " of sample ", i, " is outside [0, ", k,
                 "); the data has more classes than the model was built for");
    // Grows only when a larger batch arrives; the steady state allocates nothing.
    if (probs_.size() < static_cast<size_t>(n) * k) probs_.resize(static_cast<size_t>(n) * k);
    LossResult r;
    for (int i = 0; i < n; ++i) {
      const float* row = logits + static_cast<int64_t>(i) * k;
      float* p = probs_.data() + static_cast<int64_t>(i) * k;
      int arg = 0;
      for (int j = 1; j < k; ++j)
        if (row[j] > row[arg]) arg = j;
      const float mx = row[arg];
      // Subtracting the maximum keeps every exp() in (0, 1]: no overflow for large logits.
      double sum = 0;
      for (int j = 0; j < k; ++j) {
        p[j] = std::exp(row[j] - mx);
        sum += p[j];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int j = 0; j < k; ++j) p[j] *= inv;
      r.loss_sum += std::log(sum) - static_cast<double>(row[labels[i]] - mx);
      if (arg == labels[i]) ++r.correct;
    }
    last_n_ = n;
    return r;
  }

  // dlogits: (N, K) = (softmax - onehot(label)) * scale
  void backward_f32(int n, const int32_t* labels, float* dlogits, float scale) override {
    check_batch("softmax_cross_entropy backward", n);
    DDPV_CHECK(n == last_n_, "softmax_cross_entropy backward: batch size ", n,
               " differs from the last forward (", last_n_, ")");
    const int k = classes_;
    const int64_t total = static_cast<int64_t>(n) * k;
    for (int64_t t = 0; t < total; ++t) dlogits[t] = probs_[t] * scale;
    for (int i = 0; i < n; ++i) {
      DDPV_CHECK(labels[i] >= 0 && labels[i] < k, "softmax_cross_entropy: label ", labels[i],
                 " of sample ", i, " is outside [0, ", k, ")");
      dlogits[static_cast<int64_t>(i) * k + labels[i]] -= scale;
    }
  }

 private:
  CpuContext ctx_;
  int classes_;
  int last_n_ = 0;
  std::vector<float> probs_;  // (N, K) softmax of the last forward
};

}  // namespace

std::unique_ptr<SoftmaxCrossEntropyOp> make_softmax_cross_entropy(const CpuContext& ctx,
                                                                  int classes) {
  return std::make_unique<CpuSoftmaxCrossEntropy>(ctx, classes);
}

}  // namespace ddpv::cpu
