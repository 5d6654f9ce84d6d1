// HDF5 helpers: error-stack capture, files, groups and datasets (attributes in h5_attr.cpp).
#include "ddpv/h5/h5.hpp"

#include <algorithm>
#include <filesystem>

namespace ddpv::h5 {
namespace {

struct StackText {
  std::string first;  // the API call that failed
  std::string last;   // the innermost cause
  int count = 0;
};

// One line of a stack entry. The POSIX drivers describe a failed read or write over two lines
// with the buffer address, sizes and offsets ("file write failed: time = ...\n, filename = ...,
// errno = 28, error message = 'No space left on device', buf = ..."); only the first words and
// the system's message are kept.
std::string describe(const char* desc) {
  std::string d = desc ? desc : "";
  const std::string key = "error message = '";
  const size_t m = d.find(key);
  if (m != std::string::npos) {
    const size_t end = d.find('\'', m + key.size());
    const std::string what = d.substr(0, std::min(d.find(':'), d.find(',')));
    d = what + ": " +
        d.substr(m + key.size(), end == std::string::npos ? end : end - m - key.size());
  }
  for (char& c : d)
    if (c == '\n' || c == '\r') c = ' ';
  return d;
}

herr_t walk_cb(unsigned n, const H5E_error2_t* err, void* data) {
  auto* text = static_cast<StackText*>(data);
  std::string line =
      std::string(err->func_name ? err->func_name : "?") + ": " + describe(err->desc);
  if (n == 0) text->first = line;
  text->last = line;
  ++text->count;
  return 0;
}

}  // namespace

void quiet_errors() {
  thread_local bool done = false;
  if (!done) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    done = true;
  }
}

std::string take_error_stack() {
  StackText text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk_cb, &text);
  H5Eclear2(H5E_DEFAULT);
  if (text.count == 0) return "";
  if (text.count == 1) return text.first;
  return text.first + "; " + text.last;
}

void Handle::close(const std::string& what) {
  if (id_ < 0) return;
  const hid_t id = std::exchange(id_, -1);
  DDPV_HDF5_CHECK(close_(id), "closing ", what, " failed");
}

std::string TypeInfo::str() const {
  const std::string bits = std::to_string(size * 8);
  switch (cls) {
    case H5T_INTEGER:
      return (is_signed ? "int" : "uint") + bits;
    case H5T_FLOAT:
      return "float" + bits;
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    default:
      return "type class " + std::to_string(static_cast<int>(cls));
  }
}

// ---- files and groups ----------------------------------------------------------------------
bool is_hdf5(const std::string& path) {
  quiet_errors();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  const htri_t r = H5Fis_hdf5(path.c_str());
  H5Eclear2(H5E_DEFAULT);
  return r > 0;
}

Handle open_file(const std::string& path, bool writable) {
  quiet_errors();
  // Cluster file systems (Lustre, NFS) often refuse flock(); HDF5 then fails every open unless
  // told to go on without the lock, which is safe for the read-only opens of many ranks.
  Handle fapl(DDPV_HDF5_CHECK(H5Pcreate(H5P_FILE_ACCESS), "file access plist"), H5Pclose);
  DDPV_HDF5_CHECK(H5Pset_file_locking(fapl.get(), true, true), "file locking");
  const hid_t id =
      DDPV_HDF5_CHECK(H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, fapl.get()),
                      path, ": cannot open as HDF5");
  return Handle(id, H5Fclose);
}

Handle create_file(const std::string& path) {
  quiet_errors();
  const hid_t id =
      DDPV_HDF5_CHECK(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), path,
                      ": cannot create HDF5 file (check the directory exists "
                      "and is writable)");
  return Handle(id, H5Fclose);
}

Handle open_group(hid_t loc, const std::string& name) {
  quiet_errors();
  return Handle(
      DDPV_HDF5_CHECK(H5Gopen2(loc, name.c_str(), H5P_DEFAULT), "cannot open group '", name, "'"),
      H5Gclose);
}

