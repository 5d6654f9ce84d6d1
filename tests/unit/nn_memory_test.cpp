// What a model holds between layers: a pooled convolution's outputs never allocated (Note
// [Pooled activations]), the residual blocks' shared gradient buffers (Note [Shared gradient
// buffers]) and storage that only grows (Note [Grow-only activations]), each counted through
// the host allocator's statistics.
#include <algorithm>
#include <cmath>

#include "ddpv/nn/model.hpp"
#include "model_check.hpp"
#include "support/test_support.hpp"

namespace ddpv {
namespace {

using test::cpu;
using test::loss_gradient;

// Note [Pooled activations]: where lenet's convolutions compute their poolings, the step holds
// nothing of a convolution's full-size output: its largest tensor is pool1's output (or conv2's
// input gradient, the same size), not conv1's output, four times that, which the model on
// oneDNN's direct kernels (no pooling fused) does hold.
TEST(ModelMemoryTest, PooledConvolutionsHoldOnlyThePooledOutput) {
  BackendOptions o;
  o.threads = 1;
  auto fused_be = cpu();
  o.conv_algorithm = ConvAlgorithm::kDirect;
  auto plain_be = make_backend(o);
  const int n = 5;
  auto xs = test::random_vector(n * 28 * 28, 8);
  std::vector<int32_t> ys{1, 7, 3, 0, 9};
  auto largest_in_step = [&](Backend& be) {
    auto m = make_model("lenet", be, Shape{28, 28, 1}, 10);
    m->init_parameters(4);
    Tensor x = Tensor::wrap(xs.data(), Shape{n, 28, 28, 1}, DType::kF32);
    reset_host_memory_peak();
    const size_t before = host_memory_stats().in_use;
    m->backward(loss_gradient(be, m->forward(x, true), ys), false);
    const HostMemoryStats after = host_memory_stats();
    EXPECT_GT(after.in_use, before);  // the step's activations live on in the model
    return after.largest;
  };
  const size_t pooled = size_t{n} * 14 * 14 * 32 * sizeof(float);
  EXPECT_EQ(largest_in_step(*fused_be), pooled);
  EXPECT_EQ(largest_in_step(*plain_be), 4 * pooled);  // conv1's output, (n, 28, 28, 32)
}

// Note [Grow-only activations]: after a batch of 5, steps of 3 and 5 allocate nothing but the
// loss gradient this test makes (the smaller batch takes views of the larger one's storage),
// and the batch of 3 gets the gradients a fresh model of the same parameters gives it.
TEST(ModelMemoryTest, SmallerBatchReusesTheStorage) {
  auto be = cpu();
  auto m = make_model("resnet20", *be, Shape{32, 32, 3}, 10);
  auto fresh = make_model("resnet20", *be, Shape{32, 32, 3}, 10);
  m->init_parameters(3);
  fresh->init_parameters(3);
  auto xs = test::random_vector(5 * 32 * 32 * 3, 10);
  std::vector<int32_t> ys{4, 8, 1, 0, 9};
  auto step = [&](Model& model, int n, bool measure) {
    Tensor x = Tensor::wrap(xs.data(), Shape{n, 32, 32, 3}, DType::kF32);
    reset_host_memory_peak();
    const size_t before = host_memory_stats().in_use;
    model.backward(loss_gradient(*be, model.forward(x, true), ys), false);
    if (measure) {
      EXPECT_EQ(host_memory_stats().largest, size_t(n) * 10 * sizeof(float)) << "batch " << n;
      EXPECT_EQ(host_memory_stats().in_use, before) << "batch " << n;
    }
    return std::vector<float>(model.grad_data(), model.grad_data() + model.param_count());
  };
  step(*m, 5, false);
  const std::vector<float> got = step(*m, 3, true);
  step(*m, 5, true);
  const std::vector<float> want = step(*fresh, 3, false);
  EXPECT_LE(test::error_of_largest(got, want), 1e-6);
}

// Note [Shared gradient buffers]: what resnet20's backward allocates, counted by hand from its
// shapes per sample: two buffers of the largest activation (32 x 32 x 16) for the model's own
// layers, two more that all nine blocks' branches share (each branch held its own two before,
// 22 in all), and for each of the two projection blocks its output gradient (16 x 16 x 32, 8 x 8 x
// 64) and its shortcut's input gradient (32 x 32 x 16, 16 x 16 x 32), and one scratch tensor
// for the gradients inside fused blocks (Note [Fused blocks]), of the largest of them: a
// 32 x 32 x 16 convolution output's, shared by the model's blocks. Its gradients still
// match PyTorch's (golden_test) and separate layers' (FusedLayersComputeWhatSeparateLayersCompute).
TEST(ModelMemoryTest, ResidualBlocksShareTheirGradientBuffers) {
  auto be = cpu();
  auto m = make_model("resnet20", *be, Shape{32, 32, 3}, 10);
  m->init_parameters(2);
  const int n = 2;
  auto xs = test::random_vector(n * 32 * 32 * 3, 9);
  std::vector<int32_t> ys{4, 8};
  Tensor x = Tensor::wrap(xs.data(), Shape{n, 32, 32, 3}, DType::kF32);
  const Tensor dl = loss_gradient(*be, m->forward(x, true), ys);
  const size_t before = host_memory_stats().in_use;
  m->backward(dl, false);
  const int64_t per_sample = 4 * 16384 + (8192 + 4096) + (16384 + 8192) + 16384;
  EXPECT_EQ(host_memory_stats().in_use - before, size_t(n * per_sample) * sizeof(float));
}

}  // namespace
}  // namespace ddpv
