// Checkpoint load: the file read once, verified before libhdf5 parses it, then opened from
// memory and checked against the model (docs/checkpoint-format.md, "Reading").
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "ddpv/h5/h5.hpp"
#include "ddpv/core/crc32c.hpp"
#include "ddpv/train/checkpoint.hpp"
#include "train/checkpoint_image.hpp"
#include "train/checkpoint_layout.hpp"

namespace ddpv {
namespace {

using ckpt::batchnorm_prefixes;
using ckpt::ends_with;
using ckpt::kFormat;
using ckpt::kTrackedSuffix;

[[noreturn]] void damaged(const std::string& name, const std::string& what) {
  throw CheckpointDamaged("checkpoint " + name + " " + what, __FILE__, __LINE__);
}

// A checkpoint's verified bytes, open in libhdf5. In a file without a header (format 1, or
// rewritten by h5py) libhdf5 is the first to read most bytes, so every failure to read it is
// damage; in a verified file it is a mismatch the user must hear about as such.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size, const std::string& name)
      : name_(name), verified_(ckpt::verify_bytes(data, size, name)) {
    reading([&] { file_ = std::make_unique<ckpt::ImageFile>(data, size, name); });
    const hid_t f = file_->get();
    // An HDF5 file without our format attribute (an image store passed by mistake) is the
    // user's error, not damage.
    bool ours = false;
    reading([&] {
      ours = h5::has_attr(f, "format") && h5::read_attr_string(f, "format") == kFormat;
      if (ours) version_ = h5::read_attr_i64(f, "format_version");
    });
    DDPV_CHECK(ours, name, " is not a ddpvision checkpoint (its root attribute format is not '",
               kFormat, "')");
    DDPV_CHECK(version_ >= 1 && version_ <= kCheckpointFormatVersion, "checkpoint ", name,
               " has format_version ", version_, "; this build reads up to ",
               kCheckpointFormatVersion, " (use a newer ddpvision)");
  }
  hid_t file() const { return file_->get(); }
  bool has_header() const { return verified_.has_header; }

  // Runs f, turning its ddpv::Error into damage (no header) or an error naming the file.
  template <typename F>
  void reading(F&& f) const {
    try {
      f();
    } catch (const CheckpointDamaged&) {
      throw;
    } catch (const Error& e) {
      if (!verified_.has_header)
        damaged(name_, "cannot be read; it is truncated or corrupt: " + e.message());
      if (e.message().find(name_) != std::string::npos) throw;
      DDPV_FAIL("checkpoint ", name_, ": ", e.message());
    }
  }

  // Without a header, a tensor with a crc32c attribute must match it (`values` as stored,
  // little-endian); the ones without are counted for the warning.
  void check_tensor(hid_t dataset, const std::string& path, const void* values, size_t bytes) {
    if (verified_.has_header) return;
    ++tensors_;
    uint32_t want = 0;
    if (!ckpt::read_crc_attr(dataset, &want)) return;
    ++checked_;
    if (crc32c(values, bytes) != want)
      damaged(name_, "is damaged: tensor " + path + " fails its crc32c attribute");
  }
  std::string unverified() const {
    if (verified_.has_header) return "";
    if (tensors_ > 0 && checked_ == tensors_) return "";
    if (checked_ == 0)
      return "it has no checksums (format_version " + std::to_string(version_) +
             ", or rewritten without its header)";
    return std::to_string(tensors_ - checked_) + " of its " + std::to_string(tensors_) +
           " tensors have no crc32c attribute";
  }

 private:
  std::string name_;
  ckpt::Verified verified_;
  std::unique_ptr<ckpt::ImageFile> file_;
  int64_t version_ = 0;
  int64_t tensors_ = 0, checked_ = 0;
};

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
  // Format 2 additions; a format 1 file leaves them 0 (Note [Resume checks]).
  if (h5::has_attr(f, "accum_steps")) {
    m.batch_size = h5::read_attr_i64(f, "batch_size");
    m.accum_steps = h5::read_attr_i64(f, "accum_steps");
    m.lr = h5::read_attr_f64(f, "lr");
    m.lr_schedule = h5::read_attr_string(f, "lr_schedule");
    m.warmup_epochs = h5::read_attr_f64(f, "warmup_epochs");
    m.schedule_steps = h5::read_attr_i64(f, "schedule_steps");
  }
  return m;
}

