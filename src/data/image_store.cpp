// ImageStore: open, validate and read rows of an HDF5 image store.
#include "ddpv/data/image_store.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "ddpv/h5/h5.hpp"
#include "data/host_memory.hpp"

namespace ddpv {

// Note [Reading a batch]: a batch of a shuffled epoch touches rows scattered over the split.
// The rows are sorted (sequential file access), merged into runs of consecutive indices, and
// each run is read by one H5Dread of a regular hyperslab into a dense buffer, which is then
// scattered into the order the caller asked for. The design first asked for one H5Dread of the
// union of all runs, but HDF5 1.10 maps an irregular (union) selection onto chunks element by
// element: on Fashion-MNIST, 128 random rows read as one union took many times as long as 128
// regular reads (docs/performance.md, "Data path"). A contiguous range is one run:
// read_range is one call.

// A split's dims are only a claim (Note [Claimed rows] in h5.hpp): before the labels are
// allocated (4 bytes per row, and the sampler's orders and the loader's cache follow from N),
// both datasets are checked against what the file holds. The labels, read whole here anyway,
// must have every chunk; the images the chunk of their last row (one index lookup: walking the
// index of millions of image chunks on every rank at start-up would not be free).

namespace {

struct Split {
  SplitEncoding encoding = SplitEncoding::kRaw;
  h5::Handle images;  // raw: (N, H, W, C) uint8; encoded: /data, (total bytes) uint8
  int64_t size = 0;
  std::vector<int32_t> labels;
  std::vector<int64_t> offsets;  // encoded: (N + 1)
  std::vector<int32_t> shapes;   // encoded: (N, 3)
};

// The distinct indices[0..n), sorted, each checked to lie in the split ("<noun> I outside split
// 'S' of N images"): what read_rows and read_encoded merge into runs.
std::vector<int64_t> distinct_sorted(const int64_t* indices, size_t n, int64_t size,
                                     const std::string& split, const char* noun) {
  for (size_t i = 0; i < n; ++i)
    DDPV_CHECK(indices[i] >= 0 && indices[i] < size, noun, " ", indices[i], " outside split '",
               split, "' of ", size, " images");
  std::vector<int64_t> rows(indices, indices + n);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

// Calls run(i, j) for each run rows[i..j) of consecutive indices (Note [Reading a batch]).
template <typename Run>
void for_each_run(const std::vector<int64_t>& rows, Run&& run) {
  for (size_t i = 0; i < rows.size();) {
    size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
    run(i, j);
    i = j;
  }
}

// Where `index` is in rows (sorted, holding it).
size_t position_in(const std::vector<int64_t>& rows, int64_t index) {
  return static_cast<size_t>(std::lower_bound(rows.begin(), rows.end(), index) - rows.begin());
}

}  // namespace

struct ImageStore::Impl {
  std::string path;
  h5::Handle file;
  int64_t num_classes = 0;
  std::vector<std::string> class_names;
  int64_t version = 0;
  int height = 0, width = 0, channels = 0;
  std::vector<float> mean, stdev;
  std::string source;
  std::map<std::string, Split> splits;

  const Split& split(const std::string& name) const {
    auto it = splits.find(name);
    if (it != splits.end()) return it->second;
    std::string have;
    for (const auto& [n, s] : splits) have += (have.empty() ? "" : ", ") + n;
    DDPV_FAIL(path, ": no split '", name, "' (the store has: ", have, ")");
  }

