// The CUDA backend as a machine sees it: device discovery and --device resolution (these run
// everywhere, GPU or not), and, on a GPU, memory, copies, elementwise ops and the SGD update
// against the CPU backend.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "support/test_support.hpp"

namespace ddpv::test {
namespace {

bool mentions(const Error& e, const std::string& text) {
  return std::string(e.what()).find(text) != std::string::npos;
}

// ---- no GPU needed --------------------------------------------------------------------------

TEST(CudaDiscovery, DeviceCountIsStableAndNeverThrows) {
  int first = -1;
  ASSERT_NO_THROW(first = cuda_device_count());
  EXPECT_GE(first, 0);
  EXPECT_EQ(cuda_device_count(), first);
  if (!cuda_backend_compiled()) {
    EXPECT_EQ(first, 0);
  }
}

TEST(CudaDiscovery, AutoPicksCudaExactlyWhenAGpuIsVisible) {
  const Device expected = cuda_device_count() > 0 ? Device::kCuda : Device::kCpu;
  EXPECT_EQ(resolve_device(DeviceChoice::kAuto), expected);
  EXPECT_EQ(resolve_device(DeviceChoice::kCpu), Device::kCpu);
}

TEST(CudaDiscovery, DeviceCudaWithoutGpuFailsWithAClearMessage) {
  if (cuda_device_count() > 0)
    GTEST_SKIP() << "a GPU is visible: the no-GPU path is not testable here";
  try {
    resolve_device(DeviceChoice::kCuda);
    FAIL() << "resolve_device(kCuda) returned without a GPU";
  } catch (const Error& e) {
    EXPECT_TRUE(mentions(e, "--device cuda")) << e.what();
    EXPECT_TRUE(mentions(e, cuda_backend_compiled() ? "no CUDA device" : "no CUDA backend"))
        << e.what();
  }
  BackendOptions opt;
  opt.device = Device::kCuda;
  EXPECT_THROW(make_backend(opt), Error);
}

// An unknown --device word is refused by the option parser (train_command_line_test).

// The CI build is configured with DDPV_WITH_CUDA=AUTO on machines with the CUDA toolkit: the
// backend is compiled there even though no GPU is present. Reported, not asserted, so that a
// CPU-only build still passes.
TEST(CudaDiscovery, ReportsWhetherTheBackendIsCompiled) {
  std::cout << "[ info ] CUDA backend compiled: " << (cuda_backend_compiled() ? "yes" : "no")
            << ", visible GPUs: " << cuda_device_count() << "\n";
  if (!cuda_backend_compiled()) GTEST_SKIP() << "this build has no CUDA backend";
}

// ---- on a GPU -------------------------------------------------------------------------------

std::unique_ptr<Backend> gpu_or_null(Precision p = Precision::kF32) {
  if (cuda_device_count() == 0) return nullptr;
  BackendOptions opt;
  opt.device = Device::kCuda;
  opt.precision = p;
  return make_backend(opt);
}
#define DDPV_GPU_OR_SKIP(var) \
  auto var = gpu_or_null();   \
  if (!var) GTEST_SKIP() << "no CUDA device visible: GPU case skipped on this machine"

TEST(CudaBackend, NameAllocatorsAndCopies) {
  DDPV_GPU_OR_SKIP(gpu);
  EXPECT_EQ(gpu->device(), Device::kCuda);
  EXPECT_NE(gpu->name().find("cuda"), std::string::npos) << gpu->name();
  EXPECT_NE(gpu->native_stream(), nullptr);
  EXPECT_EQ(gpu->allocator()->device(), Device::kCuda);
  EXPECT_EQ(gpu->staging_allocator()->device(), Device::kCpu);
  EXPECT_THROW(make_backend([] {
                 BackendOptions o;
                 o.device = Device::kCuda;
                 o.device_index = 1 << 20;
                 return o;
               }()),
               Error);

  const std::vector<float> host = random_vector(1000, 7);
  Tensor pinned = Tensor::empty(Shape{1000}, DType::kF32, gpu->staging_allocator());
  std::copy(host.begin(), host.end(), pinned.data<float>());
  DeviceBuffer a(gpu.get(), 1000), b(gpu.get(), 1000);
  EXPECT_EQ(a.to_host(), std::vector<float>(1000, 0.0f));  // fresh device memory is zeroed
  gpu->copy(a.data(), Device::kCuda, pinned.raw(), Device::kCpu, 4000);
  gpu->copy(b.data(), Device::kCuda, a.data(), Device::kCuda, 4000);
  EXPECT_EQ(b.to_host(), host);
}

TEST(CudaBackend, ElementwiseOpsMatchTheCpuBackend) {
  DDPV_GPU_OR_SKIP(gpu);
  auto cpu = backend_or_skip(Device::kCpu);
  const int64_t n = 100103;  // odd: exercises the non-vector tails
  const std::vector<float> a = random_vector(n, 1), b = random_vector(n, 2);
  auto run = [&](Backend* be) {
    DeviceBuffer da(be, a), db(be, b), y(be, n), dx(be, n);
    std::vector<std::vector<float>> out;
    be->add(n, da.data(), db.data(), y.data());
    out.push_back(y.to_host());
    be->relu_forward(n, da.data(), y.data());
    out.push_back(y.to_host());
    be->relu_backward(n, y.data(), db.data(), dx.data());
    out.push_back(dx.to_host());
    be->scale(n, 0.5f, y.data());
    out.push_back(y.to_host());
    be->fill(n, 3.25f, y.data());
    out.push_back(y.to_host());
    // NHWC -> NCHW and back; 7*13*11*100 = 100100 < n
    be->relayout(7, 13, 11, 100, 0, Backend::kNchw, da.data(), y.data());
    out.push_back(y.to_host());
    be->relayout(7, 13, 11, 100, Backend::kNchw, 0, y.data(), dx.data());
    out.push_back(dx.to_host());
    return out;
  };
  const auto want = run(cpu.get()), got = run(gpu.get());
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "result " << i;
}

// Under bf16 the elementwise ops and relayout take bf16 activations: each result is the f32
// arithmetic of naive loops here, rounded once to nearest even.
TEST(CudaBackend, Bf16ElementwiseOpsRoundOnce) {
  auto gpu = gpu_or_null(Precision::kBF16);
  if (!gpu) GTEST_SKIP() << "no CUDA device visible: GPU case skipped on this machine";
  ASSERT_EQ(gpu->activation_dtype(), DType::kBF16);
  const int64_t n = 100103;  // odd: exercises the non-vector tails
  const std::vector<float> a = bf16_values(n, 1), b = bf16_values(n, 2);
  auto rounded = [](float v) { return bf16_to_f32(f32_to_bf16(v)); };
  std::vector<float> sum(n), sum_relu(n), relu(n), mask(n);
  for (int64_t i = 0; i < n; ++i) {
    sum[i] = rounded(a[i] + b[i]);
    sum_relu[i] = a[i] + b[i] > 0.0f ? sum[i] : 0.0f;
    relu[i] = a[i] > 0.0f ? a[i] : 0.0f;
    mask[i] = relu[i] > 0.0f ? b[i] : 0.0f;
  }
  DeviceBuffer da(gpu.get(), a, DType::kBF16), db(gpu.get(), b, DType::kBF16),
      y(gpu.get(), n, DType::kBF16), dx(gpu.get(), n, DType::kBF16);
  gpu->add(n, da.act(), db.act(), y.act());
  EXPECT_EQ(y.to_host(), sum) << "add";
  gpu->add_relu(n, da.act(), db.act(), y.act());
  EXPECT_EQ(y.to_host(), sum_relu) << "add_relu";
  gpu->relu_forward(n, da.act(), y.act());
  EXPECT_EQ(y.to_host(), relu) << "relu";
  gpu->relu_backward(n, y.act(), db.act(), dx.act());
  EXPECT_EQ(dx.to_host(), mask) << "relu backward";

  // Off the 16-byte vectors (one element in): the scalar kernels, the same results.
  auto shifted = [](const DeviceBuffer& d) {
    return MutAct(static_cast<uint16_t*>(d.t.raw()) + 1, DType::kBF16);
  };
  gpu->add(n - 1, shifted(da), shifted(db), shifted(y));
  const std::vector<float> off = y.to_host();
  EXPECT_EQ(std::vector<float>(off.begin() + 1, off.end()),
            std::vector<float>(sum.begin() + 1, sum.end()))
      << "add, unaligned";

  // An f32 operand (the model's input) meets bf16 ones: converted, the same sum.
  DeviceBuffer fa(gpu.get(), a);
  gpu->add(n, fa.data(), db.act(), y.act());
  EXPECT_EQ(y.to_host(), sum) << "add, f32 + bf16";

  // NHWC -> NCHW and back on bf16: 7*13*11*100 = 100100 < n.
  const int bn = 7, h = 13, w = 11, c = 100;
  std::vector<float> nchw(static_cast<size_t>(bn) * h * w * c);
  for (int i = 0; i < bn; ++i)
    for (int p = 0; p < h * w; ++p)
      for (int ch = 0; ch < c; ++ch)
        nchw[(static_cast<size_t>(i) * c + ch) * h * w + p] =
            a[(static_cast<size_t>(i) * h * w + p) * c + ch];
  gpu->relayout(bn, h, w, c, 0, Backend::kNchw, da.act(), y.act());
  std::vector<float> got = y.to_host();
  got.resize(nchw.size());
  EXPECT_EQ(got, nchw) << "NHWC -> NCHW";
  gpu->relayout(bn, h, w, c, Backend::kNchw, 0, y.act(), dx.act());
  got = dx.to_host();
  got.resize(nchw.size());
  EXPECT_EQ(got, std::vector<float>(a.begin(), a.begin() + static_cast<int64_t>(nchw.size())))
      << "NCHW -> NHWC";
}

TEST(CudaBackend, AllFiniteSeesNanAndInf) {
  DDPV_GPU_OR_SKIP(gpu);
  std::vector<float> v = random_vector(5000, 3);
  DeviceBuffer d(gpu.get(), v);
  EXPECT_TRUE(gpu->all_finite(5000, d.data()));
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY}) {
    v[4321] = bad;
    DeviceBuffer e(gpu.get(), v);
    EXPECT_FALSE(gpu->all_finite(5000, e.data())) << bad;
  }
}

