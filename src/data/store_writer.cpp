// StoreWriter: chunked, optionally compressed datasets, exact train statistics, atomic rename.
#include "ddpv/data/store_writer.hpp"

#include <sys/resource.h>

#include <cmath>
#include <filesystem>

#include "ddpv/h5/h5.hpp"
#include "ddpv/core/log.hpp"
#include "ddpv/data/image_store.hpp"

namespace ddpv {
namespace {
constexpr int64_t kDefaultChunkBytes = 256 * 1024;
// /data of an encoded split: a batch's images are scattered over the split, and without a chunk
// cache an unfiltered read takes just its bytes whatever the chunk size; the chunk size only
// bounds the chunk index (a 140 GB split is 140,000 chunks).
constexpr uint64_t kEncodedChunkBytes = 1 << 20;
}

int parse_compression(const std::string& spec) {
  if (spec == "none") return -1;
  if (spec == "gzip") return 4;
  if (spec.rfind("gzip:", 0) == 0 && spec.size() == 6 && spec[5] >= '0' && spec[5] <= '9')
    return spec[5] - '0';
  DDPV_FAIL("--compress '", spec, "' is not understood: use none, gzip or gzip:0..9");
}

struct StoreWriter::Impl {
  std::string out, tmp;
  int height, width, channels;
  int64_t image_bytes;
  std::vector<std::string> class_names;
  std::string source;
  StoreWriterOptions opt;
  h5::Handle file, group, images, labels, offsets, shapes;
  std::string split;
  SplitEncoding encoding = SplitEncoding::kRaw;
  bool any_encoded = false;
  int64_t count = 0;
  int64_t bytes_count = 0;  // encoded: bytes appended to /data
  bool have_train = false;
  // Exact integer sums of the train pixels per channel: no rounding however large the split.
  std::vector<uint64_t> sum, sum_sq;
  uint64_t train_pixels = 0;

  h5::Handle create_extendible(const std::string& name, const std::vector<hsize_t>& row,
                               hid_t file_type, int64_t chunk_rows, bool filters = true) {
    std::vector<hsize_t> dims{0}, max{H5S_UNLIMITED}, chunk{static_cast<hsize_t>(chunk_rows)};
    for (hsize_t d : row) {
      dims.push_back(d), max.push_back(d), chunk.push_back(d);
    }
    const int rank = static_cast<int>(dims.size());
    h5::Handle space(DDPV_HDF5_CHECK(H5Screate_simple(rank, dims.data(), max.data()), "dataspace"),
                     H5Sclose);
    h5::Handle plist(DDPV_HDF5_CHECK(H5Pcreate(H5P_DATASET_CREATE), "plist"), H5Pclose);
    DDPV_HDF5_CHECK(H5Pset_chunk(plist.get(), rank, chunk.data()), "setting chunks of ", name);
    if (filters && opt.checksum)
      DDPV_HDF5_CHECK(H5Pset_fletcher32(plist.get()), "setting fletcher32");
    if (filters && opt.gzip_level >= 0) {
      DDPV_HDF5_CHECK(H5Pset_shuffle(plist.get()), "setting shuffle");
      DDPV_HDF5_CHECK(H5Pset_deflate(plist.get(), static_cast<unsigned>(opt.gzip_level)),
                      "setting deflate");
    }
    // No chunk cache (Note [Abandoning a file]). Appends are blocks of hundreds of images, so
    // only the chunks at a block's edges are written twice; the CPU time of converting
    // Fashion-MNIST, compressed or not, did not change.
    h5::Handle access(DDPV_HDF5_CHECK(H5Pcreate(H5P_DATASET_ACCESS), "plist"), H5Pclose);
    DDPV_HDF5_CHECK(H5Pset_chunk_cache(access.get(), 0, 0, 1.0), "chunk cache");
    return h5::Handle(DDPV_HDF5_CHECK(H5Dcreate2(group.get(), name.c_str(), file_type, space.get(),
                                                 H5P_DEFAULT, plist.get(), access.get()),
                                      tmp, ": cannot create /", split, "/", name),
                      H5Dclose);
  }