  void read_attributes();
  void open_split(const std::string& name);
  h5::Handle open_image_data(const std::string& dataset) const;
  void open_raw_images(const std::string& name, Split& s);
  void open_encoded_images(const std::string& name, Split& s);
};

constexpr const char* kRemedy = "convert the data again";

// Wraps any error of the validation in "<path>: " so the one line names the file.
#define STORE_CHECK(cond, ...) DDPV_CHECK(cond, path, ": ", __VA_ARGS__)

void ImageStore::Impl::read_attributes() {
  const hid_t root = file.get();
  const char* needed[] = {"format", "format_version", "num_classes", "class_names", "height",
                          "width",  "channels",       "mean",        "std"};
  for (const char* a : needed)
    STORE_CHECK(h5::has_attr(root, a), "not an image store: attribute '", a,
                "' is missing on / (write stores with ddpv-convert)");
  const std::string format = h5::read_attr_string(root, "format");
  STORE_CHECK(format == kStoreFormat, "format attribute is '", format, "', expected '",
              kStoreFormat, "'");
  version = h5::read_attr_i64(root, "format_version");
  STORE_CHECK(version >= 1 && version <= kStoreFormatVersion, "format_version ", version,
              " is not supported (this build reads versions 1 to ", kStoreFormatVersion, ")");
  num_classes = h5::read_attr_i64(root, "num_classes");
  STORE_CHECK(num_classes > 0, "num_classes is ", num_classes, ", must be positive");
  class_names = h5::read_attr_strings(root, "class_names");
  STORE_CHECK(static_cast<int64_t>(class_names.size()) == num_classes, "class_names holds ",
              class_names.size(), " names but num_classes is ", num_classes);
  const int64_t h = h5::read_attr_i64(root, "height"), w = h5::read_attr_i64(root, "width"),
                c = h5::read_attr_i64(root, "channels");
  STORE_CHECK(h > 0 && w > 0 && h <= 65536 && w <= 65536, "bad image size ", h, "x", w);
  STORE_CHECK(c == 1 || c == 3, "channels is ", c, ", must be 1 or 3");
  height = static_cast<int>(h), width = static_cast<int>(w), channels = static_cast<int>(c);
  for (auto [name, dst] : {std::pair{"mean", &mean}, std::pair{"std", &stdev}}) {
    std::vector<double> v = h5::read_attr_f64s(root, name);
    STORE_CHECK(static_cast<int64_t>(v.size()) == c, "attribute '", name, "' holds ", v.size(),
                " values, expected one per channel (", c, ")");
    // Non-finite statistics (or ones beyond float's range) would make every normalised pixel
    // NaN or 0: training would "run" on nothing, and only the loss would say so, epochs later.
    for (double x : v)
      STORE_CHECK(std::isfinite(x) && std::fabs(x) <= std::numeric_limits<float>::max(),
                  "attribute '", name, "' holds ", x, ": statistics must be finite floats");
    dst->assign(v.begin(), v.end());
  }
  for (float s : stdev) STORE_CHECK(s > 0.0f, "std must be positive in every channel, got ", s);
  if (h5::has_attr(root, "source")) source = h5::read_attr_string(root, "source");
}

// Note [Chunk cache]: rows of a shuffled batch are scattered, one per chunk. Unfiltered chunks
// are read in place when the cache is off (HDF5 then reads just the selected bytes); with the
// default 1 MiB cache it would read whole chunks, hundreds of images for one. Filtered chunks
// must be decompressed whole, so they get a cache large enough to keep many of them.
// The cache belongs to HDF5's shared dataset object: close the probe before reopening.
// For raw /images and encoded /data alike.
h5::Handle ImageStore::Impl::open_image_data(const std::string& dataset) const {
  bool filtered = false;
  {
    const h5::Handle probe = h5::open_dataset(file.get(), dataset);
    filtered = !h5::dataset_layout(probe.get()).filters.empty();
  }
  return h5::open_dataset(file.get(), dataset, filtered ? size_t{64} << 20 : 0);
}

void ImageStore::Impl::open_raw_images(const std::string& name, Split& s) {
  const std::string images_path = name + "/images";
  STORE_CHECK(h5::is_dataset(file.get(), images_path), "split '", name,
              "' has no dataset 'images'");
  s.images = open_image_data(images_path);
  const std::vector<int64_t> dims = h5::dataset_dims(s.images.get());
  const h5::TypeInfo it = h5::type_info(h5::dataset_type(s.images.get()).get());
  STORE_CHECK(it.cls == H5T_INTEGER && it.size == 1 && !it.is_signed, "/", images_path, " is ",
              it.str(), ", expected uint8");
  STORE_CHECK(dims.size() == 4, "/", images_path, " has rank ", dims.size(),
              ", expected 4 (N, H, W, C)");
  STORE_CHECK(dims[1] == height && dims[2] == width && dims[3] == channels, "/", images_path,
              " holds images of ", dims[1], "x", dims[2], "x", dims[3], " but the attributes say ",
              height, "x", width, "x", channels);
  h5::check_claim(s.images.get(), path + ": /" + images_path, dims, 1, false, kRemedy);
  s.size = dims[0];
}

// Note [Encoded split]: /data holds every image's encoded bytes back to back, /offsets (N + 1)
// where each begins, /shapes (N, 3) what each decodes to. Offsets and shapes are read whole at
// open (20 bytes per image) and checked: offsets start at 0, rise strictly (no image is empty)
// and end at the length of /data, so no later read can leave the dataset; every shape is a
// plausible image. Whether the bytes decode is checked when they are decoded (and by
// `ddpv-convert inspect --read-all`): reading a million images at start-up would not be free.
void ImageStore::Impl::open_encoded_images(const std::string& name, Split& s) {
  for (const char* d : {"data", "offsets", "shapes"})
    STORE_CHECK(h5::is_dataset(file.get(), name + "/" + d), "encoded split '", name,
                "' has no dataset '", d, "'");
  STORE_CHECK(!h5::exists(file.get(), name + "/images"), "split '", name,
              "' has both raw 'images' and encoded 'data'");
  const std::string data_path = name + "/data";
  s.images = open_image_data(data_path);
  const std::vector<int64_t> dims = h5::dataset_dims(s.images.get());
  const h5::TypeInfo it = h5::type_info(h5::dataset_type(s.images.get()).get());
  STORE_CHECK(it.cls == H5T_INTEGER && it.size == 1 && !it.is_signed, "/", data_path, " is ",
              it.str(), ", expected uint8");
  STORE_CHECK(dims.size() == 1, "/", data_path, " has rank ", dims.size(), ", expected 1");
  h5::check_claim(s.images.get(), path + ": /" + data_path, dims, 1, false, kRemedy);

  h5::Handle offsets = h5::open_dataset(file.get(), name + "/offsets");
  const std::vector<int64_t> odims = h5::dataset_dims(offsets.get());
  const h5::TypeInfo ot = h5::type_info(h5::dataset_type(offsets.get()).get());
  STORE_CHECK(ot.cls == H5T_INTEGER && ot.size == 8, "/", name, "/offsets is ", ot.str(),
              ", expected int64");
  STORE_CHECK(odims.size() == 1 && odims[0] >= 1, "/", name,
              "/offsets must have rank 1 and at least one element (N + 1)");
  h5::check_claim(offsets.get(), path + ": /" + name + "/offsets", odims, 8, true, kRemedy);
  s.size = odims[0] - 1;
  h5::Handle shapes = h5::open_dataset(file.get(), name + "/shapes");
  const std::vector<int64_t> sdims = h5::dataset_dims(shapes.get());
  const h5::TypeInfo st = h5::type_info(h5::dataset_type(shapes.get()).get());
  STORE_CHECK(st.cls == H5T_INTEGER && st.size == 4 && st.is_signed, "/", name, "/shapes is ",
              st.str(), ", expected int32");
  STORE_CHECK(sdims.size() == 2 && sdims[1] == 3 && sdims[0] == s.size, "/", name,
              "/shapes must be (N, 3) with N = ", s.size, " (one fewer than the offsets)");
  h5::check_claim(shapes.get(), path + ": /" + name + "/shapes", sdims, 4, true, kRemedy);
  const uint64_t index_bytes = 20 * static_cast<uint64_t>(s.size), memory = host_memory_bytes();
  STORE_CHECK(index_bytes <= memory, "split '", name, "' has ", s.size,
              " images, whose offsets and shapes alone need ",
              gib_text(static_cast<double>(index_bytes)), ", more than the ",
              gib_text(static_cast<double>(memory)), " of this node");
  s.offsets.resize(static_cast<size_t>(s.size + 1));
  DDPV_HDF5_CHECK(
      H5Dread(offsets.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, s.offsets.data()),
      path, ": cannot read /", name, "/offsets");
  s.shapes.resize(static_cast<size_t>(s.size) * 3);
  if (s.size > 0)
    DDPV_HDF5_CHECK(
        H5Dread(shapes.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, s.shapes.data()),
        path, ": cannot read /", name, "/shapes");
  STORE_CHECK(s.offsets[0] == 0, "/", name, "/offsets[0] is ", s.offsets[0], ", must be 0");
  for (int64_t i = 0; i < s.size; ++i) {
    const size_t k = static_cast<size_t>(i);
    STORE_CHECK(s.offsets[k + 1] > s.offsets[k], "/", name, "/offsets[", i + 1, "] is ",
                s.offsets[k + 1], ", not above offsets[", i, "] = ", s.offsets[k],
                ": offsets must rise (no image is empty)");
    const int32_t* shape = s.shapes.data() + 3 * k;
    STORE_CHECK(plausible_shape(shape), "/", name, "/shapes[", i, "] is (", shape[0], ", ",
                shape[1], ", ", shape[2], "): sides must be 1..65535 and channels 1 or 3");
  }
  STORE_CHECK(s.offsets.back() == dims[0], "/", name, "/offsets ends at ", s.offsets.back(),
              " but /", data_path, " holds ", dims[0], " bytes");
}

void ImageStore::Impl::open_split(const std::string& name) {
  const std::string labels_path = name + "/labels";
  Split s;
  h5::Handle g = h5::open_group(file.get(), name);
  if (h5::has_attr(g.get(), "encoding")) {
    const std::string enc = h5::read_attr_string(g.get(), "encoding");
    STORE_CHECK(enc == "jpeg", "split '", name, "' has encoding '", enc,
                "'; this build reads 'jpeg'");
    STORE_CHECK(version >= 2, "split '", name,
                "' is encoded, which needs format_version 2 (the file says ", version, ")");
    s.encoding = SplitEncoding::kJpeg;
    open_encoded_images(name, s);
  } else {
    open_raw_images(name, s);
  }
  STORE_CHECK(h5::is_dataset(file.get(), labels_path), "split '", name,
              "' has no dataset 'labels'");

  h5::Handle labels = h5::open_dataset(file.get(), labels_path);
  const std::vector<int64_t> ldims = h5::dataset_dims(labels.get());
  const h5::TypeInfo lt = h5::type_info(h5::dataset_type(labels.get()).get());
  STORE_CHECK(lt.cls == H5T_INTEGER && lt.size == 4 && lt.is_signed, "/", labels_path, " is ",
              lt.str(), ", expected int32");
  STORE_CHECK(ldims.size() == 1, "/", labels_path, " has rank ", ldims.size(), ", expected 1");
  h5::check_claim(labels.get(), path + ": /" + labels_path, ldims, 4, true, kRemedy);
  STORE_CHECK(ldims[0] == s.size, "split '", name, "' has ", s.size, " images but ", ldims[0],
              " labels");
  const uint64_t label_bytes = 4 * static_cast<uint64_t>(s.size), memory = host_memory_bytes();
  STORE_CHECK(label_bytes <= memory, "split '", name, "' has ", s.size,
              " images, whose labels alone need ", gib_text(static_cast<double>(label_bytes)),
              ", more than the ", gib_text(static_cast<double>(memory)), " of this node");
  s.labels.resize(static_cast<size_t>(s.size));
  if (s.size > 0)
    DDPV_HDF5_CHECK(
        H5Dread(labels.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, s.labels.data()),
        path, ": cannot read /", labels_path);
  for (int64_t i = 0; i < s.size; ++i) {
    const int32_t l = s.labels[static_cast<size_t>(i)];
    STORE_CHECK(l >= 0 && l < num_classes, "/", labels_path, "[", i, "] is ", l, ", outside [0, ",
                num_classes, ")");
  }
  splits.emplace(name, std::move(s));
}

ImageStore::ImageStore(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  DDPV_CHECK(h5::is_hdf5(path), path,
             ": not an HDF5 file or does not exist (create a store with ddpv-convert)");
  impl_->file = h5::open_file(path);
  impl_->read_attributes();
  for (const std::string& name : h5::child_names(impl_->file.get())) {
    if (h5::is_group(impl_->file.get(), name)) impl_->open_split(name);
  }
  DDPV_CHECK(!impl_->splits.empty(), path,
             ": the store holds no split (no group with images "
             "and labels)");
}

ImageStore::~ImageStore() = default;
ImageStore::ImageStore(ImageStore&&) noexcept = default;
ImageStore& ImageStore::operator=(ImageStore&&) noexcept = default;

const std::string& ImageStore::path() const { return impl_->path; }
int64_t ImageStore::format_version() const { return impl_->version; }
int64_t ImageStore::num_classes() const { return impl_->num_classes; }
const std::vector<std::string>& ImageStore::class_names() const { return impl_->class_names; }
int ImageStore::height() const { return impl_->height; }
int ImageStore::width() const { return impl_->width; }
int ImageStore::channels() const { return impl_->channels; }
const std::vector<float>& ImageStore::mean() const { return impl_->mean; }
const std::vector<float>& ImageStore::std() const { return impl_->stdev; }
const std::string& ImageStore::source() const { return impl_->source; }

std::vector<std::string> ImageStore::splits() const {
  std::vector<std::string> names;
  for (const auto& [name, s] : impl_->splits) names.push_back(name);
  return names;
}
bool ImageStore::has_split(const std::string& split) const {
  return impl_->splits.count(split) > 0;
}
int64_t ImageStore::split_size(const std::string& split) const { return impl_->split(split).size; }
const std::vector<int32_t>& ImageStore::labels(const std::string& split) const {
  return impl_->split(split).labels;
}
SplitEncoding ImageStore::encoding(const std::string& split) const {
  return impl_->split(split).encoding;
}
bool ImageStore::any_encoded() const {
  for (const auto& [name, s] : impl_->splits)
    if (s.encoding != SplitEncoding::kRaw) return true;
  return false;
}
const std::vector<int32_t>& ImageStore::shapes(const std::string& split) const {
  return impl_->split(split).shapes;
}
const std::vector<int64_t>& ImageStore::offsets(const std::string& split) const {
  return impl_->split(split).offsets;
}

void ImageStore::read_range(const std::string& split, int64_t begin, int64_t count,
                            uint8_t* out) const {
  const Split& s = impl_->split(split);
  DDPV_CHECK(s.encoding == SplitEncoding::kRaw, impl_->path, ": split '", split,
             "' is encoded: read it with read_encoded (internal)");
  DDPV_CHECK(begin >= 0 && count >= 0 && begin + count <= s.size, "rows [", begin, ", ",
             begin + count, ") outside split '", split, "' of ", s.size, " images");
  if (count == 0) return;
  h5::Handle fspace = h5::dataset_space(s.images.get());
  const hsize_t start[4] = {static_cast<hsize_t>(begin), 0, 0, 0};
  const hsize_t block[4] = {static_cast<hsize_t>(count), static_cast<hsize_t>(impl_->height),
                            static_cast<hsize_t>(impl_->width),
                            static_cast<hsize_t>(impl_->channels)};
  DDPV_HDF5_CHECK(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, block, nullptr),
                  "selecting rows");
  h5::Handle mspace(DDPV_HDF5_CHECK(H5Screate_simple(4, block, nullptr), "memory space"), H5Sclose);
  DDPV_HDF5_CHECK(
      H5Dread(s.images.get(), H5T_NATIVE_UINT8, mspace.get(), fspace.get(), H5P_DEFAULT, out),
      impl_->path, ": cannot read /", split, "/images rows [", begin, ", ", begin + count, ")");
}

void ImageStore::read_rows(const std::string& split, const int64_t* indices, size_t n,
                           uint8_t* out) const {
  const Split& s = impl_->split(split);
  DDPV_CHECK(s.encoding == SplitEncoding::kRaw, impl_->path, ": split '", split,
             "' is encoded: read it with read_encoded (internal)");
  if (n == 0) return;
  // Sorted unique rows, and for each requested position its rank among them.
  const std::vector<int64_t> rows = distinct_sorted(indices, n, s.size, split, "row");
  const bool in_order = rows.size() == n && std::equal(rows.begin(), rows.end(), indices);

  const size_t bytes = static_cast<size_t>(image_bytes());
  std::vector<uint8_t> dense;
  uint8_t* dst = out;
  if (!in_order) {
    dense.resize(rows.size() * bytes);
    dst = dense.data();
  }
  h5::Handle fspace = h5::dataset_space(s.images.get());
  hsize_t block[4] = {rows.size(), static_cast<hsize_t>(impl_->height),
                      static_cast<hsize_t>(impl_->width), static_cast<hsize_t>(impl_->channels)};
  for_each_run(rows, [&](size_t i, size_t j) {
    const hsize_t fstart[4] = {static_cast<hsize_t>(rows[i]), 0, 0, 0};
    block[0] = j - i;
    DDPV_HDF5_CHECK(
        H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, fstart, nullptr, block, nullptr),
        "selecting rows");
    // A memory space of exactly the run keeps HDF5 on its contiguous-memory fast path.
    h5::Handle mspace(DDPV_HDF5_CHECK(H5Screate_simple(4, block, nullptr), "memory space"),
                      H5Sclose);
    DDPV_HDF5_CHECK(H5Dread(s.images.get(), H5T_NATIVE_UINT8, mspace.get(), fspace.get(),
                            H5P_DEFAULT, dst + i * bytes),
                    impl_->path, ": cannot read rows [", rows[i], ", ", rows[j - 1] + 1, ") of /",
                    split, "/images");
  });
  if (in_order) return;
  for (size_t i = 0; i < n; ++i)
    std::copy_n(dense.data() + position_in(rows, indices[i]) * bytes, bytes, out + i * bytes);
}

