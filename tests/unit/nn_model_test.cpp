// Model graph: arena layout in reverse layer order, decay spans, PyTorch names and counts,
// bad-input errors, gradient accumulation, and a small end-to-end learning check.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <set>

#include "ddpv/core/rng.hpp"
#include "ddpv/nn/layer_profile.hpp"
#include "ddpv/nn/model.hpp"
#include "model_check.hpp"
#include "support/test_support.hpp"

namespace ddpv {
namespace {

using test::cpu;
using test::loss_gradient;

// Note [Aligned entries]: each entry starts where the previous one's padding to 64 bytes ends.
TEST(ModelTest, ArenaIsReverseLayerOrderContiguousAndAligned) {
  auto be = cpu();
  auto m = make_model("lenet", *be, Shape{28, 28, 1}, 10);
  std::vector<std::string> names;
  int64_t offset = 0;
  for (const auto& e : m->params()) {
    names.push_back(e.name);
    EXPECT_EQ(e.offset, offset) << e.name;
    EXPECT_EQ(e.count, e.shape.numel());
    EXPECT_EQ(e.extent % 16, 0) << e.name;
    EXPECT_GE(e.extent, e.count) << e.name;
    EXPECT_LT(e.extent, e.count + 16) << e.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(m->param_data() + e.offset) % 64, 0u) << e.name;
    offset += e.extent;
  }
  EXPECT_EQ(offset, m->param_count());
  // fc2.bias (10 floats) comes first: everything after it is padded 6 floats on.
  EXPECT_EQ(m->params()[1].offset, 16);
  const std::vector<std::string> expected{"fc2.bias",   "fc2.weight",  "fc1.bias",
                                          "fc1.weight", "conv2.bias",  "conv2.weight",
                                          "conv1.bias", "conv1.weight"};
  EXPECT_EQ(names, expected);
  // conv 32 -> pool -> conv 64 -> pool -> fc 128 -> fc 10, counted by hand.
  EXPECT_EQ(m->num_parameters(),
            (32 * 25 + 32) + (64 * 32 * 25 + 64) + (3136 * 128 + 128) + (128 * 10 + 10));
  EXPECT_EQ(m->params().back().shape, Shape({32, 1, 5, 5}));  // OIHW, as torch
}

TEST(ModelTest, ResNetCountsAndDecaySpans) {
  auto be = cpu();
  // He et al.: resnet20 has 0.27M parameters with parameter-free shortcuts; the two 1x1
  // projections (option B) add 16*32 + 32*64 weights and their BatchNorms 2*(32+64).
  auto m = make_model("resnet20", *be, Shape{32, 32, 3}, 10);
  int64_t projections = 16 * 32 + 32 * 64 + 2 * (32 + 64);
  EXPECT_NEAR(static_cast<double>(m->num_parameters() - projections), 0.27e6, 0.01e6);
  std::set<std::string> names;
  for (const auto& e : m->params()) {
    names.insert(e.name);
    const bool is_bn_or_bias = e.name.find("bn") != std::string::npos ||
                               e.name.find("downsample.1") != std::string::npos ||
                               e.name.ends_with(".bias");
    EXPECT_EQ(e.decay, !is_bn_or_bias) << e.name;
  }
  EXPECT_TRUE(names.count("layer2.0.downsample.0.weight"));
  EXPECT_TRUE(names.count("layer3.2.conv2.weight"));
  EXPECT_EQ(m->buffers().size(), 2u * (1 + 9 * 2 + 2));  // 21 BatchNorms
  // Spans cover the arena once, alternate decay, and agree with the entries.
  int64_t covered = 0;
  const auto spans = m->decay_spans();
  for (size_t i = 0; i < spans.size(); ++i) {
    EXPECT_EQ(spans[i].offset, covered);
    covered += spans[i].count;
    if (i > 0) {
      EXPECT_NE(spans[i].decay, spans[i - 1].decay);
    }
  }
  EXPECT_EQ(covered, m->param_count());
}

TEST(ModelTest, WrongInputShapeNamesLayerAndShapes) {
  auto be = cpu();
  auto m = make_model("lenet", *be, Shape{28, 28, 1}, 10);
  Tensor x = Tensor::empty(Shape{2, 32, 32, 3}, DType::kF32);
  try {
    m->forward(x, true);
    FAIL() << "no error for a wrong input shape";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("conv1"), std::string::npos) << what;
    EXPECT_NE(what.find("(N, 28, 28, 1)"), std::string::npos) << what;
    EXPECT_NE(what.find("(2, 32, 32, 3)"), std::string::npos) << what;
  }
  EXPECT_THROW(make_model("lenet", *be, Shape{2, 2, 1}, 10), Error);  // pool2 does not fit
  EXPECT_THROW(make_model("vgg", *be, Shape{28, 28, 1}, 10), Error);
  EXPECT_THROW(m->set_param("conv1.weight", std::vector<float>(3)), Error);
  EXPECT_THROW(m->get_param("conv9.weight"), Error);
}

