// Shared test helpers: random data, error measures, a finite-difference gradient checker,
// temporary directories, and the list of devices a test body runs on.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "ddpv/backend/backend.hpp"
#include "ddpv/nn/model.hpp"

namespace ddpv::test {

// Uniform values in [lo, hi) from a fixed seed.
std::vector<float> random_vector(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f);
// The same, each value rounded to bf16 (so bf16 holds them exactly); and f32 values as bf16 bits.
std::vector<float> bf16_values(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f);
std::vector<uint16_t> to_bf16(const std::vector<float>& v);

// max_i |a_i - b_i| / max(|b_i|, floor): relative error with an absolute floor for values near 0.
double max_rel_error(const float* a, const float* b, size_t n, double floor = 1e-3);
inline double max_rel_error(const std::vector<float>& a, const std::vector<float>& b,
                            double floor = 1e-3) {
  EXPECT_EQ(a.size(), b.size());
  return max_rel_error(a.data(), b.data(), std::min(a.size(), b.size()), floor);
}

// Central finite differences of a scalar function f over the entries of x, in double:
// returns df/dx_i for i in `indices` (all when empty). f reads x, which is perturbed in place.
std::vector<double> numeric_gradient(const std::function<double()>& f, std::vector<float>& x,
                                     const std::vector<size_t>& indices, double eps = 1e-2);

// Up to k indices spread over [0, n), always including 0 and n - 1.
std::vector<size_t> sample_indices(size_t n, size_t k);

// A fresh directory under the system temp dir, removed when the object goes.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// The devices compiled in and present; a test body parameterised over Device runs on each,
// and a GPU case skips visibly (GTEST_SKIP) when no GPU is present.
std::vector<Device> test_devices();
std::string device_param_name(const ::testing::TestParamInfo<Device>& info);
// Skips the current test when `device` is not usable here; returns a backend otherwise.
std::unique_ptr<Backend> backend_or_skip(Device device, int threads = 1);

// Device <-> host helpers, so one test body serves both devices.
// A buffer of the backend's memory, f32 or (an activation, Note [Activation dtype]) bf16.
struct DeviceBuffer {
  Backend* backend = nullptr;
  Tensor t;
  // bf16: each value rounded to nearest even on the way in.
  DeviceBuffer(Backend* b, const std::vector<float>& host, DType dtype = DType::kF32);
  DeviceBuffer(Backend* b, size_t n, DType dtype = DType::kF32);  // zero-filled
  float* data() { return t.data<float>(); }                       // f32 only
  MutAct act() const { return mact(t); }                          // a view in the buffer's dtype
  std::vector<float> to_host() const;                             // as floats, whatever the dtype
};
struct DeviceLabels {
  Tensor t;
  DeviceLabels(Backend* b, const std::vector<int32_t>& host);
  const int32_t* data() const { return t.data<int32_t>(); }
};

// Path of a file in the source tree, e.g. source_path("tests/golden/lenet.h5"): under
// $DDPV_SOURCE_DIR when that is set (ctest sets it; so does the device check), else under
// the tree the test was built from.
std::string source_path(const std::string& relative);

// A whole file as bytes, and a file made of `bytes` (replacing what was there).
std::string read_bytes(const std::string& path);
void write_bytes(const std::string& path, const std::string& bytes);

}  // namespace ddpv::test

// Declares `var` as a backend for `device`, or skips the test visibly when no GPU is present.
#define DDPV_BACKEND_OR_SKIP(var, device)           \
  auto var = ::ddpv::test::backend_or_skip(device); \
  if (!var) GTEST_SKIP() << "no CUDA device visible: GPU case skipped on this machine"

namespace ddpv::test {
// Reads a whole dataset of an HDF5 file as float / int32 (converted by HDF5), with its dims.
// Written directly on the HDF5 C API, independent of the project's own HDF5 code.
std::vector<float> h5_read_floats(const std::string& file, const std::string& dataset,
                                  std::vector<int64_t>* dims = nullptr);
std::vector<int32_t> h5_read_ints(const std::string& file, const std::string& dataset);
// Names of the members of a group ("params" -> {"conv1.weight", ...}).
std::vector<std::string> h5_list(const std::string& file, const std::string& group);

// A golden case of tests/golden/make_golden.py: one training-mode forward and backward of a
// model in float64 PyTorch, from a seed whose every ReLU input is at least 1e-5 from zero
// (Note [ReLU margin] there: a ReLU that float32 error can flip moves the gradients before it
// by far more than any tolerance, so cases without that margin cannot compare two correct
// float32 implementations).
struct GoldenData {
  std::string file;
  std::vector<float> input;   // (N, H, W, C)
  std::vector<int64_t> dims;  // N, H, W, C
  std::vector<int32_t> labels;
  std::vector<float> logits;
  float loss = 0;  // mean over the batch
  int n = 0, classes = 0;
};
GoldenData read_golden(const std::string& model_name);  // tests/golden/<model_name>.h5
// Sets every parameter and buffer of `model` to the case's; fails the test when the names
// differ from torch's state_dict.
void load_golden_state(Model& model, const GoldenData& golden);

// Error against a (float64) reference: relative, with an absolute floor at the tensor's
// root-mean-square magnitude. An entry far below the tensor's typical size is a sum of
// cancelling products and carries float32 rounding of the size of its terms, not of its
// result, so it is judged on the tensor's scale.
double rms_floor_error(const std::vector<float>& got, const std::vector<float>& ref);
// ||got - ref|| / ||ref||: the relative error of a tensor as a whole (what reduced precision
// is judged by, where single entries near a flipped ReLU may move by their own size).
double norm_rel_error(const std::vector<float>& got, const std::vector<float>& ref);

// Note [bf16 reference] (tests/golden/make_golden.py): bf16 moves these tiny-batch gradients
// by 10-50% of their norm, PyTorch's as much as ours, so bf16 gradients are held to PyTorch's
// own bf16 error on the same case (bf16_grad_error/ in the golden file): the median and the
// worst over the model's tensors within 1.5 times PyTorch's. A bf16 path that lost precision
// anywhere else (a value through bf16 twice, a wrong rounding) lands far above.
void expect_bf16_grads_like_pytorch(Model& model, const std::string& golden_file);

// A tensor of the backend's memory as host floats, whatever its dtype (f32 or bf16
// activations, Note [Activation dtype]).
std::vector<float> host_floats(Backend& backend, const Tensor& t);

// The message of the ddpv::Error thrown by f, or "" when none is thrown.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}
}  // namespace ddpv::test
