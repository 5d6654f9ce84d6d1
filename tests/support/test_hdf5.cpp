// Test-side HDF5 readers on the plain C API, independent of src/data's HDF5 code.
#include <hdf5.h>

#include <algorithm>
#include <cmath>

#include "support/test_support.hpp"

namespace ddpv::test {
namespace {

template <typename T>
std::vector<T> read_all(const std::string& file, const std::string& dataset, hid_t mem_type,
                        std::vector<int64_t>* dims) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) throw std::runtime_error("cannot open " + file);
  hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  if (d < 0) {
    H5Fclose(f);
    throw std::runtime_error("no dataset " + dataset + " in " + file);
  }
  hid_t s = H5Dget_space(d);
  const int rank = H5Sget_simple_extent_ndims(s);
  std::vector<hsize_t> h(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(s, h.data(), nullptr);
  size_t n = 1;
  if (dims) dims->clear();
  for (hsize_t x : h) {
    n *= x;
    if (dims) dims->push_back(static_cast<int64_t>(x));
  }
  std::vector<T> out(n);
  const herr_t status = H5Dread(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data());
  H5Sclose(s);
  H5Dclose(d);
  H5Fclose(f);
  if (status < 0) throw std::runtime_error("cannot read " + dataset + " in " + file);
  return out;
}

herr_t collect_name(hid_t, const char* name, const H5L_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->push_back(name);
  return 0;
}

}  // namespace

std::vector<float> h5_read_floats(const std::string& file, const std::string& dataset,
                                  std::vector<int64_t>* dims) {
  return read_all<float>(file, dataset, H5T_NATIVE_FLOAT, dims);
}

std::vector<int32_t> h5_read_ints(const std::string& file, const std::string& dataset) {
  return read_all<int32_t>(file, dataset, H5T_NATIVE_INT32, nullptr);
}

std::vector<std::string> h5_list(const std::string& file, const std::string& group) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  std::vector<std::string> names;
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) throw std::runtime_error("cannot open " + file);
  hid_t g = H5Gopen2(f, group.c_str(), H5P_DEFAULT);
  if (g >= 0) {
    H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_name, &names);
    H5Gclose(g);
  }
  H5Fclose(f);
  return names;
}

GoldenData read_golden(const std::string& model_name) {
  GoldenData g;
  g.file = source_path("tests/golden/" + model_name + ".h5");
  g.input = h5_read_floats(g.file, "input", &g.dims);
  if (g.dims.size() != 4) throw std::runtime_error(g.file + ": input is not (N, H, W, C)");
  g.labels = h5_read_ints(g.file, "labels");
  g.logits = h5_read_floats(g.file, "logits");
  g.loss = h5_read_floats(g.file, "loss")[0];
  g.n = static_cast<int>(g.dims[0]);
  g.classes = static_cast<int>(g.logits.size()) / g.n;
  return g;
}

void load_golden_state(Model& model, const GoldenData& golden) {
  const auto params = h5_list(golden.file, "params");
  ASSERT_EQ(params.size(), model.params().size()) << "parameters of " << model.name();
  for (const auto& name : params)
    model.set_param(name, h5_read_floats(golden.file, "params/" + name));
  const auto buffers = h5_list(golden.file, "buffers_before");
  ASSERT_EQ(buffers.size(), model.buffers().size()) << "buffers of " << model.name();
  for (const auto& name : buffers)
    model.set_param(name, h5_read_floats(golden.file, "buffers_before/" + name));
}

double rms_floor_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double sq = 0;
  for (float v : ref) sq += static_cast<double>(v) * v;
  const double rms = std::sqrt(sq / static_cast<double>(std::max<size_t>(ref.size(), 1)));
  return max_rel_error(got, ref, std::max(rms, 1e-7));
}

double norm_rel_error(const std::vector<float>& got, const std::vector<float>& ref) {
  EXPECT_EQ(got.size(), ref.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    diff += d * d;
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  if (std::isnan(diff)) return INFINITY;
  return std::sqrt(diff / std::max(norm, 1e-300));
}

void expect_bf16_grads_like_pytorch(Model& model, const std::string& golden_file) {
  std::vector<double> ours, torch;
  for (const auto& p : h5_list(golden_file, "grads")) {
    ours.push_back(norm_rel_error(model.get_grad(p), h5_read_floats(golden_file, "grads/" + p)));
    torch.push_back(h5_read_floats(golden_file, "bf16_grad_error/" + p).at(0));
  }
  ASSERT_FALSE(ours.empty());
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto worst = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  EXPECT_LE(median(ours), 1.5 * median(torch)) << "median gradient error, bf16";
  EXPECT_LE(worst(ours), 1.5 * worst(torch)) << "worst gradient error, bf16";
}

}  // namespace ddpv::test