TEST(CudaBackend, SgdUpdateMatchesTheCpuBackend) {
  DDPV_GPU_OR_SKIP(gpu);
  auto cpu = backend_or_skip(Device::kCpu);
  const int64_t n = 4099;
  const std::vector<float> p0 = random_vector(n, 4), g = random_vector(n, 5),
                           m0 = random_vector(n, 6);
  // Decayed and non-decayed runs, out of order, tiling the arena.
  const std::vector<ParamSpan> spans = {
      {1000, 3000, true}, {0, 600, true}, {600, 400, false}, {4000, 99, false}};
  for (bool nesterov : {false, true}) {
    SgdConfig cfg;
    cfg.lr = 0.05f;
    cfg.momentum = 0.9f;
    cfg.weight_decay = 1e-2f;
    cfg.nesterov = nesterov;
    cfg.grad_scale = 0.25f;
    // Both compute in fp32; only contraction into FMAs may differ (an ulp of values near 1).
    std::vector<std::vector<float>> res[2];
    int k = 0;
    for (Backend* be : {cpu.get(), gpu.get()}) {
      DeviceBuffer p(be, p0), gr(be, g), m(be, m0);
      for (int step = 0; step < 3; ++step)
        be->sgd_update(cfg, spans, n, p.data(), gr.data(), m.data());
      res[k++] = {p.to_host(), m.to_host()};
    }
    EXPECT_LE(max_rel_error(res[1][0], res[0][0], 1e-2), 1e-4) << "params, nesterov " << nesterov;
    EXPECT_LE(max_rel_error(res[1][1], res[0][1], 1e-2), 1e-4) << "momentum, nesterov " << nesterov;
  }
}

