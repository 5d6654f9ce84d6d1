// Fused softmax + cross-entropy on the GPU: forward keeps the probabilities and returns the
// batch's loss sum and correct count on the host; backward writes (softmax - onehot) * scale.
// Logits and their gradient are f32 or bf16; the probabilities and the sums are f32.
#include <memory>

#include "backend/cuda/cuda_context.hpp"
#include "backend/cuda/cuda_kernels.hpp"
#include "backend/cuda/cuda_ops.hpp"

namespace ddpv::cuda {
namespace {

class CudaSoftmaxCrossEntropy final : public SoftmaxCrossEntropyOp {
 public:
  CudaSoftmaxCrossEntropy(std::shared_ptr<CudaContext> ctx, int classes)
      : ctx_(std::move(ctx)), classes_(classes), accum_(sizeof(LossAccum)) {
    DDPV_CHECK(classes > 0, "softmax_cross_entropy: classes must be positive, got ", classes);
  }

  LossResult forward(int n, ConstAct logits, const int32_t* labels) override {
    DDPV_CHECK(n > 0, "softmax_cross_entropy: batch size must be positive, got ", n);
    if (n > capacity_) {
      probs_ = DeviceMemory(sizeof(float) * static_cast<size_t>(n) * classes_);
      rows_ = DeviceMemory((sizeof(float) + sizeof(int32_t)) * static_cast<size_t>(n));
      capacity_ = n;
    }
    float* row_loss = rows_.as<float>();
    int32_t* row_tag = reinterpret_cast<int32_t*>(row_loss + capacity_);
    const cudaStream_t st = ctx_->stream();
    DDPV_CUDA_CHECK(softmax_xent_forward(n, classes_, logits.data, logits.is_bf16(), labels,
                                         probs_.as<float>(), row_loss, row_tag,
                                         accum_.as<LossAccum>(), st));
    LossAccum host{};
    DDPV_CUDA_CHECK(cudaMemcpyAsync(&host, accum_.get(), sizeof host, cudaMemcpyDeviceToHost, st));
    ctx_->synchronize();
    DDPV_CHECK(host.bad_labels == 0, "softmax_cross_entropy: label ", host.first_bad_label,
               " of sample ", host.first_bad_row, " is outside [0, ", classes_, ") (",
               host.bad_labels,
               " such labels in the batch): the data's classes do not match "
               "the model's");
    last_n_ = n;
    return LossResult{host.loss_sum, static_cast<int64_t>(host.correct)};
  }

  void backward(int n, const int32_t* labels, MutAct dlogits, float scale) override {
    DDPV_CHECK(n == last_n_, "softmax_cross_entropy: backward of batch ", n,
               " does not follow a forward of that batch (last was ", last_n_, ")");
    DDPV_CUDA_CHECK(softmax_xent_backward(n, classes_, probs_.as<float>(), labels, scale,
                                          dlogits.data, dlogits.is_bf16(), ctx_->stream()));
  }

 private:
  std::shared_ptr<CudaContext> ctx_;
  int classes_;
  int capacity_ = 0, last_n_ = -1;
  DeviceMemory probs_;  // (N, K)
  DeviceMemory rows_;   // row_loss (N) f32, then row_tag (N) i32
  DeviceMemory accum_;  // one LossAccum
};

}  // namespace

std::unique_ptr<SoftmaxCrossEntropyOp> make_softmax_cross_entropy(std::shared_ptr<CudaContext> ctx,
                                                                  int classes) {
  return std::make_unique<CudaSoftmaxCrossEntropy>(std::move(ctx), classes);
}

}  // namespace ddpv::cuda