// Accumulating the gradients of two half batches gives the gradient of the whole batch (each
// loss is a sum here, so no scaling is involved). lenet: BatchNorm would make the halves'
// statistics differ from the whole batch's.
TEST(ModelTest, AccumulateAddsGradients) {
  auto be = cpu();
  auto m = make_model("lenet", *be, Shape{8, 8, 3}, 4);
  m->init_parameters(3);
  const int n = 4;
  auto xs = test::random_vector(n * 8 * 8 * 3, 5);
  std::vector<int32_t> ys{0, 1, 2, 3};
  auto loss = be->softmax_cross_entropy(4);
  Tensor dl = Tensor::empty(Shape{n, 4}, DType::kF32);
  auto run = [&](int begin, int count, bool accumulate) {
    Tensor x = Tensor::wrap(xs.data() + begin * 192, Shape{count, 8, 8, 3}, DType::kF32);
    const Tensor& logits = m->forward(x, true);
    Tensor d = dl.slice(0, count);
    loss->forward(count, logits.data<float>(), ys.data() + begin);
    loss->backward(count, ys.data() + begin, d.data<float>(), 1.0f);
    m->backward(d, accumulate);
  };
  run(0, n, false);
  const auto full = m->get_grad("conv2.weight");
  run(0, 2, false);
  run(2, 2, true);
  const auto acc = m->get_grad("conv2.weight");
  // Errors relative to the largest entry: conv2 runs as Winograd (Note [Winograd convolution]),
  // whose rounding follows the magnitude of a whole tile, not of each entry. Overwriting
  // instead of adding would miss by about half the largest entry.
  EXPECT_LE(test::error_of_largest(acc, full), 1e-5);
}

// Note [Fused ReLU]: on the CPU lenet's two convolutions (single-channel and Winograd) apply
// the ReLUs that follow them, and the model's output and gradients stay those of separate
// layers: the same model on oneDNN's direct kernels, which fuse nothing, agrees to rounding.
TEST(ModelTest, LenetFusesItsConvolutionsReluPairs) {
  auto fused_be = cpu();
  BackendOptions o;
  o.threads = 1;
  o.conv_algorithm = ConvAlgorithm::kDirect;
  auto plain_be = make_backend(o);
  auto fused = make_model("lenet", *fused_be, Shape{28, 28, 1}, 10);
  auto plain = make_model("lenet", *plain_be, Shape{28, 28, 1}, 10);
  const std::string summary = fused->summary();
  // Note [Max pooling fused into the convolution]: conv1 also computes pool1, conv2 pool2.
  EXPECT_NE(summary.find("(single-channel winograd F(4x4,5x5), + relu, + maxpool)"),
            std::string::npos)
      << summary;
  EXPECT_NE(summary.find("(winograd F(4x4,5x5), + relu, + maxpool)"), std::string::npos) << summary;
  EXPECT_EQ(plain->summary().find(", + relu"), std::string::npos) << plain->summary();
  // Note [ReLU folded into max pooling]: both poolings apply their ReLU's backward, in both.
  for (const std::string& s : {summary, plain->summary()}) {
    EXPECT_NE(s.find("pool1: maxpool (+ relu backward)"), std::string::npos) << s;
    EXPECT_NE(s.find("pool2: maxpool (+ relu backward)"), std::string::npos) << s;
  }
  fused->init_parameters(4);
  plain->init_parameters(4);
  const int n = 3;
  auto xs = test::random_vector(n * 28 * 28, 6);
  std::vector<int32_t> ys{1, 7, 3};
  auto grads = [&](Backend& be, Model& m) {
    Tensor x = Tensor::wrap(xs.data(), Shape{n, 28, 28, 1}, DType::kF32);
    m.backward(loss_gradient(be, m.forward(x, true), ys), false);
    return std::vector<float>(m.grad_data(), m.grad_data() + m.param_count());
  };
  const auto a = grads(*fused_be, *fused), b = grads(*plain_be, *plain);
  EXPECT_LE(test::error_of_largest(a, b), 1e-4);
}

