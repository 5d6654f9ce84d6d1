// Well-formed HDF5 files with hostile content, written here from the input's choices, through
// the image store reader: attributes missing, of other types or out of range (NaN and Inf
// statistics, 2^63 classes, too few names), splits with images of other types, ranks and sizes,
// labels out of range or of the wrong width, dims that claim far more rows than were written
// (contiguous, compact and chunked), half-written splits. Raw bytes (store_raw) rarely get
// past libhdf5's own checks to reach ours; these always do.
#include <hdf5.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "fuzz_support.hpp"

namespace {

using ddpv::fuzz::Choices;

// A scalar or 1-d attribute, ignoring failures (a file the library refuses to write is simply
// a file with less in it).
void attr(hid_t loc, const char* name, hid_t type, const void* value, hsize_t n = 0) {
  hid_t space = n == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, nullptr);
  hid_t a = H5Acreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  if (a >= 0) {
    H5Awrite(a, type, value);
    H5Aclose(a);
  }
  H5Sclose(space);
}

void string_attr(hid_t loc, const char* name, const std::vector<std::string>& values, bool vlen,
                 bool scalar) {
  hid_t type = H5Tcopy(H5T_C_S1);
  size_t longest = 1;
  for (const std::string& v : values) longest = std::max(longest, v.size() + 1);
  H5Tset_size(type, vlen ? H5T_VARIABLE : longest);
  std::vector<const char*> ptrs;
  std::vector<char> fixed(values.size() * longest, 0);
  for (size_t i = 0; i < values.size(); ++i) {
    ptrs.push_back(values[i].c_str());
    std::copy(values[i].begin(), values[i].end(), fixed.begin() + static_cast<long>(i * longest));
  }
  const void* buf = vlen ? static_cast<const void*>(ptrs.data()) : fixed.data();
  if (!values.empty()) attr(loc, name, type, buf, scalar ? 0 : values.size());
  H5Tclose(type);
}

std::string text(Choices& c) {
  std::string s;
  for (size_t n = c.pick(12); n > 0; --n) s += static_cast<char>(c.u8());
  return s;
}

double real(Choices& c) {
  const double values[] = {0.5, 0.0, -1.0, std::numeric_limits<double>::quiet_NaN(),
                           std::numeric_limits<double>::infinity(), -0.0, 1e-40, 1e39,
                           std::numeric_limits<double>::denorm_min()};
  return values[c.pick(std::size(values))];
}

// An integer attribute: usually `usual`, else an edge, stored in one of several integer or
// float types, or as a string.
void int_attr(Choices& c, hid_t loc, const char* name, int64_t usual) {
  if (c.pick(16) == 0) return;  // missing
  int64_t v = usual;
  switch (c.pick(8)) {
    case 0: v = static_cast<int64_t>(c.size_claim()); break;
    case 1: v = -static_cast<int64_t>(c.u8()); break;
    case 2: v = static_cast<int64_t>(c.u32()); break;
    default: break;
  }
  switch (c.pick(8)) {
    case 0: { const double d = static_cast<double>(v); attr(loc, name, H5T_NATIVE_DOUBLE, &d); break; }
    case 1: { const uint64_t u = static_cast<uint64_t>(v); attr(loc, name, H5T_NATIVE_UINT64, &u); break; }
    case 2: { const int8_t b = static_cast<int8_t>(v); attr(loc, name, H5T_NATIVE_INT8, &b); break; }
    case 3: string_attr(loc, name, {std::to_string(v)}, true, true); break;
    case 4: { const int64_t two[2] = {v, v}; attr(loc, name, H5T_NATIVE_INT64, two, 2); break; }
    default: attr(loc, name, H5T_NATIVE_INT64, &v); break;
  }
}

// `classes` > 0: int32 labels, mostly in range.
void dataset(Choices& c, hid_t group, const char* name, hid_t type, size_t element,
             std::vector<hsize_t> dims, int64_t classes = 0) {
  const int rank = static_cast<int>(dims.size());
  // Writes stay under 64 KiB: libhdf5 keeps a selection of a few KiB per chunk touched, so a
  // 1 MiB write in chunks of one row cost this harness (not the reader) over 2 GiB.
  hsize_t total = element;
  bool huge = false;
  for (hsize_t d : dims) {
    if (d != 0 && total > (hsize_t{1} << 16) / d) huge = true;
    total *= d;
  }
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  std::vector<hsize_t> maxdims = dims;
  const size_t layout = c.pick(4);
  if (layout <= 1) {  // chunked, extendible: unwritten chunks cost nothing
    maxdims[0] = H5S_UNLIMITED;
    std::vector<hsize_t> chunk(dims.size(), 1);
    for (size_t i = 1; i < dims.size(); ++i) chunk[i] = std::max<hsize_t>(1, std::min<hsize_t>(dims[i], 64));
    chunk[0] = 1 + c.pick(4);
    H5Pset_chunk(dcpl, rank, chunk.data());
    if (c.flag()) H5Pset_deflate(dcpl, 1);
    if (c.flag()) H5Pset_fletcher32(dcpl);
  } else if (layout == 2 && !huge && total < 60000) {
    H5Pset_layout(dcpl, H5D_COMPACT);
  }
  H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_LATE);
  hid_t space = H5Screate_simple(rank, dims.data(), maxdims.data());
  hid_t ds = space < 0 ? -1 : H5Dcreate2(group, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  if (ds >= 0) {
    if (!huge && c.pick(4) != 0) {  // written: the values come from the input
      std::vector<uint8_t> values = c.bytes(static_cast<size_t>(total));
      if (classes > 0 && element == 4 && H5Tget_class(type) == H5T_INTEGER) {
        for (size_t i = 0; i + 4 <= values.size(); i += 4) {
          const int32_t label = values[i + 1] == 0xff ? static_cast<int32_t>(values[i] << 24)
                                                      : static_cast<int32_t>(values[i] % classes);
          std::memcpy(values.data() + i, &label, 4);
        }
      }
      H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
    }
    H5Dclose(ds);
  }
  if (space >= 0) H5Sclose(space);
  H5Pclose(dcpl);
}

}  // namespace

