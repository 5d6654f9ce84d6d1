// The fused SGD update against a naive loop that follows torch.optim.SGD step by step (momentum
// buffer created from the first gradient, Nesterov, weight decay only in decayed spans).
#include <string>

#include "op_check.hpp"

namespace ddpv::test {
namespace {

// torch.optim.SGD.step (dampening 0) for one parameter element, in double; `buf` starts empty.
struct TorchSgdRef {
  std::vector<double> p, buf;
  std::vector<bool> has_buf;

  void step(const SgdConfig& c, const std::vector<ParamSpan>& spans, const std::vector<float>& g) {
    for (const ParamSpan& s : spans)
      for (int64_t i = s.offset; i < s.offset + s.count; ++i) {
        double d_p = static_cast<double>(g[i]) * c.grad_scale;
        if (s.decay && c.weight_decay != 0) d_p += c.weight_decay * p[i];
        if (c.momentum != 0) {
          if (!has_buf[i]) {
            buf[i] = d_p;  // buf = torch.clone(d_p).detach()
            has_buf[i] = true;
          } else {
            buf[i] = c.momentum * buf[i] + d_p;
          }
          d_p = c.nesterov ? d_p + c.momentum * buf[i] : buf[i];
        }
        p[i] -= c.lr * d_p;
      }
  }
};

SgdConfig config(float lr, float momentum, float wd, bool nesterov, float grad_scale) {
  SgdConfig c;
  c.lr = lr;
  c.momentum = momentum;
  c.weight_decay = wd;
  c.nesterov = nesterov;
  c.grad_scale = grad_scale;
  return c;
}

class SgdOpTest : public ::testing::TestWithParam<Device> {};

TEST_P(SgdOpTest, MatchesTorchSgdOverSeveralSteps) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  struct Case {
    const char* name;
    SgdConfig cfg;
    bool with_buffer;
  };
  const Case cases[] = {
      {"momentum + weight decay", config(0.1f, 0.9f, 0.05f, false, 0.5f), true},
      {"nesterov + weight decay", config(0.05f, 0.9f, 0.01f, true, 0.25f), true},
      {"plain, no buffer", config(0.2f, 0.0f, 0.1f, false, 1.0f), false},
      {"momentum, no decay", config(0.1f, 0.8f, 0.0f, false, 1.0f), true},
  };
  // Decayed and undecayed runs (BatchNorm and bias parameters are not decayed), in an order
  // other than the arena's, with one run long enough to be split across threads.
  const std::vector<ParamSpan> spans{
      {103, 197, true}, {0, 100, true}, {100, 3, false}, {300, 1, false}, {301, 70000, true}};
  const int64_t count = 70301;
  const size_t nc = static_cast<size_t>(count);
  for (const Case& cs : cases) {
    SCOPED_TRACE(cs.name);
    const auto p0 = random_vector(nc, 11);
    TorchSgdRef ref{to_double(p0), std::vector<double>(nc), std::vector<bool>(nc, false)};
    DeviceBuffer p(backend.get(), p0), m(backend.get(), nc);  // zero momentum buffer
    for (int step = 0; step < 5; ++step) {
      const auto g = random_vector(nc, 20 + step, -2.0f, 2.0f);
      DeviceBuffer g_(backend.get(), g);
      backend->sgd_update(cs.cfg, spans, count, p.data(), g_.data(),
                          cs.with_buffer ? m.data() : nullptr);
      ref.step(cs.cfg, spans, g);
    }
    EXPECT_TRUE(all_close(p.to_host(), ref.p, 1e-5, 1e-6)) << "parameters";
    if (cs.with_buffer) {
      EXPECT_TRUE(all_close(m.to_host(), ref.buf, 1e-5, 1e-6)) << "momentum buffer";
    }
  }
}

TEST_P(SgdOpTest, SeveralThreadsGiveTheSameResults) {
  DDPV_BACKEND_OR_SKIP(one, GetParam());
  auto two = backend_or_skip(GetParam(), 2);
  ASSERT_TRUE(two);
  const int64_t count = 200000;
  const size_t nc = static_cast<size_t>(count);
  const std::vector<ParamSpan> spans{{0, 150000, true}, {150000, 50000, false}};
  const SgdConfig c = config(0.1f, 0.9f, 1e-3f, true, 0.5f);
  std::vector<std::vector<float>> params;
  for (Backend* b : {one.get(), two.get()}) {
    DeviceBuffer p(b, random_vector(nc, 1)), m(b, nc);
    for (int step = 0; step < 3; ++step) {
      DeviceBuffer g(b, random_vector(nc, 2 + step));
      b->sgd_update(c, spans, count, p.data(), g.data(), m.data());
    }
    params.push_back(p.to_host());
  }
  EXPECT_TRUE(all_close(params[1], to_double(params[0]), 0, 0));
}

TEST_P(SgdOpTest, RejectsSpansThatDoNotCoverTheArena) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  DeviceBuffer p(backend.get(), 10), g(backend.get(), 10), m(backend.get(), 10);
  const SgdConfig c = config(0.1f, 0.9f, 0.0f, false, 1.0f);
  const std::vector<std::vector<ParamSpan>> bad{
      {{0, 9, true}},                 // a parameter left out
      {{0, 6, true}, {5, 6, false}},  // past the end
      {{-1, 11, true}},               // before the start
  };
  for (const auto& spans : bad)
    EXPECT_THROW(backend->sgd_update(c, spans, 10, p.data(), g.data(), m.data()), Error);
  EXPECT_THROW(backend->sgd_update(c, {{0, 10, true}}, 10, p.data(), g.data(), nullptr), Error)
      << "momentum without a buffer";
}

