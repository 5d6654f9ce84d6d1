// Conv2dOp against a naive double-precision loop and finite differences, on every device.
#include <string>

#include "conv_ref.hpp"
#include "op_check.hpp"

namespace ddpv::test {
namespace {

// Stride 1 and 2, padding 0 to 2, kernels 1, 3 and 5, with and without bias, odd sizes, one
// input channel.
const ConvCase kCases[] = {
    {2, 3, 4, 7, 5, 3, 1, 1, true},    {2, 2, 3, 6, 7, 3, 2, 1, false},
    {3, 3, 2, 5, 7, 1, 1, 0, true},    {1, 4, 3, 9, 8, 5, 2, 0, false},
    {2, 2, 5, 7, 7, 5, 1, 1, true},    {2, 3, 4, 8, 9, 3, 2, 0, true},
    {1, 5, 3, 5, 5, 1, 2, 1, false},   {2, 8, 16, 6, 6, 3, 1, 1, true},
    {2, 1, 32, 28, 28, 5, 1, 2, true},  // lenet's conv1: one input channel
};

class ConvOpTest : public ::testing::TestWithParam<Device> {};

TEST_P(ConvOpTest, MatchesNaiveLoopAndFiniteDifferences) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  uint64_t seed = 100;
  for (const ConvCase& cc : kCases) {
    SCOPED_TRACE(cc.str());
    const Conv2dConfig c = cc.config();
    const int n = cc.n;
    const size_t nx = static_cast<size_t>(n) * c.in_h * c.in_w * c.in_channels;
    const size_t ny = static_cast<size_t>(n) * c.out_h() * c.out_w() * c.out_channels;
    const size_t nw = static_cast<size_t>(c.out_channels) * c.in_channels * c.kernel * c.kernel;
    std::vector<float> x = random_vector(nx, ++seed), w = random_vector(nw, ++seed, -0.5f, 0.5f),
                       b = random_vector(c.out_channels, ++seed), r = random_vector(ny, ++seed);
    auto op = backend->conv2d(c);
    DeviceBuffer dx_(backend.get(), x), dw_(backend.get(), w), db_(backend.get(), b),
        dy_(backend.get(), r), y_(backend.get(), ny), gx(backend.get(), nx), gw(backend.get(), nw),
        gb(backend.get(), static_cast<size_t>(c.out_channels));
    const float* bias = c.bias ? db_.data() : nullptr;

    op->forward(n, dx_.data(), dw_.data(), bias, y_.data());
    EXPECT_TRUE(all_close(y_.to_host(), conv_forward_ref(c, n, x, w, b), 1e-5, 1e-5));

    // Backward with dy = r is the gradient of L = sum(y * r).
    op->backward(n, dx_.data(), dw_.data(), dy_.data(), gx.data(), gw.data(),
                 c.bias ? gb.data() : nullptr, false);
    const ConvGrads ref = conv_backward_ref(c, n, x, w, r);
    const std::vector<float> gx_h = gx.to_host(), gw_h = gw.to_host(), gb_h = gb.to_host();
    EXPECT_TRUE(all_close(gx_h, ref.dx, 1e-5, 1e-5)) << "dx";
    EXPECT_TRUE(all_close(gw_h, ref.dw, 1e-5, 1e-5)) << "dw";
    if (c.bias) {
      EXPECT_TRUE(all_close(gb_h, ref.db, 1e-5, 1e-5)) << "db";
    }

    auto loss = [&] {
      upload(dx_, x);
      upload(dw_, w);
      upload(db_, b);
      op->forward(n, dx_.data(), dw_.data(), bias, y_.data());
      return dot(y_.to_host(), r);
    };
    const auto ix = sample_indices(nx, 12), iw = sample_indices(nw, 12);
    EXPECT_TRUE(all_close(pick(gx_h, ix), numeric_gradient(loss, x, ix), 2e-3, 2e-3)) << "dx FD";
    EXPECT_TRUE(all_close(pick(gw_h, iw), numeric_gradient(loss, w, iw), 2e-3, 2e-3)) << "dw FD";
    if (c.bias) {
      const auto ib = sample_indices(b.size(), 4);
      EXPECT_TRUE(all_close(pick(gb_h, ib), numeric_gradient(loss, b, ib), 2e-3, 2e-3)) << "db FD";
    }
  }
}

// Note [Blocked activations]: the CPU backend's convolutions in every pair of layouts a network
// meets (blocked -> blocked, an unblockable stem into blocks, with stride 2 and with a bias at
// stride 1 (Note [First convolution from NCHW]), and the reverse: Note [Mixed activation
// layouts]) against the naive NHWC loops, through the test's own layout changes.
// These are oneDNN's direct kernels (kAuto would send the 16 -> 16 case to Winograd, whose
// rounding op_conv_winograd_test bounds).
TEST(ConvOpBlocked, EveryLayoutPairMatchesTheNaiveLoop) {
  BackendOptions o;
  o.threads = 1;
  o.conv_algorithm = ConvAlgorithm::kDirect;
  auto backend = make_backend(o);
  uint64_t seed = 500;
  for (int block : {8, 16}) {
    for (ConvCase cc :
         {ConvCase{2, 16, 16, 6, 5, 3, 1, 1, false}, ConvCase{2, 3, 16, 7, 7, 3, 2, 1, false},
          ConvCase{2, 3, 32, 8, 9, 3, 1, 1, true}, ConvCase{1, 16, 3, 5, 6, 1, 1, 0, true},
          ConvCase{2, 8, 16, 6, 6, 3, 2, 1, true}}) {
      Conv2dConfig c = cc.config();
      c.in_block = block_for(c.in_channels, block);
      c.out_block = block_for(c.out_channels, block);
      SCOPED_TRACE(cc.str() + " blocks " + std::to_string(c.in_block) + " -> " +
                   std::to_string(c.out_block));
      ConvProblem p(backend.get(), c, cc.n, seed);
      auto op = backend->conv2d(c);
      p.forward(*op);
      EXPECT_TRUE(all_close(p.y(), p.y_ref(), 1e-5, 1e-5));
      p.backward(*op, true, false);
      const ConvGrads ref = p.grads_ref();
      EXPECT_TRUE(all_close(p.dx(), ref.dx, 1e-5, 1e-5)) << "dx";
      EXPECT_TRUE(all_close(p.gw.to_host(), ref.dw, 1e-5, 1e-5)) << "dw";
      if (c.bias) {
        EXPECT_TRUE(all_close(p.gb.to_host(), ref.db, 1e-5, 1e-5)) << "db";
      }
    }
  }
}

TEST_P(ConvOpTest, AccumulateAddsAndOverwriteIgnoresOldValues) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  const ConvCase cc{3, 4, 8, 7, 6, 3, 2, 1, true};
  const Conv2dConfig c = cc.config();
  const size_t nx = 3ul * 7 * 6 * 4, ny = 3ul * c.out_h() * c.out_w() * 8, nw = 8ul * 4 * 9;
  const auto x = random_vector(nx, 1), w = random_vector(nw, 2), dy = random_vector(ny, 3);
  const auto old_w = random_vector(nw, 4), old_b = random_vector(8, 5);
  DeviceBuffer x_(backend.get(), x), w_(backend.get(), w), dy_(backend.get(), dy),
      gw(backend.get(), old_w), gb(backend.get(), old_b), gx(backend.get(), nx);
  auto op = backend->conv2d(c);
  const ConvGrads ref = conv_backward_ref(c, 3, x, w, dy);