DDPV_FUZZ_TARGET(store_struct) {
  Choices c(data, size);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const std::string& path = ddpv::fuzz::scratch_path();
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) std::abort();

  if (c.pick(16) != 0)
    string_attr(f, "format", {c.pick(8) ? std::string("ddpvision-image-store") : text(c)},
                c.flag(), true);
  int_attr(c, f, "format_version", 1);
  const int64_t classes = 1 + static_cast<int64_t>(c.pick(10));
  int_attr(c, f, "num_classes", classes);
  if (c.pick(16) != 0) {
    std::vector<std::string> names;
    const int64_t n = c.pick(4) ? classes : static_cast<int64_t>(c.pick(12));
    for (int64_t i = 0; i < n; ++i) names.push_back(c.pick(4) ? std::to_string(i) : text(c));
    string_attr(f, "class_names", names, c.flag(), false);
  }
  const int h = 1 + static_cast<int>(c.pick(8)), w = 1 + static_cast<int>(c.pick(8));
  const int ch = c.flag() ? 3 : 1;
  int_attr(c, f, "height", h);
  int_attr(c, f, "width", w);
  int_attr(c, f, "channels", ch);
  for (const char* name : {"mean", "std"}) {
    if (c.pick(16) == 0) continue;
    std::vector<double> v(c.pick(4) ? static_cast<size_t>(ch) : c.pick(5));
    for (double& x : v) x = c.pick(3) ? 0.25 : real(c);
    if (v.empty()) continue;
    if (c.flag()) {
      attr(f, name, H5T_NATIVE_DOUBLE, v.data(), v.size());
    } else {
      std::vector<float> narrow(v.size());
      for (size_t i = 0; i < v.size(); ++i)  // through memcpy of the bits: 1e39 becomes Inf
        narrow[i] = std::isfinite(v[i]) && std::fabs(v[i]) > 3e38 ? HUGE_VALF : static_cast<float>(v[i]);
      attr(f, name, H5T_NATIVE_FLOAT, narrow.data(), narrow.size());
    }
  }
  if (c.flag()) string_attr(f, "source", {text(c)}, c.flag(), true);

  const char* split_names[] = {"train", "test", "val", "x"};
  for (size_t s = 0, splits = c.pick(4); s < splits; ++s) {
    hid_t g = H5Gcreate2(f, split_names[s], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0) continue;
    const hsize_t rows = c.pick(4) ? c.pick(6) : c.size_claim() >> (c.pick(2) * 20);
    if (c.pick(12) != 0) {
      std::vector<hsize_t> dims = {rows, static_cast<hsize_t>(h), static_cast<hsize_t>(w),
                                   static_cast<hsize_t>(ch)};
      if (c.pick(8) == 0) dims[1 + c.pick(3)] += 1;
      if (c.pick(12) == 0) dims.pop_back();
      const hid_t types[] = {H5T_STD_U8LE, H5T_STD_I8LE, H5T_STD_U16LE, H5T_IEEE_F32LE};
      const size_t t = c.pick(8) ? 0 : c.pick(4);
      dataset(c, g, "images", types[t], t == 0 || t == 1 ? 1 : t == 2 ? 2 : 4, dims);
    }
    if (c.pick(12) != 0) {
      std::vector<hsize_t> dims = {c.pick(6) ? rows : rows + c.pick(3)};
      if (c.pick(12) == 0) dims.push_back(2);
      const hid_t types[] = {H5T_STD_I32LE, H5T_STD_I64LE, H5T_STD_U8LE, H5T_IEEE_F32LE};
      const size_t t = c.pick(8) ? 0 : c.pick(4);
      dataset(c, g, "labels", types[t], t == 0 || t == 3 ? 4 : t == 1 ? 8 : 1, dims, classes);
    }
    H5Gclose(g);
  }
  if (H5Fclose(f) < 0) std::abort();
  ddpv::fuzz::read_store(path);
  return 0;
}