  void append_rows(hid_t dataset, const char* name, const std::vector<hsize_t>& row, hid_t mem_type,
                   const void* data, int64_t n, int64_t at = -1) {
    if (at < 0) at = count;
    std::vector<hsize_t> new_dims{static_cast<hsize_t>(at + n)}, start{static_cast<hsize_t>(at)},
        block{static_cast<hsize_t>(n)};
    for (hsize_t d : row) new_dims.push_back(d), start.push_back(0), block.push_back(d);
    DDPV_HDF5_CHECK(H5Dset_extent(dataset, new_dims.data()), tmp, ": cannot extend /", split, "/",
                    name);
    h5::Handle fspace = h5::dataset_space(dataset);
    DDPV_HDF5_CHECK(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr,
                                        block.data(), nullptr),
                    "selecting rows");
    h5::Handle mspace(
        DDPV_HDF5_CHECK(H5Screate_simple(static_cast<int>(block.size()), block.data(), nullptr),
                        "memory space"),
        H5Sclose);
    DDPV_HDF5_CHECK(H5Dwrite(dataset, mem_type, mspace.get(), fspace.get(), H5P_DEFAULT, data), tmp,
                    ": cannot write /", split, "/", name);
  }

  // Without a chunk cache a close has no data left to write; a failure is reported all the same,
  // since the store would lack what it did not write.
  void end_split() {
    if (images.valid())
      DDPV_HDF5_CHECK(H5Dclose(images.release()), tmp, ": cannot write /", split, "/images");
    if (labels.valid())
      DDPV_HDF5_CHECK(H5Dclose(labels.release()), tmp, ": cannot write /", split, "/labels");
    if (offsets.valid())
      DDPV_HDF5_CHECK(H5Dclose(offsets.release()), tmp, ": cannot write /", split, "/offsets");
    if (shapes.valid())
      DDPV_HDF5_CHECK(H5Dclose(shapes.release()), tmp, ": cannot write /", split, "/shapes");
    if (group.valid()) DDPV_HDF5_CHECK(H5Gclose(group.release()), tmp, ": cannot write /", split);
  }