// sgd_update_sum (Note [Shared update]) on a part of the arena, with the gradient summed from
// one, two (the loop of its own) and three arenas: the part matches the reference fed with the
// summed gradient, and nothing outside the part moves. Then the order of its sums.
TEST_P(SgdOpTest, SummedUpdateMatchesTorchSgdOnTheSumAndLeavesTheRestAlone) {
  DDPV_BACKEND_OR_SKIP(backend, GetParam());
  const int64_t count = 70301;
  const size_t nc = static_cast<size_t>(count);
  // The part [96, 70016): a slice of a rank, cut through a decayed run at both ends.
  const std::vector<ParamSpan> spans{{96, 4, true}, {100, 3, false}, {103, 69913, true}};
  const SgdConfig c = config(0.1f, 0.9f, 0.05f, true, 0.5f);
  if (backend->device() != Device::kCpu) {
    DeviceBuffer p(backend.get(), nc), g(backend.get(), nc), m(backend.get(), nc);
    EXPECT_THROW(backend->sgd_update_sum(c, spans, count, p.data(), {g.data()}, m.data()), Error);
    return;
  }
  for (int sources : {1, 2, 3}) {
    SCOPED_TRACE(std::to_string(sources) + " gradient arenas");
    const auto p0 = random_vector(nc, 31);
    TorchSgdRef ref{to_double(p0), std::vector<double>(nc), std::vector<bool>(nc, false)};
    std::vector<float> p = p0, m(nc, 0.0f);
    for (int step = 0; step < 4; ++step) {
      std::vector<std::vector<float>> g;
      std::vector<const float*> arenas;
      for (int k = 0; k < sources; ++k) {
        g.push_back(random_vector(nc, 100 * step + k, -2.0f, 2.0f));
        arenas.push_back(g.back().data());
      }
      std::vector<float> sum(nc, 0.0f);
      for (size_t i = 0; i < nc; ++i)
        for (int k = 0; k < sources; ++k) sum[i] += g[static_cast<size_t>(k)][i];
      backend->sgd_update_sum(c, spans, count, p.data(), arenas, m.data());
      ref.step(c, spans, sum);
    }
    for (size_t i : {size_t{0}, size_t{95}, size_t{70016}, nc - 1}) {
      EXPECT_EQ(p[i], p0[i]) << "parameter " << i << " lies outside the spans";
      EXPECT_EQ(m[i], 0.0f) << "momentum " << i << " lies outside the spans";
    }
    EXPECT_TRUE(all_close(std::vector<float>(p.begin() + 96, p.begin() + 70016),
                          std::vector<double>(ref.p.begin() + 96, ref.p.begin() + 70016), 1e-5,
                          1e-6))
        << "parameters";
    EXPECT_TRUE(all_close(std::vector<float>(m.begin() + 96, m.begin() + 70016),
                          std::vector<double>(ref.buf.begin() + 96, ref.buf.begin() + 70016), 1e-5,
                          1e-6))
        << "momentum buffer";
  }
  // The order of the sum (pairwise_sum): four and six arenas give, bit for bit, sgd_update fed
  // with the gradient summed by hand in that order.
  for (int sources : {4, 6}) {
    SCOPED_TRACE(std::to_string(sources) + " gradient arenas, the order of the sum");
    std::vector<std::vector<float>> g;
    std::vector<const float*> arenas;
    for (int k = 0; k < sources; ++k) {
      g.push_back(random_vector(nc, 500 + k, -2.0f, 2.0f));
      arenas.push_back(g.back().data());
    }
    std::vector<float> sum(nc);
    for (size_t i = 0; i < nc; ++i) {
      sum[i] = (g[0][i] + g[1][i]) + (g[2][i] + g[3][i]);
      if (sources == 6) sum[i] += g[4][i] + g[5][i];
    }
    const std::vector<ParamSpan> all{{0, 100, true}, {100, count - 100, false}};
    std::vector<float> p1 = random_vector(nc, 41), m1(nc, 0.5f), p2 = p1, m2 = m1;
    backend->sgd_update_sum(c, all, count, p1.data(), arenas, m1.data());
    backend->sgd_update(c, all, count, p2.data(), sum.data(), m2.data());
    EXPECT_EQ(p1, p2) << "parameters";
    EXPECT_EQ(m1, m2) << "momentum";
  }
  std::vector<float> p(nc), g(nc), m(nc);
  EXPECT_THROW(
      backend->sgd_update_sum(c, {{70000, 302, true}}, count, p.data(), {g.data()}, m.data()),
      Error)
      << "a span past the end";
  EXPECT_THROW(backend->sgd_update_sum(c, spans, count, p.data(), {}, m.data()), Error)
      << "no gradient arena";
}

INSTANTIATE_TEST_SUITE_P(Devices, SgdOpTest, ::testing::ValuesIn(test_devices()),
                         device_param_name);

// pairwise_sum by hand: one arena is itself, three are (g0 + g1) + g2, none sum to 0 (the
// stack's first slot was read uninitialised there before).
TEST(PairwiseSum, OneThreeAndNoArenas) {
  const float a[] = {1.5f}, b[] = {1e8f}, c[] = {-1e8f};
  const float* one[] = {a};
  const float* three[] = {b, c, a};
  EXPECT_EQ(pairwise_sum(one, 1, 0), 1.5f);
  EXPECT_EQ(pairwise_sum(three, 3, 0), 1.5f);  // left to right as ((b + c) + a), not b + (c + a)
  EXPECT_EQ(pairwise_sum(nullptr, 0, 0), 0.0f);
}

}  // namespace
}  // namespace ddpv::test
