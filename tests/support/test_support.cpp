// Shared test helpers (see test_support.hpp).
#include "support/test_support.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>

#include "ddpv/core/dtype.hpp"

namespace ddpv::test {

std::vector<float> random_vector(size_t n, uint64_t seed, float lo, float hi) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

std::vector<float> bf16_values(size_t n, uint64_t seed, float lo, float hi) {
  std::vector<float> v = random_vector(n, seed, lo, hi);
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}

double max_rel_error(const float* a, const float* b, size_t n, double floor) {
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    const double denom = std::max(std::abs(static_cast<double>(b[i])), floor);
    const double err = std::abs(static_cast<double>(a[i]) - b[i]) / denom;
    if (std::isnan(err)) return INFINITY;
    worst = std::max(worst, err);
  }
  return worst;
}

std::vector<double> numeric_gradient(const std::function<double()>& f, std::vector<float>& x,
                                     const std::vector<size_t>& indices, double eps) {
  std::vector<size_t> idx = indices;
  if (idx.empty())
    for (size_t i = 0; i < x.size(); ++i) idx.push_back(i);
  std::vector<double> g;
  g.reserve(idx.size());
  for (size_t i : idx) {
    const float saved = x[i];
    x[i] = static_cast<float>(saved + eps);
    const double fp = f();
    x[i] = static_cast<float>(saved - eps);
    const double fm = f();
    x[i] = saved;
    g.push_back((fp - fm) / (2 * eps));
  }
  return g;
}

std::vector<size_t> sample_indices(size_t n, size_t k) {
  std::vector<size_t> out;
  if (n == 0) return out;
  if (k >= n) {
    for (size_t i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  for (size_t j = 0; j < k; ++j) out.push_back(j * (n - 1) / (k - 1));
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "ddpv-test-XXXXXX").string();
  char* p = mkdtemp(tmpl.data());
  if (p == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = p;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::vector<Device> test_devices() {
  std::vector<Device> d{Device::kCpu};
  if (cuda_backend_compiled()) d.push_back(Device::kCuda);
  return d;
}

std::string device_param_name(const ::testing::TestParamInfo<Device>& info) {
  return device_name(info.param);
}

std::unique_ptr<Backend> backend_or_skip(Device device, int threads) {
  if (device == Device::kCuda && cuda_device_count() == 0) return nullptr;
  BackendOptions opt;
  opt.device = device;
  opt.threads = threads;
  return make_backend(opt);
}

DeviceBuffer::DeviceBuffer(Backend* b, const std::vector<float>& host, DType dtype) : backend(b) {
  DDPV_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, "DeviceBuffer: f32 or bf16 only");
  t = Tensor::empty(Shape{static_cast<int64_t>(host.size())}, dtype, b->allocator());
  if (dtype == DType::kBF16) {
    const std::vector<uint16_t> bits = to_bf16(host);
    b->copy(t.raw(), b->device(), bits.data(), Device::kCpu, t.nbytes());
  } else {
    b->copy(t.raw(), b->device(), host.data(), Device::kCpu, t.nbytes());
  }
}

DeviceBuffer::DeviceBuffer(Backend* b, size_t n, DType dtype)
    : DeviceBuffer(b, std::vector<float>(n, 0.0f), dtype) {}

std::vector<float> DeviceBuffer::to_host() const { return host_floats(*backend, t); }

DeviceLabels::DeviceLabels(Backend* b, const std::vector<int32_t>& host) {
  t = Tensor::empty(Shape{static_cast<int64_t>(host.size())}, DType::kI32, b->allocator());
  b->copy(t.raw(), b->device(), host.data(), Device::kCpu, host.size() * sizeof(int32_t));
}

std::vector<float> host_floats(Backend& backend, const Tensor& t) {
  std::vector<float> h(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::kBF16) {
    std::vector<uint16_t> bits(h.size());
    backend.copy(bits.data(), Device::kCpu, t.raw(), backend.device(), t.nbytes());
    backend.synchronize();
    for (size_t i = 0; i < h.size(); ++i) h[i] = bf16_to_f32(bits[i]);
    return h;
  }
  backend.copy(h.data(), Device::kCpu, t.raw(), backend.device(), h.size() * sizeof(float));
  backend.synchronize();
  return h;
}

std::string source_path(const std::string& relative) {
  // The environment first: a test binary carried to another machine (the device check) finds
  // the source tree where that machine has it; the build's path is the fallback.
  const char* dir = std::getenv("DDPV_SOURCE_DIR");
  return std::string(dir != nullptr && *dir != '\0' ? dir : DDPV_SOURCE_DIR) + "/" + relative;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace ddpv::test