  op->backward(3, x_.data(), w_.data(), dy_.data(), nullptr, gw.data(), gb.data(), true);
  std::vector<double> want_w(nw), want_b(8);
  for (size_t i = 0; i < nw; ++i) want_w[i] = old_w[i] + ref.dw[i];
  for (size_t i = 0; i < 8; ++i) want_b[i] = old_b[i] + ref.db[i];
  EXPECT_TRUE(all_close(gw.to_host(), want_w, 1e-5, 1e-5)) << "dw accumulated";
  EXPECT_TRUE(all_close(gb.to_host(), want_b, 1e-5, 1e-5)) << "db accumulated";

  // Overwriting, into buffers full of junk, gives the plain gradient.
  upload(gw, std::vector<float>(nw, 1e30f));
  upload(gb, std::vector<float>(8, 1e30f));
  upload(gx, std::vector<float>(nx, 1e30f));
  op->backward(3, x_.data(), w_.data(), dy_.data(), gx.data(), gw.data(), gb.data(), false);
  EXPECT_TRUE(all_close(gw.to_host(), ref.dw, 1e-5, 1e-5)) << "dw overwritten";
  EXPECT_TRUE(all_close(gb.to_host(), ref.db, 1e-5, 1e-5)) << "db overwritten";
  EXPECT_TRUE(all_close(gx.to_host(), ref.dx, 1e-5, 1e-5)) << "dx overwritten";
}