Handle create_group(hid_t loc, const std::string& name) {
  quiet_errors();
  return Handle(
      DDPV_HDF5_CHECK(H5Gcreate2(loc, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                      "cannot create group '", name, "'"),
      H5Gclose);
}

bool exists(hid_t loc, const std::string& path) {
  quiet_errors();
  // H5Lexists fails (rather than answering no) when an intermediate component is missing.
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t slash = path.find('/', pos);
    if (slash == std::string::npos) slash = path.size();
    const std::string prefix = path.substr(0, slash);
    if (!prefix.empty() && H5Lexists(loc, prefix.c_str(), H5P_DEFAULT) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return false;
    }
    pos = slash + 1;
  }
  return true;
}

namespace {
bool object_is(hid_t loc, const std::string& name, H5O_type_t type) {
  if (!exists(loc, name)) return false;
  H5O_info_t info;
  if (H5Oget_info_by_name(loc, name.c_str(), &info, H5P_DEFAULT) < 0) {
    H5Eclear2(H5E_DEFAULT);
    return false;
  }
  return info.type == type;
}

herr_t name_cb(hid_t, const char* name, const H5L_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->push_back(name);
  return 0;
}
}  // namespace

bool is_group(hid_t loc, const std::string& name) { return object_is(loc, name, H5O_TYPE_GROUP); }
bool is_dataset(hid_t loc, const std::string& name) {
  return object_is(loc, name, H5O_TYPE_DATASET);
}

std::vector<std::string> child_names(hid_t group) {
  std::vector<std::string> names;
  DDPV_HDF5_CHECK(H5Literate(group, H5_INDEX_NAME, H5_ITER_INC, nullptr, name_cb, &names),
                  "cannot list group members");
  return names;
}

// ---- datasets ------------------------------------------------------------------------------
Handle open_dataset(hid_t loc, const std::string& name) {
  quiet_errors();
  return Handle(
      DDPV_HDF5_CHECK(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), "cannot open dataset '", name, "'"),
      H5Dclose);
}

Handle open_dataset(hid_t loc, const std::string& name, size_t cache_bytes) {
  quiet_errors();
  Handle access(DDPV_HDF5_CHECK(H5Pcreate(H5P_DATASET_ACCESS), "dataset access plist"), H5Pclose);
  // 12421 is a prime well above the chunk count a cache of this size holds, as HDF5 advises.
  DDPV_HDF5_CHECK(H5Pset_chunk_cache(access.get(), 12421, cache_bytes, 1.0), "chunk cache");
  return Handle(DDPV_HDF5_CHECK(H5Dopen2(loc, name.c_str(), access.get()), "cannot open dataset '",
                                name, "'"),
                H5Dclose);
}

Handle dataset_space(hid_t dataset) {
  return Handle(DDPV_HDF5_CHECK(H5Dget_space(dataset), "cannot get dataspace"), H5Sclose);
}

Handle dataset_type(hid_t dataset) {
  return Handle(DDPV_HDF5_CHECK(H5Dget_type(dataset), "cannot get datatype"), H5Tclose);
}

std::vector<int64_t> dataset_dims(hid_t dataset) {
  Handle space = dataset_space(dataset);
  const int rank = DDPV_HDF5_CHECK(H5Sget_simple_extent_ndims(space.get()), "bad dataspace");
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  DDPV_HDF5_CHECK(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), "bad dataspace");
  return std::vector<int64_t>(dims.begin(), dims.end());
}

TypeInfo type_info(hid_t type) {
  TypeInfo info;
  info.cls = H5Tget_class(type);
  info.size = H5Tget_size(type);
  if (info.cls == H5T_INTEGER) info.is_signed = H5Tget_sign(type) == H5T_SGN_2;
  return info;
}