// A tensor's stored type, before libhdf5 converts from it: floats of 2, 4 or 8 bytes (counts:
// integers up to 8). libhdf5 sizes its conversion buffer by the stored element, so a damaged
// type claiming gigabytes per element made a 15 KiB file take 15 GB (found by the checkpoint
// fuzz target).
void check_stored_type(hid_t ds, const std::string& what, bool count) {
  const h5::TypeInfo t = h5::type_info(h5::dataset_type(ds).get());
  const bool ok = count ? t.cls == H5T_INTEGER && t.size <= 8
                        : t.cls == H5T_FLOAT && (t.size == 2 || t.size == 4 || t.size == 8);
  DDPV_CHECK(ok, what, " is stored as ", t.str(), ", expected ", count ? "an integer" : "float32");
}

// Checks the names and shapes of `group` against the model's both ways, reading no values: a
// tensor the model lacks is as wrong as one the file lacks (PyTorch's strict loading).
void check_group(Reader& r, const char* group, const std::vector<ArenaEntry>& entries,
                 const std::string& skip_suffix = "") {
  const hid_t file = r.file();
  DDPV_CHECK(h5::is_group(file, group), "group /", group, " is missing");
  h5::Handle g = h5::open_group(file, group);
  size_t stored = 0;
  for (const std::string& name : h5::child_names(g.get()))
    if (skip_suffix.empty() || !ends_with(name, skip_suffix)) ++stored;
  for (const ArenaEntry& e : entries) {
    DDPV_CHECK(h5::is_dataset(g.get(), e.name), "tensor /", group, "/", e.name,
               " is missing (the checkpoint was written by a different model?)");
    h5::Handle ds = h5::open_dataset(g.get(), e.name);
    check_stored_type(ds.get(), std::string("tensor /") + group + "/" + e.name, false);
    const std::vector<int64_t> dims = h5::dataset_dims(ds.get());
    DDPV_CHECK(Shape(dims) == e.shape, "tensor /", group, "/", e.name, " has shape ",
               Shape(dims).str(), " but the model expects ", e.shape.str());
  }
  if (stored != entries.size()) {
    for (const std::string& name : h5::child_names(g.get())) {
      bool known = !skip_suffix.empty() && ends_with(name, skip_suffix);
      for (const ArenaEntry& e : entries) known = known || e.name == name;
      DDPV_CHECK(known, "tensor /", group, "/", name, " is not part of the model");
    }
  }
}

// Reads the values of every entry of `group` into `out` (arena order; checked by check_group).
void read_group(Reader& r, const char* group, const std::vector<ArenaEntry>& entries, float* out) {
  h5::Handle g = h5::open_group(r.file(), group);
  for (const ArenaEntry& e : entries) {
    h5::Handle ds = h5::open_dataset(g.get(), e.name);
    float* dst = out + e.offset;
    DDPV_HDF5_CHECK(H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst),
                    "cannot read tensor /", group, "/", e.name);
    r.check_tensor(ds.get(), std::string("/") + group + "/" + e.name, dst,
                   static_cast<size_t>(e.count) * sizeof(float));
  }
}

// Reads num_batches_tracked: every BatchNorm stores the same count (see Model::batches_tracked);
// a model without BatchNorm keeps it in the root attribute only.
int64_t read_batches_tracked(Reader& r, const Model& model) {
  const hid_t file = r.file();
  int64_t tracked =
      h5::has_attr(file, "batches_tracked") ? h5::read_attr_i64(file, "batches_tracked") : 0;
  h5::Handle g = h5::open_group(file, "buffers");
  bool first = true;
  for (const std::string& prefix : batchnorm_prefixes(model)) {
    const std::string name = prefix + kTrackedSuffix;
    DDPV_CHECK(h5::is_dataset(g.get(), name), "tensor /buffers/", name, " is missing");
    h5::Handle ds = h5::open_dataset(g.get(), name);
    DDPV_CHECK(h5::dataset_dims(ds.get()).empty(), "tensor /buffers/", name, " is not a scalar");
    int64_t v = 0;
    DDPV_HDF5_CHECK(H5Dread(ds.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &v),
                    "cannot read tensor /buffers/", name);
    r.check_tensor(ds.get(), "/buffers/" + name, &v, sizeof v);
    if (first) tracked = v;
    first = false;
  }
  return tracked;
}