TEST_P(ConvOpTest, OneOpServesSeveralBatchSizes) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  const Conv2dConfig c = ConvCase{0, 3, 5, 6, 6, 3, 1, 1, true}.config();
  auto op = backend->conv2d(c);
  const auto w = random_vector(5ul * 3 * 9, 7), b = random_vector(5, 8);
  DeviceBuffer w_(backend.get(), w), b_(backend.get(), b);
  for (int n : {4, 1, 4, 3}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const auto x = random_vector(static_cast<size_t>(n) * 6 * 6 * 3, 9 + n);
    DeviceBuffer x_(backend.get(), x), y_(backend.get(), static_cast<size_t>(n) * 6 * 6 * 5);
    op->forward(n, x_.data(), w_.data(), b_.data(), y_.data());
    EXPECT_TRUE(all_close(y_.to_host(), conv_forward_ref(c, n, x, w, b), 1e-5, 1e-5));
  }
}

TEST_P(ConvOpTest, RejectsBadConfigurations) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  const Conv2dConfig good = ConvCase{0, 3, 4, 8, 8, 3, 1, 1, false}.config();
  auto with = [&](auto change) {
    Conv2dConfig c = good;
    change(c);
    return c;
  };
  const Conv2dConfig bad[] = {
      with([](Conv2dConfig& c) { c.in_channels = 0; }),
      with([](Conv2dConfig& c) { c.out_channels = -2; }),
      with([](Conv2dConfig& c) { c.kernel = 0; }),
      with([](Conv2dConfig& c) { c.stride = 0; }),
      with([](Conv2dConfig& c) { c.padding = -1; }),
      with([](Conv2dConfig& c) { c.in_h = 0; }),
      with([](Conv2dConfig& c) { c.kernel = 11; }),  // output size would be <= 0
      with([](Conv2dConfig& c) {                     // (2 - 3) / 2 + 1 = 1 in C++: still bad
        c.in_h = c.in_w = 2;
        c.kernel = 3;
        c.stride = 2;
        c.padding = 0;
      }),
  };
  for (const Conv2dConfig& c : bad) {
    try {
      backend->conv2d(c);
      ADD_FAILURE() << "accepted kernel=" << c.kernel << " stride=" << c.stride;
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("conv2d"), std::string::npos) << e.what();
    }
  }
  auto op = backend->conv2d(good);
  EXPECT_THROW(op->forward(0, nullptr, nullptr, nullptr, nullptr), Error);
}

INSTANTIATE_TEST_SUITE_P(Devices, ConvOpTest, ::testing::ValuesIn(test_devices()),
                         device_param_name);

}  // namespace
}  // namespace ddpv::test