// Note [BatchNorm + ReLU]: on the CPU the stem's BatchNorm applies the ReLU after it (the
// golden tests check the gradients of the whole model against PyTorch's).
TEST(ModelTest, Resnet20FusesBatchNormReluPairs) {
  auto be = cpu();
  auto m = make_model("resnet20", *be, Shape{32, 32, 3}, 10);
  const std::string summary = m->summary();
  EXPECT_NE(summary.find("bn1: batchnorm (+ relu)"), std::string::npos) << summary;
  // Note [Input gradient added]: the seven blocks with an identity shortcut, not the two
  // with a projection.
  for (const char* block :
       {"layer1.0", "layer1.1", "layer1.2", "layer2.1", "layer2.2", "layer3.1", "layer3.2"}) {
    const std::string b = block;
    EXPECT_NE(summary.find(b + ": basic block (" + b + ".conv1 adds the shortcut's gradient)"),
              std::string::npos)
        << summary;
  }
  for (const char* block : {"layer2.0", "layer3.0"}) {
    EXPECT_NE(summary.find(std::string(block) + ": basic block (projection shortcut)"),
              std::string::npos)
        << summary;
  }
  // Note [Batch statistics from the convolution]: the BatchNorms after Winograd convolutions,
  // not those after oneDNN's (the stem, the strided and the 1x1 ones); those last in a block
  // also add the shortcut (Note [BatchNorm + residual]).
  for (const char* bn : {"layer1.0.bn1: batchnorm (+ relu, statistics from the convolution)",
                         "layer1.0.bn2: batchnorm (statistics from the convolution, + shortcut + "
                         "relu)",
                         "layer2.0.bn2: batchnorm (statistics from the convolution, + shortcut + "
                         "relu)",
                         "bn1: batchnorm (+ relu),", "layer2.0.bn1: batchnorm (+ relu),",
                         "layer2.0.downsample.1: batchnorm,"}) {
    EXPECT_NE(summary.find(bn), std::string::npos) << bn << "\n" << summary;
  }
}

// docs/architecture.md, "Layer fusion": with every fusion on (the default) and with
// BackendOptions::fuse_layers off, the same model on the same convolution algorithms gives the
// same training logits, parameter gradients, batch statistics and evaluation logits, to
// rounding. The unfused summary names no fusion.
TEST(ModelTest, FusedLayersComputeWhatSeparateLayersCompute) {
  struct Case {
    const char* model;
    Shape input;
  };
  for (const Case& cs : {Case{"lenet", Shape{28, 28, 1}}, Case{"resnet20", Shape{32, 32, 3}}}) {
    SCOPED_TRACE(cs.model);
    BackendOptions o;
    o.threads = 1;
    auto fused_be = make_backend(o);
    o.fuse_layers = false;
    auto plain_be = make_backend(o);
    auto fused = make_model(cs.model, *fused_be, cs.input, 10);
    auto plain = make_model(cs.model, *plain_be, cs.input, 10);
    EXPECT_NE(fused->summary().find("+ relu"), std::string::npos) << fused->summary();
    EXPECT_EQ(plain->summary().find("+ relu"), std::string::npos) << plain->summary();
    EXPECT_EQ(plain->summary().find("+ maxpool"), std::string::npos) << plain->summary();
    EXPECT_EQ(plain->summary().find("adds the shortcut's gradient"), std::string::npos)
        << plain->summary();
    EXPECT_EQ(plain->summary().find("statistics from the convolution"), std::string::npos)
        << plain->summary();
    EXPECT_EQ(plain->summary().find("+ shortcut"), std::string::npos) << plain->summary();
    fused->init_parameters(8);
    plain->init_parameters(8);
    const int n = 4;
    auto xs = test::random_vector(static_cast<size_t>(n * cs.input.numel()), 9);
    std::vector<int32_t> ys{1, 7, 3, 0};
    struct Out {
      std::vector<float> logits, grads, buffers, eval;
    };
    auto run = [&](Backend& be, Model& m) {
      Tensor x =
          Tensor::wrap(xs.data(), Shape{n, cs.input[0], cs.input[1], cs.input[2]}, DType::kF32);
      Out out;
      const Tensor& logits = m.forward(x, true);
      out.logits.assign(logits.data<float>(), logits.data<float>() + n * 10);
      m.backward(loss_gradient(be, logits, ys), false);
      out.grads.assign(m.grad_data(), m.grad_data() + m.param_count());
      out.buffers.assign(m.buffer_data(), m.buffer_data() + m.buffer_count());
      const Tensor& e = m.forward(x, false);
      out.eval.assign(e.data<float>(), e.data<float>() + n * 10);
      return out;
    };
    const Out a = run(*fused_be, *fused), b = run(*plain_be, *plain);
    // The fused BatchNorms take their statistics from sums in double (Note [Batch statistics
    // from the convolution]), oneDNN from two passes in float: logits agree to 1e-5. A ReLU
    // input that the two roundings put on either side of 0 masks one gradient element in one
    // path and not in the other, which moves every gradient before it by about a hundredth of
    // its largest (resnet20 on AVX2, one flip in layer2.1: 0.0093). Each block's own rounding
    // is checked tightly in FusedBlockOp.ComputesWhatThePlainOpsComputeOneByOne; here a wiring
    // error (a lost or doubled shortcut gradient, a stale scratch) moves gradients by their
    // own size. lenet has no BatchNorm: its two paths agree to 1e-5.
    EXPECT_LE(test::error_of_largest(a.logits, b.logits), 1e-5) << "logits";
    EXPECT_LE(test::error_of_largest(a.grads, b.grads),
              cs.model == std::string("lenet") ? 1e-5 : 5e-2)
        << "gradients";
    EXPECT_LE(test::error_of_largest(a.buffers, b.buffers), 1e-6) << "buffers";
    EXPECT_LE(test::error_of_largest(a.eval, b.eval), 1e-5) << "eval logits";
  }
}