// Without a header and without a model: every dataset of the three groups against its
// crc32c attribute (the check a load makes, for verify_checkpoint_bytes).
void check_all_tensors(Reader& r) {
  for (const char* group : {"params", "optimizer", "buffers"}) {
    if (!h5::is_group(r.file(), group)) continue;
    h5::Handle g = h5::open_group(r.file(), group);
    for (const std::string& name : h5::child_names(g.get())) {
      h5::Handle ds = h5::open_dataset(g.get(), name);
      const std::vector<int64_t> dims = h5::dataset_dims(ds.get());
      const bool count = ends_with(name, kTrackedSuffix);
      check_stored_type(ds.get(), std::string("tensor /") + group + "/" + name, count);
      // Note [Claimed rows]: a headerless file's dims are only a claim (the fuzz target's
      // checkpoint claimed 4 TiB); they are checked against what the file holds first, and
      // only then multiplied (a product of claimed dims can overflow int64).
      h5::check_claim(ds.get(), std::string("tensor /") + group + "/" + name, dims,
                      count ? 8 : 4, true, "resume from another checkpoint");
      int64_t n = 1;
      for (int64_t d : dims) n *= d;
      std::vector<uint8_t> v(static_cast<size_t>(n) * (count ? 8 : 4));
      DDPV_HDF5_CHECK(H5Dread(ds.get(), count ? H5T_NATIVE_INT64 : H5T_NATIVE_FLOAT, H5S_ALL,
                              H5S_ALL, H5P_DEFAULT, v.data()),
                      "cannot read tensor /", group, "/", name);
      r.check_tensor(ds.get(), std::string("/") + group + "/" + name, v.data(), v.size());
    }
  }
}

}  // namespace

CheckpointMeta verify_checkpoint_bytes(const uint8_t* data, size_t size, const std::string& name) {
  Reader r(data, size, name);
  CheckpointMeta meta;
  r.reading([&] {
    meta = read_meta(r.file());
    if (!r.has_header()) check_all_tensors(r);
  });
  meta.unverified = r.unverified();
  return meta;
}

CheckpointMeta load_checkpoint_bytes(const uint8_t* data, size_t size, const std::string& name,
                                     Model& model) {
  Reader r(data, size, name);
  CheckpointMeta meta;
  r.reading([&] { meta = read_meta(r.file()); });
  DDPV_CHECK(meta.model == model.name(), "checkpoint ", name, " holds model '", meta.model,
             "' but this run builds '", model.name(), "' (pass --model ", meta.model,
             " or another checkpoint)");
  const Shape stored{meta.height, meta.width, meta.channels};
  DDPV_CHECK(stored == model.input_shape() && meta.num_classes == model.num_classes(),
             "checkpoint ", name, " was trained on inputs ", stored.str(), " with ",
             meta.num_classes, " classes, but this model takes ", model.input_shape().str(),
             " with ", model.num_classes(), " classes (use the same --data)");
  r.reading([&] {
    check_group(r, "params", model.params());
    check_group(r, "optimizer", model.params());
    check_group(r, "buffers", model.buffers(), kTrackedSuffix);
  });
  // Note [Load in place]: a verified file can fail no more (its names and shapes were just
  // checked), so on the CPU backend its values go straight into the arenas; otherwise (a file
  // without a header is checked tensor by tensor as it is read, and a device arena needs a
  // copy anyway) into host copies first, so that a bad file changes nothing.
  Backend& b = model.backend();
  if (r.has_header() && b.device() == Device::kCpu) {
    int64_t tracked = 0;
    r.reading([&] {
      tracked = read_batches_tracked(r, model);
      read_group(r, "params", model.params(), model.param_data());
      read_group(r, "optimizer", model.params(), model.momentum_data());
      read_group(r, "buffers", model.buffers(), model.buffer_data());
    });
    model.set_batches_tracked(tracked);
    return meta;
  }
  ckpt::HostArenas host;
  host.params.resize(static_cast<size_t>(model.param_count()));
  host.momentum.resize(host.params.size());
  host.buffers.resize(static_cast<size_t>(model.buffer_count()));
  r.reading([&] {
    host.batches_tracked = read_batches_tracked(r, model);
    read_group(r, "params", model.params(), host.params.data());
    read_group(r, "optimizer", model.params(), host.momentum.data());
    read_group(r, "buffers", model.buffers(), host.buffers.data());
  });
  meta.unverified = r.unverified();
  ckpt::copy_to_model(host, model);
  return meta;
}

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  const ckpt::Bytes bytes = ckpt::read_file(path);
  return verify_checkpoint_bytes(bytes.data(), bytes.size(), path);
}

CheckpointMeta load_checkpoint(const std::string& path, Model& model) {
  const ckpt::Bytes bytes = ckpt::read_file(path);
  return load_checkpoint_bytes(bytes.data(), bytes.size(), path, model);
}

}  // namespace ddpv