TEST(CudaBackend, SgdWithoutMomentumBufferAndBadSpans) {
  DDPV_GPU_OR_SKIP(gpu);
  auto cpu = backend_or_skip(Device::kCpu);
  const std::vector<float> p0 = random_vector(100, 7), g = random_vector(100, 8);
  SgdConfig cfg;
  cfg.lr = 0.1f;
  cfg.momentum = 0.0f;
  cfg.weight_decay = 0.01f;
  const std::vector<ParamSpan> spans = {{0, 40, true}, {40, 60, false}};
  std::vector<float> res[2];
  int k = 0;
  for (Backend* be : {cpu.get(), gpu.get()}) {
    DeviceBuffer p(be, p0), gr(be, g);
    be->sgd_update(cfg, spans, 100, p.data(), gr.data(), nullptr);
    res[k++] = p.to_host();
  }
  EXPECT_LE(max_rel_error(res[1], res[0], 1e-2), 1e-5);
  DeviceBuffer p(gpu.get(), p0), gr(gpu.get(), g), m(gpu.get(), 100);
  cfg.momentum = 0.9f;
  EXPECT_THROW(gpu->sgd_update(cfg, spans, 100, p.data(), gr.data(), nullptr), Error);
  EXPECT_THROW(gpu->sgd_update(cfg, {{0, 99, true}}, 100, p.data(), gr.data(), m.data()), Error);
  EXPECT_THROW(
      gpu->sgd_update(cfg, {{0, 60, true}, {50, 50, true}}, 100, p.data(), gr.data(), m.data()),
      Error);
}

TEST(CudaBackend, Fp16IsRefusedWithAClearMessage) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible: GPU case skipped";
  BackendOptions opt;
  opt.device = Device::kCuda;
  opt.precision = Precision::kF16;
  try {
    make_backend(opt);
    FAIL() << "fp16 accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(mentions(e, "bf16")) << e.what();
  }
}

}  // namespace
}  // namespace ddpv::test