void ImageStore::read_encoded(const std::string& split, const int64_t* indices, size_t n,
                              EncodedBatch* out) const {
  const Split& s = impl_->split(split);
  DDPV_CHECK(s.encoding != SplitEncoding::kRaw, impl_->path, ": split '", split,
             "' is raw: read it with read_rows (internal)");
  const std::vector<int64_t> rows = distinct_sorted(indices, n, s.size, split, "image");
  // Where each sorted row's bytes land in out->bytes: runs of rows are contiguous in /data, so
  // they are contiguous in the buffer too.
  int64_t total = 0;
  for (int64_t r : rows)
    total += s.offsets[static_cast<size_t>(r + 1)] - s.offsets[static_cast<size_t>(r)];
  out->bytes.resize(static_cast<size_t>(total));
  std::vector<int64_t> at(rows.size());
  h5::Handle fspace = h5::dataset_space(s.images.get());
  int64_t pos = 0;
  for_each_run(rows, [&](size_t i, size_t j) {
    const int64_t first = s.offsets[static_cast<size_t>(rows[i])],
                  last = s.offsets[static_cast<size_t>(rows[j - 1] + 1)];
    for (size_t k = i; k < j; ++k) at[k] = pos + s.offsets[static_cast<size_t>(rows[k])] - first;
    const hsize_t start = static_cast<hsize_t>(first), count = static_cast<hsize_t>(last - first);
    DDPV_HDF5_CHECK(
        H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr),
        "selecting bytes");
    h5::Handle mspace(DDPV_HDF5_CHECK(H5Screate_simple(1, &count, nullptr), "memory space"),
                      H5Sclose);
    DDPV_HDF5_CHECK(H5Dread(s.images.get(), H5T_NATIVE_UINT8, mspace.get(), fspace.get(),
                            H5P_DEFAULT, out->bytes.data() + pos),
                    impl_->path, ": cannot read images [", rows[i], ", ", rows[j - 1] + 1, ") of /",
                    split, "/data");
    pos += last - first;
  });
  out->begin.resize(n);
  out->size.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t row = static_cast<size_t>(indices[i]);
    out->begin[i] = at[position_in(rows, indices[i])];
    out->size[i] = s.offsets[row + 1] - s.offsets[row];
  }
}

}  // namespace ddpv