// Note [Tuning options]: the backend follows its options alone (no environment variable
// turns a fusion or a convolution algorithm on or off behind them), and its name lists the
// options that are not the default.
TEST(ModelTest, TuningComesFromTheOptionsAndShowsInTheName) {
  BackendOptions o;
  o.threads = 1;
  ::setenv("DDPV_CPU_FUSE", "off", 1);  // read by earlier versions; no longer
  ::setenv("DDPV_CPU_CONV", "direct", 1);
  ::setenv("DDPV_CPU_LAYOUT", "nhwc", 1);
  // A 3x3 convolution + BatchNorm + ReLU, which the fusing backend takes as one block.
  FusedBlockConfig chain;
  chain.conv.in_channels = chain.conv.out_channels = chain.bn.channels = 16;
  chain.conv.in_h = chain.conv.in_w = chain.bn.h = chain.bn.w = 8;
  chain.conv.kernel = 3;
  chain.conv.padding = 1;
  chain.conv.bias = false;
  chain.batch_norm = chain.relu = true;
  const auto fast = make_backend(o);
  EXPECT_NE(fast->fused_block(chain), nullptr);
  EXPECT_TRUE(fast->activation_block() == 8 || fast->activation_block() == 16) << fast->name();
  EXPECT_EQ(fast->name().find("no fusion"), std::string::npos) << fast->name();
  EXPECT_EQ(fast->name().find("conv "), std::string::npos) << fast->name();
  ::unsetenv("DDPV_CPU_FUSE");
  ::unsetenv("DDPV_CPU_CONV");
  ::unsetenv("DDPV_CPU_LAYOUT");
  o.fuse_layers = false;
  o.conv_algorithm = ConvAlgorithm::kDirect;
  o.activation_block = 0;
  const auto plain = make_backend(o);
  EXPECT_EQ(plain->fused_block(chain), nullptr);
  EXPECT_EQ(plain->activation_block(), 0);
  for (const char* shown : {"no fusion", "conv direct", "nhwc activations"})
    EXPECT_NE(plain->name().find(shown), std::string::npos) << shown << ": " << plain->name();
}

