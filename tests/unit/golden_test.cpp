// Whole-model forward + backward of lenet and resnet20 against PyTorch golden tensors
// (tests/golden/make_golden.py): logits, loss, every parameter gradient and the BatchNorm
// running statistics after one training-mode forward; with the CPU's activations in NHWC and in
// blocks of 8 and 16 channels (Note [Blocked activations]), and in bf16 (Note [bf16 fallback on
// the CPU]).
#include <cmath>

#include "ddpv/nn/model.hpp"
#include "support/test_support.hpp"

namespace ddpv {
namespace {

struct GoldenCase {
  const char* model;
  int activation_block;  // the CPU layout (Note [Blocked activations]): 0 NHWC, 8, 16
  bool bf16 = false;     // --precision bf16: bf16 activations, f32 math
};

class GoldenTest : public ::testing::TestWithParam<GoldenCase> {};

// The error measure is test::rms_floor_error, 1e-4 for logits and statistics and 2e-4 for
// gradients. PyTorch's own fp32 gradients, judged the same way against this reference, reach
// 1.6e-5 (NCHW) and 3.9e-5 to 6.0e-5 (channels_last) on resnet20, worst on
// layer3.2.conv2.weight; ours reach 1.006e-4 on that tensor with NHWC activations, Winograd
// convolutions and one thread on an AVX-512 machine (under 1e-4 with direct convolutions, more
// threads or blocked activations): Winograd rounds more (Note [Winograd convolution]). A wrong
// gradient misses by far more than either. (With a floor of 1% of the largest entry instead,
// neither implementation reaches 1e-4 on resnet20's BatchNorm-heavy backward.)
// In bf16 the measures are the GPU's (cuda_parity_test): test::norm_rel_error <= 0.1 for the
// logits (each stored activation rounded to 8 significant bits, about 2^-8 per layer over ~20
// layers), the loss within 1%, the running statistics within 3e-2, and the gradients within
// 1.5x PyTorch's own autocast-bf16 error on the same case (Note [bf16 reference]).
TEST_P(GoldenTest, ForwardBackwardMatchesPyTorch) {
  const test::GoldenData g = test::read_golden(GetParam().model);
  const std::vector<int64_t>& dims = g.dims;
  const std::vector<float>& ref_logits = g.logits;
  const float ref_loss = g.loss;
  const int n = g.n;

  const bool bf16 = GetParam().bf16;
  auto backend = make_backend(BackendOptions{.precision = bf16 ? Precision::kBF16 : Precision::kF32,
                                             .activation_block = GetParam().activation_block});
  auto error = [bf16](const std::vector<float>& got, const std::vector<float>& ref) {
    return bf16 ? test::norm_rel_error(got, ref) : test::rms_floor_error(got, ref);
  };
  auto model = make_model(GetParam().model, *backend, Shape{dims[1], dims[2], dims[3]}, g.classes);
  // Every parameter and buffer of ours must exist in torch's state_dict, and vice versa.
  test::load_golden_state(*model, g);
  if (HasFatalFailure()) return;

  test::DeviceBuffer x(backend.get(), g.input);
  const Tensor xt = x.t.reshape(Shape{dims[0], dims[1], dims[2], dims[3]});
  const Tensor& logits = model->forward(xt, /*training=*/true);
  EXPECT_EQ(logits.dtype(), bf16 ? DType::kBF16 : DType::kF32);
  EXPECT_LE(error(test::host_floats(*backend, logits), ref_logits), bf16 ? 1e-1 : 1e-4) << "logits";

  test::DeviceLabels y(backend.get(), g.labels);
  auto loss_op = backend->softmax_cross_entropy(g.classes);
  const LossResult loss = loss_op->forward(n, cact(logits), y.data());
  EXPECT_NEAR(loss.loss_sum / n, ref_loss, (bf16 ? 1e-2 : 1e-4) * std::abs(ref_loss));

  Tensor dlogits =
      Tensor::empty(Shape{n, g.classes}, backend->activation_dtype(), backend->allocator());
  loss_op->backward(n, y.data(), mact(dlogits), 1.0f / static_cast<float>(n));
  std::vector<int> ready_order;
  model->backward(dlogits, false, [&](int i) { ready_order.push_back(i); });

  if (bf16) {
    test::expect_bf16_grads_like_pytorch(*model, g.file);
  } else {
    for (const auto& name : test::h5_list(g.file, "grads")) {
      const std::vector<float> ref = test::h5_read_floats(g.file, "grads/" + name);
      EXPECT_LE(test::rms_floor_error(model->get_grad(name), ref), 2e-4) << "gradient of " << name;
    }
  }
  for (const auto& name : test::h5_list(g.file, "buffers_after")) {
    const std::vector<float> ref = test::h5_read_floats(g.file, "buffers_after/" + name);
    EXPECT_LE(error(model->get_param(name), ref), bf16 ? 3e-2 : 1e-4) << "buffer " << name;
  }
  // Every gradient reported ready exactly once (the reducer depends on it).
  std::vector<int> seen(model->params().size(), 0);
  for (int i : ready_order) ++seen.at(static_cast<size_t>(i));
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << model->params()[i].name;
}

INSTANTIATE_TEST_SUITE_P(Models, GoldenTest,
                         ::testing::Values(GoldenCase{"lenet", 0}, GoldenCase{"resnet20", 0},
                                           GoldenCase{"lenet", 8}, GoldenCase{"resnet20", 8},
                                           GoldenCase{"resnet20", 16}, GoldenCase{"lenet", 0, true},
                                           GoldenCase{"resnet20", 0, true},
                                           GoldenCase{"resnet20", 8, true}),
                         [](const auto& info) {
                           const int b = info.param.activation_block;
                           return std::string(info.param.model) +
                                  (b == 0 ? "_Nhwc" : "_Blocked" + std::to_string(b)) +
                                  (info.param.bf16 ? "_Bf16" : "");
                         });

}  // namespace
}  // namespace ddpv