Layout dataset_layout(hid_t dataset) {
  Layout layout;
  Handle plist(DDPV_HDF5_CHECK(H5Dget_create_plist(dataset), "cannot get dataset properties"),
               H5Pclose);
  if (H5Pget_layout(plist.get()) != H5D_CHUNKED) return layout;
  layout.chunked = true;
  hsize_t chunk[H5S_MAX_RANK];
  const int rank = DDPV_HDF5_CHECK(H5Pget_chunk(plist.get(), H5S_MAX_RANK, chunk), "bad chunking");
  layout.chunk_dims.assign(chunk, chunk + rank);
  const int n = H5Pget_nfilters(plist.get());
  for (int i = 0; i < n; ++i) {
    unsigned flags = 0, values[8] = {0}, config = 0;
    size_t nvalues = 8;
    char name[64] = {0};
    const H5Z_filter_t f = H5Pget_filter2(plist.get(), static_cast<unsigned>(i), &flags, &nvalues,
                                          values, sizeof(name), name, &config);
    if (f == H5Z_FILTER_DEFLATE)
      layout.filters.push_back("deflate(" + std::to_string(nvalues ? values[0] : 0) + ")");
    else if (f == H5Z_FILTER_SHUFFLE)
      layout.filters.push_back("shuffle");
    else if (f == H5Z_FILTER_FLETCHER32)
      layout.filters.push_back("fletcher32");
    else
      layout.filters.push_back(name[0] ? name : "filter " + std::to_string(f));
  }
  return layout;
}

void write_dataset(hid_t loc, const std::string& name, const std::vector<int64_t>& dims,
                   hid_t file_type, hid_t mem_type, const void* data) {
  std::vector<hsize_t> d(dims.begin(), dims.end());
  Handle space(
      DDPV_HDF5_CHECK(d.empty() ? H5Screate(H5S_SCALAR)
                                : H5Screate_simple(static_cast<int>(d.size()), d.data(), nullptr),
                      "bad dims for '", name, "'"),
      H5Sclose);
  Handle ds(DDPV_HDF5_CHECK(H5Dcreate2(loc, name.c_str(), file_type, space.get(), H5P_DEFAULT,
                                       H5P_DEFAULT, H5P_DEFAULT),
                            "cannot create dataset '", name, "'"),
            H5Dclose);
  DDPV_HDF5_CHECK(H5Dwrite(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
                  "cannot write dataset '", name, "'");
}

void read_dataset(hid_t loc, const std::string& name, hid_t mem_type, void* data,
                  size_t expected_elements) {
  Handle ds = open_dataset(loc, name);
  Handle space = dataset_space(ds.get());
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  DDPV_CHECK(n >= 0 && static_cast<size_t>(n) == expected_elements, "dataset '", name, "' has ", n,
             " elements, expected ", expected_elements);
  DDPV_HDF5_CHECK(H5Dread(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
                  "cannot read dataset '", name, "'");
}

namespace {
// A whole dataset converted by HDF5 to `mem_type`, with its dims when asked.
template <typename T>
std::vector<T> read_whole(hid_t loc, const std::string& name, hid_t mem_type, const char* type_name,
                          std::vector<int64_t>* dims) {
  Handle ds = open_dataset(loc, name);
  std::vector<int64_t> d = dataset_dims(ds.get());
  // Note [Claimed rows]: the dims are checked against the file before `out` is allocated.
  check_claim(ds.get(), "dataset '" + name + "'", d, type_info(dataset_type(ds.get()).get()).size,
              true, "write it again");
  int64_t n = 1;
  for (int64_t x : d) n *= x;
  std::vector<T> out(static_cast<size_t>(n));
  DDPV_HDF5_CHECK(H5Dread(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()),
                  "cannot read dataset '", name, "' as ", type_name);
  if (dims) *dims = std::move(d);
  return out;
}
}  // namespace

void write_f32(hid_t loc, const std::string& name, const std::vector<int64_t>& dims,
               const float* data) {
  write_dataset(loc, name, dims, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, data);
}

std::vector<float> read_f32(hid_t loc, const std::string& name, std::vector<int64_t>* dims) {
  return read_whole<float>(loc, name, H5T_NATIVE_FLOAT, "float", dims);
}

void write_i64(hid_t loc, const std::string& name, const std::vector<int64_t>& dims,
               const int64_t* data) {
  write_dataset(loc, name, dims, H5T_STD_I64LE, H5T_NATIVE_INT64, data);  // empty dims: a scalar
}

std::vector<int64_t> read_i64(hid_t loc, const std::string& name, std::vector<int64_t>* dims) {
  return read_whole<int64_t>(loc, name, H5T_NATIVE_INT64, "int64", dims);
}

}  // namespace ddpv::h5