  // Under a file-size limit (ulimit -f) a write past it fails with EFBIG, and so would the
  // discarding close's (Note [Abandoning a file]): the chunks n more rows may allocate, whole,
  // and 1 MiB of metadata must fit under the limit.
  void check_size_limit(int64_t n, int64_t encoded_bytes = 0) const {
    rlimit limit{};
    hsize_t size = 0;
    if (getrlimit(RLIMIT_FSIZE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY ||
        H5Fget_filesize(file.get(), &size) < 0)
      return;
    const uint64_t label_rows = static_cast<uint64_t>(std::max<int64_t>(opt.chunk_images, 4096));
    const uint64_t rows = static_cast<uint64_t>(n),
                   image_rows = static_cast<uint64_t>(opt.chunk_images);
    const uint64_t need =
        size + (rows / image_rows + 2) * image_rows * static_cast<uint64_t>(image_bytes) +
        (rows / label_rows + 2) * label_rows * 4 + (uint64_t{1} << 20) +
        (encoded_bytes > 0 ? static_cast<uint64_t>(encoded_bytes) + 2 * kEncodedChunkBytes +
                                 (rows / label_rows + 2) * label_rows * 20
                           : 0);
    DDPV_CHECK(need <= limit.rlim_cur, tmp, ": ", n, " more images would take the file past this ",
               "process's file-size limit of ", limit.rlim_cur, " bytes (ulimit -f): raise it");
  }

  // Note [Abandoning a file]: nothing of the temporary is flushed to disk; every HDF5 object is
  // closed, so the library's exit handlers find none; the file is removed.
  void abandon() noexcept {
    if (!file.valid()) return;
    h5::discard_writes(file.get());
    images.reset();
    labels.reset();
    offsets.reset();
    shapes.reset();
    group.reset();
    file.reset();
    H5Eclear2(H5E_DEFAULT);
    std::error_code ec;
    std::filesystem::remove(tmp, ec);  // best effort: a destructor never throws
  }
};

StoreWriter::StoreWriter(const std::string& out_path, int height, int width, int channels,
                         std::vector<std::string> class_names, const std::string& source,
                         StoreWriterOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  DDPV_CHECK(height > 0 && width > 0 && (channels == 1 || channels == 3), "bad image shape ",
             height, "x", width, "x", channels);
  DDPV_CHECK(!class_names.empty(), "a store needs at least one class");
  DDPV_CHECK(options.chunk_images >= 0, "--chunk-images must be positive");
  DDPV_CHECK(options.gzip_level >= -1 && options.gzip_level <= 9, "gzip level must be 0..9");
  s.out = out_path;
  s.tmp = out_path + ".tmp";
  s.height = height, s.width = width, s.channels = channels;
  s.image_bytes = int64_t{height} * width * channels;
  s.class_names = std::move(class_names);
  s.source = source;
  s.opt = options;
  if (s.opt.chunk_images == 0)
    s.opt.chunk_images = std::max<int64_t>(1, kDefaultChunkBytes / s.image_bytes);
  s.sum.assign(static_cast<size_t>(channels), 0);
  s.sum_sq.assign(static_cast<size_t>(channels), 0);
  s.file = h5::create_file(s.tmp);
}

StoreWriter::~StoreWriter() { impl_->abandon(); }  // nothing to do once committed

void StoreWriter::begin_split(const std::string& name, SplitEncoding encoding) {
  Impl& s = *impl_;
  DDPV_CHECK(s.file.valid(), "store already committed");
  DDPV_CHECK(!name.empty() && name.find('/') == std::string::npos, "bad split name '", name, "'");
  DDPV_CHECK(!h5::exists(s.file.get(), name), "split '", name, "' written twice");
  s.end_split();
  s.split = name;
  s.count = 0;
  s.group = h5::Handle(
      DDPV_HDF5_CHECK(H5Gcreate2(s.file.get(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                      s.tmp, ": cannot create /", name),
      H5Gclose);
  s.encoding = encoding;
  s.bytes_count = 0;
  if (encoding == SplitEncoding::kRaw) {
    s.images = s.create_extendible("images",
                                   {static_cast<hsize_t>(s.height), static_cast<hsize_t>(s.width),
                                    static_cast<hsize_t>(s.channels)},
                                   H5T_STD_U8LE, s.opt.chunk_images);
  } else {
    s.any_encoded = true;
    try {
      h5::write_attr_string(s.group.get(), "encoding", "jpeg");
    } catch (const Error& e) {
      DDPV_FAIL(s.tmp, ": ", e.message());
    }
    s.images = s.create_extendible("data", {}, H5T_STD_U8LE,
                                   static_cast<int64_t>(kEncodedChunkBytes), false);
    s.offsets = s.create_extendible("offsets", {}, H5T_STD_I64LE, 4096);
    s.shapes = s.create_extendible("shapes", {3}, H5T_STD_I32LE, 4096);
    const int64_t zero = 0;
    s.append_rows(s.offsets.get(), "offsets", {}, H5T_NATIVE_INT64, &zero, 1, 0);
  }
  // Labels are tiny: chunk them by a larger count so the labels dataset is not thousands of chunks.
  s.labels =
      s.create_extendible("labels", {}, H5T_STD_I32LE, std::max<int64_t>(s.opt.chunk_images, 4096));
  if (name == "train") s.have_train = true;
}

void StoreWriter::check_labels(const int32_t* labels, int64_t n) const {
  const Impl& s = *impl_;
  const int64_t k = static_cast<int64_t>(s.class_names.size());
  for (int64_t i = 0; i < n; ++i)
    DDPV_CHECK(labels[i] >= 0 && labels[i] < k, "label ", labels[i], " of image ", s.count + i,
               " in split '", s.split, "' is outside [0, ", k, ")");
}

void StoreWriter::add_train_pixels(const uint8_t* pixels, int64_t count) {
  Impl& s = *impl_;
  const size_t c = static_cast<size_t>(s.channels);
  const size_t total = static_cast<size_t>(count) * c;
  for (size_t ch = 0; ch < c; ++ch) {
    uint64_t a = 0, b = 0;
    for (size_t i = ch; i < total; i += c) {
      const uint64_t v = pixels[i];
      a += v;
      b += v * v;
    }
    s.sum[ch] += a;
    s.sum_sq[ch] += b;
  }
  s.train_pixels += static_cast<uint64_t>(count);
}

void StoreWriter::append_encoded(const uint8_t* bytes, const int64_t* sizes, const int32_t* shapes,
                                 const int32_t* labels, int64_t n) {
  Impl& s = *impl_;
  DDPV_CHECK(s.images.valid() && s.encoding != SplitEncoding::kRaw,
             "append_encoded outside an encoded split (internal)");
  if (n <= 0) return;
  check_labels(labels, n);
  int64_t total = 0;
  std::vector<int64_t> ends(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    DDPV_CHECK(sizes[i] > 0, "image ", s.count + i, " of split '", s.split, "' is empty");
    DDPV_CHECK(plausible_shape(shapes + 3 * i), "image ", s.count + i, " of split '", s.split,
               "' has a bad shape");
    total += sizes[i];
    ends[static_cast<size_t>(i)] = s.bytes_count + total;
  }
  s.check_size_limit(n, total);
  s.append_rows(s.images.get(), "data", {}, H5T_NATIVE_UINT8, bytes, total, s.bytes_count);
  s.append_rows(s.offsets.get(), "offsets", {}, H5T_NATIVE_INT64, ends.data(), n, s.count + 1);
  s.append_rows(s.shapes.get(), "shapes", {3}, H5T_NATIVE_INT32, shapes, n);
  s.append_rows(s.labels.get(), "labels", {}, H5T_NATIVE_INT32, labels, n);
  s.bytes_count += total;
  s.count += n;
}

void StoreWriter::append(const uint8_t* images, const int32_t* labels, int64_t n) {
  Impl& s = *impl_;
  DDPV_CHECK(s.images.valid() && s.encoding == SplitEncoding::kRaw,
             "append outside a raw split (internal)");
  if (n <= 0) return;
  check_labels(labels, n);
  s.check_size_limit(n);
  if (s.split == "train") add_train_pixels(images, n * s.height * s.width);
  s.append_rows(s.images.get(), "images",
                {static_cast<hsize_t>(s.height), static_cast<hsize_t>(s.width),
                 static_cast<hsize_t>(s.channels)},
                H5T_NATIVE_UINT8, images, n);
  s.append_rows(s.labels.get(), "labels", {}, H5T_NATIVE_INT32, labels, n);
  s.count += n;
}

int64_t StoreWriter::split_count() const { return impl_->count; }

std::vector<float> StoreWriter::train_mean() const {
  const Impl& s = *impl_;
  std::vector<float> m;
  for (size_t c = 0; c < s.sum.size(); ++c)
    m.push_back(s.train_pixels ? static_cast<float>(static_cast<double>(s.sum[c]) /
                                                    (255.0 * static_cast<double>(s.train_pixels)))
                               : 0.0f);
  return m;
}

std::vector<float> StoreWriter::train_std() const {
  const Impl& s = *impl_;
  std::vector<float> out;
  for (size_t c = 0; c < s.sum.size(); ++c) {
    const double n = static_cast<double>(s.train_pixels);
    const double mean = n > 0 ? static_cast<double>(s.sum[c]) / n : 0.0;
    const double var = n > 0 ? static_cast<double>(s.sum_sq[c]) / n - mean * mean : 0.0;
    out.push_back(static_cast<float>(std::sqrt(std::max(var, 0.0)) / 255.0));
  }
  return out;
}

void StoreWriter::commit() {
  Impl& s = *impl_;
  DDPV_CHECK(s.file.valid(), "store already committed");
  DDPV_CHECK(s.have_train && s.train_pixels > 0, s.out,
             ": no train images were written, so mean/std cannot be computed");
  s.end_split();
  std::vector<float> stdev = train_std();
  for (float& v : stdev) {
    if (v < 1e-6f) {
      DDPV_WARN(s.out, ": a channel of the train split is constant; its std is stored as 1");
      v = 1.0f;
    }
  }
  s.check_size_limit(0);
  const hid_t root = s.file.get();
  try {
    h5::write_attr_string(root, "format", kStoreFormat);
    h5::write_attr_i64(root, "format_version", s.any_encoded ? kStoreFormatVersion : 1);
    h5::write_attr_i64(root, "num_classes", static_cast<int64_t>(s.class_names.size()));
    h5::write_attr_strings(root, "class_names", s.class_names);
    h5::write_attr_i64(root, "height", s.height);
    h5::write_attr_i64(root, "width", s.width);
    h5::write_attr_i64(root, "channels", s.channels);
    h5::write_attr_f32s(root, "mean", train_mean());
    h5::write_attr_f32s(root, "std", stdev);
    h5::write_attr_string(root, "source", s.source);
  } catch (const Error& e) {
    DDPV_FAIL(s.tmp, ": ", e.message());
  }
  // Note [Abandoning a file]: a failure up to here leaves the file open for the destructor to
  // abandon. The space of the flush is reserved first; after the flush the close writes nothing.
  h5::reserve_for_flush(root, s.tmp);
  DDPV_HDF5_CHECK(H5Fflush(root, H5F_SCOPE_GLOBAL), s.tmp, ": cannot flush");
  s.file.close(s.tmp);
  std::error_code ec;
  std::filesystem::rename(s.tmp, s.out, ec);
  if (ec) {
    std::filesystem::remove(s.tmp, ec);
    DDPV_FAIL("cannot rename ", s.tmp, " to ", s.out, ": ", ec.message());
  }
}

}  // namespace ddpv
