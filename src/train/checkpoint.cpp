// Checkpoint save: the model's arenas as PyTorch-named HDF5 datasets plus the run's metadata as
// root attributes, built in memory behind a checksummed header (docs/checkpoint-format.md); the
// reader is checkpoint_read.cpp.
#include "ddpv/train/checkpoint.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ddpv/h5/h5.hpp"
#include "train/checkpoint_image.hpp"
#include "train/checkpoint_layout.hpp"
#include "train/durable_file.hpp"

namespace ddpv {
namespace ckpt {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<std::string> batchnorm_prefixes(const Model& model) {
  constexpr const char* kMeanSuffix = ".running_mean";
  std::vector<std::string> out;
  for (const ArenaEntry& e : model.buffers())
    if (ends_with(e.name, kMeanSuffix))
      out.push_back(e.name.substr(0, e.name.size() - std::strlen(kMeanSuffix)));
  return out;
}

// An empty arena (LeNet has no buffers) may have no device memory at all: it is skipped.
HostArenas copy_to_host(Model& model) {
  HostArenas h;
  Backend& b = model.backend();
  h.params.resize(static_cast<size_t>(model.param_count()));
  h.momentum.resize(h.params.size());
  h.buffers.resize(static_cast<size_t>(model.buffer_count()));
  auto to_host = [&](const float* arena, std::vector<float>* host) {
    if (!host->empty())
      b.copy(host->data(), Device::kCpu, arena, b.device(), host->size() * sizeof(float));
  };
  to_host(model.param_data(), &h.params);
  to_host(model.momentum_data(), &h.momentum);
  to_host(model.buffer_data(), &h.buffers);
  b.synchronize();
  h.batches_tracked = model.batches_tracked();
  return h;
}

void copy_to_model(const HostArenas& host, Model& model) {
  Backend& b = model.backend();
  auto to_arena = [&](const std::vector<float>& v, float* arena) {
    if (!v.empty()) b.copy(arena, b.device(), v.data(), Device::kCpu, v.size() * sizeof(float));
  };
  to_arena(host.params, model.param_data());
  to_arena(host.momentum, model.momentum_data());
  to_arena(host.buffers, model.buffer_data());
  b.synchronize();
  model.set_batches_tracked(host.batches_tracked);
}

}  // namespace ckpt

namespace {

using ckpt::batchnorm_prefixes;
using ckpt::kFormat;
using ckpt::kTrackedSuffix;

bool arena_finite(Backend& b, int64_t count, const float* arena) {
  return count == 0 || b.all_finite(count, arena);
}

// Names the first tensor holding NaN or Inf; "" when all are finite.
std::string first_non_finite(const std::vector<ArenaEntry>& entries, const std::vector<float>& v) {
  for (const ArenaEntry& e : entries)
    for (int64_t i = 0; i < e.count; ++i)
      if (!std::isfinite(v[static_cast<size_t>(e.offset + i)])) return e.name;
  return "";
}

void write_meta(hid_t file, const CheckpointMeta& m, int64_t batches_tracked) {
  h5::write_attr_string(file, "format", kFormat);
  h5::write_attr_i64(file, "format_version", kCheckpointFormatVersion);
  h5::write_attr_string(file, "model", m.model);
  h5::write_attr_i64(file, "height", m.height);
  h5::write_attr_i64(file, "width", m.width);
  h5::write_attr_i64(file, "channels", m.channels);
  h5::write_attr_i64(file, "num_classes", m.num_classes);
  h5::write_attr_i64(file, "epoch", m.epoch);
  h5::write_attr_i64(file, "epoch_step", m.epoch_step);
  h5::write_attr_i64(file, "step", m.step);
  h5::write_attr_u64(file, "seed", m.seed);
  h5::write_attr_i64(file, "world_size", m.world_size);
  h5::write_attr_i64(file, "global_batch", m.global_batch);
  h5::write_attr_u64s(file, "rng_state", {m.rng_state.begin(), m.rng_state.end()});
  h5::write_attr_i64(file, "batches_tracked", batches_tracked);
  h5::write_attr_string(file, "options", m.options);
  h5::write_attr_string(file, "data", m.data);
  h5::write_attr_i64(file, "batch_size", m.batch_size);
  h5::write_attr_i64(file, "accum_steps", m.accum_steps);
  h5::write_attr_f64(file, "lr", m.lr);
  h5::write_attr_string(file, "lr_schedule", m.lr_schedule);
  h5::write_attr_f64(file, "warmup_epochs", m.warmup_epochs);
  h5::write_attr_i64(file, "schedule_steps", m.schedule_steps);
}

// Every tensor's name in the file, for the size of the header's table.
std::vector<std::string> tensor_names(const Model& model) {
  std::vector<std::string> out;
  for (const char* g : {"/params/", "/optimizer/"})
    for (const ArenaEntry& e : model.params()) out.push_back(g + e.name);
  for (const ArenaEntry& e : model.buffers()) out.push_back("/buffers/" + e.name);
  for (const std::string& p : batchnorm_prefixes(model))
    out.push_back("/buffers/" + p + kTrackedSuffix);
  return out;
}

// The values of one tensor of an arena in host memory: the arena itself on the CPU backend,
// else a copy in `staging`.
const float* host_values(Backend& b, const float* arena, const ArenaEntry& e,
                         std::vector<float>* staging) {
  if (b.device() == Device::kCpu) return arena + e.offset;
  staging->resize(static_cast<size_t>(e.count));
  b.copy(staging->data(), Device::kCpu, arena + e.offset, b.device(),
         staging->size() * sizeof(float));
  b.synchronize();
  return staging->data();
}

void write_group(ckpt::ImageWriter& w, Backend& b, const char* group,
                 const std::vector<ArenaEntry>& entries, const float* arena) {
  h5::Handle g = h5::create_group(w.file(), group);
  std::vector<float> staging;
  for (const ArenaEntry& e : entries)
    w.add_tensor(g.get(), group, e.name, e.shape.dims(), H5T_IEEE_F32LE, H5T_NATIVE_FLOAT,
                 host_values(b, arena, e, &staging), static_cast<size_t>(e.count) * sizeof(float));
}

// Fills the in-memory file from the model's arenas.
void fill_image(ckpt::ImageWriter& w, Model& model, const CheckpointMeta& m) {
  Backend& b = model.backend();
  int64_t tracked = model.batches_tracked();
  write_meta(w.file(), m, tracked);
  write_group(w, b, "params", model.params(), model.param_data());
  write_group(w, b, "optimizer", model.params(), model.momentum_data());
  write_group(w, b, "buffers", model.buffers(), model.buffer_data());
  h5::Handle g = h5::open_group(w.file(), "buffers");
  for (const std::string& prefix : batchnorm_prefixes(model))
    w.add_tensor(g.get(), "buffers", prefix + kTrackedSuffix, {}, H5T_STD_I64LE, H5T_NATIVE_INT64,
                 &tracked, sizeof(int64_t));
}

}  // namespace

void save_checkpoint(const std::string& path, Model& model, const CheckpointMeta& meta) {
  DDPV_CHECK(meta.model.empty() || meta.model == model.name(), "save_checkpoint: meta.model '",
             meta.model, "' differs from the model '", model.name(), "'");
  // The model describes itself; the caller's copy of these fields cannot disagree with it.
  CheckpointMeta m = meta;
  m.model = model.name();
  m.height = model.input_shape()[0];
  m.width = model.input_shape()[1];
  m.channels = model.input_shape()[2];
  m.num_classes = model.num_classes();

  Backend& b = model.backend();
  // Note [No NaN checkpoints]: a diverged run must never replace a good checkpoint. The device
  // check is one pass per arena; the host scan that names the tensor runs only when it fails.
  const bool finite = arena_finite(b, model.param_count(), model.param_data()) &&
                      arena_finite(b, model.param_count(), model.momentum_data()) &&
                      arena_finite(b, model.buffer_count(), model.buffer_data());
  if (!finite) {
    const ckpt::HostArenas host = ckpt::copy_to_host(model);
    std::string bad = first_non_finite(model.params(), host.params);
    if (bad.empty()) {
      bad = first_non_finite(model.params(), host.momentum);
      bad = bad.empty() ? "buffer " + first_non_finite(model.buffers(), host.buffers)
                        : "momentum of parameter " + bad;
    } else {
      bad = "parameter " + bad;
    }
    DDPV_FAIL("refusing to write checkpoint ", path, ": ", bad,
              " holds NaN or Inf (training diverged; try a lower --lr or longer --warmup-epochs)");
  }
  try {
    const size_t payload =
        static_cast<size_t>(model.param_count() * 2 + model.buffer_count()) * sizeof(float);
    ckpt::ImageWriter w(tensor_names(model), payload + (64 << 10));
    fill_image(w, model, m);
    const ckpt::ImageWriter::View image = w.finish();
    durable::write_file(path, image.data, image.size);
  } catch (const Error& e) {
    const std::string& msg = e.message();
    if (msg.find(path) != std::string::npos) throw;
    DDPV_FAIL("writing checkpoint ", path, " failed: ", msg);
  }
}

}  // namespace ddpv
