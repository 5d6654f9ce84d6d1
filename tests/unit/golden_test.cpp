// Whole-model forward + backward of lenet and resnet20 against PyTorch golden tensors
// (tests/golden/make_golden.py): logits, loss, every parameter gradient and the BatchNorm
// running statistics after one training-mode forward; with the CPU's activations in NHWC and in
// blocks of 8 and 16 channels (Note [Blocked activations]).
#include <cmath>

#include "ddpv/nn/model.hpp"
#include "support/test_support.hpp"

namespace ddpv {
namespace {

struct GoldenCase {
  const char* model;
  int activation_block;  // the CPU layout (Note [Blocked activations]): 0 NHWC, 8, 16
};

class GoldenTest : public ::testing::TestWithParam<GoldenCase> {};

// Relative error against the (float64) reference, with an absolute floor at the tensor's
// root-mean-square magnitude: an entry far below the tensor's typical size is a sum of
// cancelling products and carries fp32 rounding of the size of its terms, not of its result,
// so it is judged on the tensor's scale. (PyTorch's own fp32 gradients are judged the same way
// against this reference; with a floor of 1% of the largest entry, neither implementation
// reaches 1e-4 on resnet20's BatchNorm-heavy backward.)
double tensor_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double sq = 0;
  for (float v : ref) sq += static_cast<double>(v) * v;
  const double rms = std::sqrt(sq / std::max<size_t>(ref.size(), 1));
  return test::max_rel_error(got, ref, std::max(rms, 1e-7));
}

TEST_P(GoldenTest, ForwardBackwardMatchesPyTorch) {
  const std::string file = test::source_path(std::string("tests/golden/") + GetParam().model + ".h5");
  std::vector<int64_t> dims;
  const std::vector<float> input = test::h5_read_floats(file, "input", &dims);
  ASSERT_EQ(dims.size(), 4u);
  const std::vector<int32_t> labels = test::h5_read_ints(file, "labels");
  const std::vector<float> ref_logits = test::h5_read_floats(file, "logits");
  const float ref_loss = test::h5_read_floats(file, "loss")[0];
  const int n = static_cast<int>(dims[0]);
  const int classes = static_cast<int>(ref_logits.size()) / n;

  auto backend = make_backend(BackendOptions{.activation_block = GetParam().activation_block});
  auto model = make_model(GetParam().model, *backend, Shape{dims[1], dims[2], dims[3]}, classes);
  // Every parameter and buffer of ours must exist in torch's state_dict, and vice versa.
  const auto torch_params = test::h5_list(file, "params");
  ASSERT_EQ(torch_params.size(), model->params().size());
  for (const auto& name : torch_params)
    model->set_param(name, test::h5_read_floats(file, "params/" + name));
  const auto torch_buffers = test::h5_list(file, "buffers_before");
  ASSERT_EQ(torch_buffers.size(), model->buffers().size());
  for (const auto& name : torch_buffers)
    model->set_param(name, test::h5_read_floats(file, "buffers_before/" + name));

  test::DeviceBuffer x(backend.get(), input);
  const Tensor xt = x.t.reshape(Shape{dims[0], dims[1], dims[2], dims[3]});
  const Tensor& logits = model->forward(xt, /*training=*/true);
  std::vector<float> got_logits(ref_logits.size());
  backend->copy(got_logits.data(), Device::kCpu, logits.raw(), logits.device(), logits.nbytes());
  EXPECT_LE(tensor_error(got_logits, ref_logits), 1e-4) << "logits";

  test::DeviceLabels y(backend.get(), labels);
  auto loss_op = backend->softmax_cross_entropy(classes);
  const LossResult loss = loss_op->forward(n, logits.data<float>(), y.data());
  EXPECT_NEAR(loss.loss_sum / n, ref_loss, 1e-4 * std::abs(ref_loss));

  Tensor dlogits = Tensor::empty(Shape{n, classes}, DType::kF32, backend->allocator());
  loss_op->backward(n, y.data(), dlogits.data<float>(), 1.0f / static_cast<float>(n));
  std::vector<int> ready_order;
  model->backward(dlogits, false, [&](int i) { ready_order.push_back(i); });

  for (const auto& name : test::h5_list(file, "grads")) {
    const std::vector<float> ref = test::h5_read_floats(file, "grads/" + name);
    EXPECT_LE(tensor_error(model->get_grad(name), ref), 1e-4) << "gradient of " << name;
  }
  for (const auto& name : test::h5_list(file, "buffers_after")) {
    const std::vector<float> ref = test::h5_read_floats(file, "buffers_after/" + name);
    EXPECT_LE(tensor_error(model->get_param(name), ref), 1e-4) << "buffer " << name;
  }
  // Every gradient reported ready exactly once (the reducer depends on it).
  std::vector<int> seen(model->params().size(), 0);
  for (int i : ready_order) ++seen.at(static_cast<size_t>(i));
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << model->params()[i].name;
}

INSTANTIATE_TEST_SUITE_P(Models, GoldenTest,
                         ::testing::Values(GoldenCase{"lenet", 0}, GoldenCase{"resnet20", 0},
                                           GoldenCase{"lenet", 8}, GoldenCase{"resnet20", 8},
                                           GoldenCase{"resnet20", 16}),
                         [](const auto& info) {
                           const int b = info.param.activation_block;
                           return std::string(info.param.model) +
                                  (b == 0 ? "_Nhwc" : "_Blocked" + std::to_string(b));
                         });

}  // namespace
}  // namespace ddpv
