// Checkpoint save and load: the model's arenas as PyTorch-named HDF5 datasets plus the run's
// metadata as root attributes (layout in docs/checkpoint-format.md).
#include "ddpv/train/checkpoint.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "data/h5.hpp"
#include "train/durable_file.hpp"

namespace ddpv {
namespace {

constexpr const char* kFormat = "ddpvision-checkpoint";
constexpr const char* kTrackedSuffix = ".num_batches_tracked";
constexpr const char* kMeanSuffix = ".running_mean";

// Host copies of the three arenas, in arena order.
struct HostArenas {
  std::vector<float> params, momentum, buffers;
  int64_t batches_tracked = 0;
};

// Copies between a host vector and an arena; an empty arena (LeNet has no buffers) may have no
// device memory at all, so it is skipped.
void arena_to_host(Backend& b, const float* arena, std::vector<float>* host) {
  if (!host->empty())
    b.copy(host->data(), Device::kCpu, arena, b.device(), host->size() * sizeof(float));
}
void host_to_arena(Backend& b, const std::vector<float>& host, float* arena) {
  if (!host.empty())
    b.copy(arena, b.device(), host.data(), Device::kCpu, host.size() * sizeof(float));
}
bool arena_finite(Backend& b, int64_t count, const float* arena) {
  return count == 0 || b.all_finite(count, arena);
}

HostArenas copy_to_host(Model& model) {
  HostArenas h;
  Backend& b = model.backend();
  h.params.resize(static_cast<size_t>(model.param_count()));
  h.momentum.resize(h.params.size());
  h.buffers.resize(static_cast<size_t>(model.buffer_count()));
  arena_to_host(b, model.param_data(), &h.params);
  arena_to_host(b, model.momentum_data(), &h.momentum);
  arena_to_host(b, model.buffer_data(), &h.buffers);
  b.synchronize();
  h.batches_tracked = model.batches_tracked();
  return h;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "bn1" for "bn1.running_mean": every BatchNorm has exactly one running_mean buffer.
std::vector<std::string> batchnorm_prefixes(const Model& model) {
  std::vector<std::string> out;
  for (const ArenaEntry& e : model.buffers())
    if (ends_with(e.name, kMeanSuffix))
      out.push_back(e.name.substr(0, e.name.size() - std::strlen(kMeanSuffix)));
  return out;
}

// Names the first tensor holding NaN or Inf; "" when all are finite.
std::string first_non_finite(const std::vector<ArenaEntry>& entries, const std::vector<float>& v) {
  for (const ArenaEntry& e : entries)
    for (int64_t i = 0; i < e.count; ++i)
      if (!std::isfinite(v[static_cast<size_t>(e.offset + i)])) return e.name;
  return "";
}

void write_group(hid_t file, const char* group, const std::vector<ArenaEntry>& entries,
                 const std::vector<float>& values) {
  h5::Handle g = h5::create_group(file, group);
  for (const ArenaEntry& e : entries)
    h5::write_f32(g.get(), e.name, e.shape.dims(), values.data() + e.offset);
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
}

// Opens `path` and checks it is a checkpoint this build can read.
h5::Handle open_checkpoint(const std::string& path) {
  std::error_code ec;
  DDPV_CHECK(std::filesystem::is_regular_file(path, ec), "checkpoint ", path,
             " does not exist (check --resume / --checkpoint-dir)");
  DDPV_CHECK(h5::is_hdf5(path), "checkpoint ", path,
             " is not an HDF5 file (truncated or corrupt? use an older checkpoint)");
  h5::Handle f;
  try {
    f = h5::open_file(path);
  } catch (const Error& e) {
    const std::string why = e.message();
    DDPV_FAIL("checkpoint ", path,
              " cannot be read; it is truncated or corrupt (use an older one): ", why);
  }
  DDPV_CHECK(h5::has_attr(f.get(), "format") && h5::read_attr_string(f.get(), "format") == kFormat,
             path, " is not a ddpvision checkpoint (its root attribute format is not '", kFormat,
             "')");
  const int64_t version = h5::read_attr_i64(f.get(), "format_version");
  DDPV_CHECK(version >= 1 && version <= kCheckpointFormatVersion, "checkpoint ", path,
             " has format_version ", version, "; this build reads up to ", kCheckpointFormatVersion,
             " (use a newer ddpvision)");
  return f;
}

CheckpointMeta read_meta(hid_t f) {
  CheckpointMeta m;
  m.model = h5::read_attr_string(f, "model");
  m.height = h5::read_attr_i64(f, "height");
  m.width = h5::read_attr_i64(f, "width");
  m.channels = h5::read_attr_i64(f, "channels");
  m.num_classes = h5::read_attr_i64(f, "num_classes");
  m.epoch = h5::read_attr_i64(f, "epoch");
  m.epoch_step = h5::read_attr_i64(f, "epoch_step");
  m.step = h5::read_attr_i64(f, "step");
  const std::vector<uint64_t> seed = h5::read_attr_u64s(f, "seed");
  DDPV_CHECK(seed.size() == 1, "attribute 'seed' holds ", seed.size(), " values, expected one");
  m.seed = seed[0];
  m.world_size = h5::read_attr_i64(f, "world_size");
  m.global_batch = h5::read_attr_i64(f, "global_batch");
  const std::vector<uint64_t> rng = h5::read_attr_u64s(f, "rng_state");
  DDPV_CHECK(rng.size() == m.rng_state.size(), "attribute 'rng_state' holds ", rng.size(),
             " values, expected ", m.rng_state.size());
  std::copy(rng.begin(), rng.end(), m.rng_state.begin());
  m.options = h5::read_attr_string(f, "options");
  m.data = h5::read_attr_string(f, "data");
  return m;
}

// Reads every entry of `group` into `out` (arena order), checking names and shapes both ways:
// a tensor the model lacks is as wrong as one the file lacks (PyTorch's strict loading).
void read_group(hid_t file, const char* group, const std::vector<ArenaEntry>& entries,
                std::vector<float>* out, const std::string& skip_suffix = "") {
  DDPV_CHECK(h5::is_group(file, group), "group /", group, " is missing");
  h5::Handle g = h5::open_group(file, group);
  size_t stored = 0;
  for (const std::string& name : h5::child_names(g.get()))
    if (skip_suffix.empty() || !ends_with(name, skip_suffix)) ++stored;
  for (const ArenaEntry& e : entries) {
    DDPV_CHECK(h5::is_dataset(g.get(), e.name), "tensor /", group, "/", e.name,
               " is missing (the checkpoint was written by a different model?)");
    std::vector<int64_t> dims;
    std::vector<float> v = h5::read_f32(g.get(), e.name, &dims);
    DDPV_CHECK(Shape(dims) == e.shape, "tensor /", group, "/", e.name, " has shape ",
               Shape(dims).str(), " but the model expects ", e.shape.str());
    std::copy(v.begin(), v.end(), out->begin() + e.offset);
  }
  if (stored != entries.size()) {
    for (const std::string& name : h5::child_names(g.get())) {
      bool known = !skip_suffix.empty() && ends_with(name, skip_suffix);
      for (const ArenaEntry& e : entries) known = known || e.name == name;
      DDPV_CHECK(known, "tensor /", group, "/", name, " is not part of the model");
    }
  }
}

// Reads num_batches_tracked: every BatchNorm stores the same count (see Model::batches_tracked);
// a model without BatchNorm keeps it in the root attribute only.
int64_t read_batches_tracked(hid_t file, const Model& model) {
  int64_t tracked =
      h5::has_attr(file, "batches_tracked") ? h5::read_attr_i64(file, "batches_tracked") : 0;
  h5::Handle g = h5::open_group(file, "buffers");
  bool first = true;
  for (const std::string& prefix : batchnorm_prefixes(model)) {
    const std::string name = prefix + kTrackedSuffix;
    DDPV_CHECK(h5::is_dataset(g.get(), name), "tensor /buffers/", name, " is missing");
    std::vector<int64_t> dims;
    const std::vector<int64_t> v = h5::read_i64(g.get(), name, &dims);
    DDPV_CHECK(v.size() == 1, "tensor /buffers/", name, " holds ", v.size(),
               " values, expected one");
    if (first) tracked = v[0];
    first = false;
  }
  return tracked;
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
  HostArenas host = copy_to_host(model);
  if (!finite) {
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

  const std::string tmp = path + ".tmp";
  try {
    h5::Handle f = h5::create_file(tmp);
    write_meta(f.get(), m, host.batches_tracked);
    write_group(f.get(), "params", model.params(), host.params);
    write_group(f.get(), "optimizer", model.params(), host.momentum);
    write_group(f.get(), "buffers", model.buffers(), host.buffers);
    {
      h5::Handle g = h5::open_group(f.get(), "buffers");
      for (const std::string& prefix : batchnorm_prefixes(model))
        h5::write_i64(g.get(), prefix + kTrackedSuffix, {}, &host.batches_tracked);
    }
    DDPV_HDF5_CHECK(H5Fflush(f.get(), H5F_SCOPE_GLOBAL), "flushing ", tmp, " failed");
    f.close(tmp);
    durable::commit(tmp, path);
  } catch (const Error& e) {
    durable::remove_quietly(tmp);
    const std::string& msg = e.message();
    if (msg.find(path) != std::string::npos) throw;
    DDPV_FAIL("writing checkpoint ", path, " failed: ", msg);
  } catch (...) {
    durable::remove_quietly(tmp);
    throw;
  }
}

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  try {
    h5::Handle f = open_checkpoint(path);
    return read_meta(f.get());
  } catch (const Error& e) {
    if (e.message().find(path) != std::string::npos) throw;
    DDPV_FAIL("checkpoint ", path, ": ", e.message());
  }
}

CheckpointMeta load_checkpoint(const std::string& path, Model& model) {
  CheckpointMeta meta;
  HostArenas host;
  host.params.resize(static_cast<size_t>(model.param_count()));
  host.momentum.resize(host.params.size());
  host.buffers.resize(static_cast<size_t>(model.buffer_count()));
  try {
    h5::Handle f = open_checkpoint(path);
    meta = read_meta(f.get());
    DDPV_CHECK(meta.model == model.name(), "it holds model '", meta.model,
               "' but this run builds '", model.name(), "' (pass --model ", meta.model,
               " or another checkpoint)");
    const Shape stored{meta.height, meta.width, meta.channels};
    DDPV_CHECK(stored == model.input_shape() && meta.num_classes == model.num_classes(),
               "it was trained on inputs ", stored.str(), " with ", meta.num_classes,
               " classes, but this model takes ", model.input_shape().str(), " with ",
               model.num_classes(), " classes (use the same --data)");
    read_group(f.get(), "params", model.params(), &host.params);
    read_group(f.get(), "optimizer", model.params(), &host.momentum);
    read_group(f.get(), "buffers", model.buffers(), &host.buffers, kTrackedSuffix);
    host.batches_tracked = read_batches_tracked(f.get(), model);
  } catch (const Error& e) {
    if (e.message().find(path) != std::string::npos) throw;
    DDPV_FAIL("checkpoint ", path, ": ", e.message());
  }
  // Everything was read and checked before the model is touched: a bad file changes nothing.
  Backend& b = model.backend();
  host_to_arena(b, host.params, model.param_data());
  host_to_arena(b, host.momentum, model.momentum_data());
  host_to_arena(b, host.buffers, model.buffer_data());
  b.synchronize();
  model.set_batches_tracked(host.batches_tracked);
  return meta;
}

}  // namespace ddpv