// A single process learns a small separable problem: lenet on images whose class is the
// position of a bright square reaches > 95% training accuracy within a few hundred steps.
TEST(ModelTest, LenetLearnsSeparableProblem) {
  auto be = cpu();
  const int classes = 4, n = 32, hw = 16;
  auto m = make_model("lenet", *be, Shape{hw, hw, 1}, classes);
  m->init_parameters(11);
  auto loss = be->softmax_cross_entropy(classes);
  Tensor x = Tensor::empty(Shape{n, hw, hw, 1}, DType::kF32);
  Tensor y = Tensor::empty(Shape{n}, DType::kI32);
  Tensor dl = Tensor::empty(Shape{n, classes}, DType::kF32);
  SgdConfig sgd;
  sgd.lr = 0.05f;
  const auto spans = m->decay_spans();
  Rng rng(42);
  double acc = 0;
  for (int step = 0; step < 300 && acc <= 0.97; ++step) {
    float* px = x.data<float>();
    for (int i = 0; i < n; ++i) {
      const int c = static_cast<int>(rng.uniform_int(classes));
      y.data<int32_t>()[i] = c;
      for (int p = 0; p < hw * hw; ++p) px[i * hw * hw + p] = 0.2f * rng.normal();
      const int oy = (c / 2) * 8 + 2, ox = (c % 2) * 8 + 2;
      for (int dy = 0; dy < 4; ++dy)
        for (int dx = 0; dx < 4; ++dx) px[i * hw * hw + (oy + dy) * hw + ox + dx] += 1.0f;
    }
    const Tensor& logits = m->forward(x, true);
    const LossResult r = loss->forward(n, logits.data<float>(), y.data<int32_t>());
    acc = 0.9 * acc + 0.1 * static_cast<double>(r.correct) / n;
    loss->backward(n, y.data<int32_t>(), dl.data<float>(), 1.0f / n);
    m->backward(dl, false);
    be->sgd_update(sgd, spans, m->param_count(), m->param_data(), m->grad_data(),
                   m->momentum_data());
  }
  EXPECT_GT(acc, 0.95);
  // The padding between entries stayed zero in every arena (Note [Aligned entries]).
  int64_t padding = 0;
  for (const auto& e : m->params()) {
    for (int64_t i = e.offset + e.count; i < e.offset + e.extent; ++i, ++padding) {
      ASSERT_EQ(m->param_data()[i], 0.0f) << "after " << e.name;
      ASSERT_EQ(m->grad_data()[i], 0.0f) << "after " << e.name;
      ASSERT_EQ(m->momentum_data()[i], 0.0f) << "after " << e.name;
    }
  }
  EXPECT_GT(padding, 0);
}

// Note [Layer profile]: with profiling on, every layer of resnet20 run unfused (each BatchNorm,
// ReLU and residual addition on its own) is timed in forward and backward, and the times
// account for the steps' wall time measured around them; with profiling off nothing is timed.
TEST(ModelTest, LayerProfileTimesEveryLayer) {
  BackendOptions o;
  o.threads = 1;
  o.fuse_layers = false;
  auto be = make_backend(o);
  auto m = make_model("resnet20", *be, Shape{32, 32, 3}, 10);
  m->init_parameters(5);
  const int n = 8;
  auto xs = test::random_vector(size_t(n) * 32 * 32 * 3, 6);
  const Tensor x = Tensor::wrap(xs.data(), Shape{n, 32, 32, 3}, DType::kF32);
  Tensor d = Tensor::empty(Shape{n, 10}, DType::kF32);
  std::fill(d.data<float>(), d.data<float>() + n * 10, 0.01f);
  auto step = [&] {
    m->forward(x, true);
    m->backward(d, false);
  };
  LayerProfile profile;
  be->set_profile(&profile);
  profile.reset();
  step();  // profiling off: nothing is recorded
  profile.add_step();
  EXPECT_NE(profile.report().find("no step was timed"), std::string::npos) << profile.report();

  // A profile that is enabled but not the backend's records nothing either: there is no
  // process-wide one.
  LayerProfile other;
  other.enable(true);
  be->set_profile(nullptr);
  step();
  other.add_step();
  EXPECT_NE(other.report().find("no step was timed"), std::string::npos) << other.report();
  be->set_profile(&profile);

  profile.reset();
  profile.enable(true);
  const int steps = 3;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) {
    step();
    profile.add_step();
  }
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
      steps;
  profile.enable(false);
  const std::string report = profile.report();
  profile.reset();

  // A row per layer: the stem, every BatchNorm and ReLU of the blocks, the projections, the
  // residual additions and the classifier.
  for (const char* layer :
       {"conv1 ", "bn1 ", "relu ", "layer1.0.conv1 ", "layer1.0.bn2 ", "layer1.0.relu1 ",
        "layer1.0.add ", "layer2.0.downsample.0 ", "layer3.2.add ", "avgpool ", "fc "})
    EXPECT_NE(report.find(std::string("  ") + layer), std::string::npos) << layer << "\n" << report;
  EXPECT_EQ(report.find("  layer1.0 "), std::string::npos) << "a block is not a row of its own";
  // "... 3 steps, T ms per step timed": T is positive and no more than the wall time (the
  // scopes lie inside it). How much of the wall time they cover depends on the machine's load,
  // so no lower bound is asserted.
  const size_t at = report.find("steps, ");
  ASSERT_NE(at, std::string::npos) << report;
  const double timed_ms = std::atof(report.c_str() + at + 7);
  EXPECT_NE(report.find("3 steps"), std::string::npos) << report;
  EXPECT_LE(timed_ms, wall_ms * 1.01) << report;
  EXPECT_GT(timed_ms, 0) << report;
}

}  // namespace
}  // namespace ddpv
