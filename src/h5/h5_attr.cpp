// HDF5 attribute helpers: strings (fixed or variable length), integers, floats and float arrays.
#include <cstdlib>
#include <cstring>

#include "ddpv/h5/h5.hpp"

namespace ddpv::h5 {
namespace {

Handle scalar_space() {
  return Handle(DDPV_HDF5_CHECK(H5Screate(H5S_SCALAR), "cannot create scalar dataspace"), H5Sclose);
}

Handle vector_space(size_t n) {
  const hsize_t dims[1] = {n};
  return Handle(DDPV_HDF5_CHECK(H5Screate_simple(1, dims, nullptr), "cannot create dataspace"),
                H5Sclose);
}

Handle vlen_string_type() {
  Handle t(DDPV_HDF5_CHECK(H5Tcopy(H5T_C_S1), "cannot copy string type"), H5Tclose);
  DDPV_HDF5_CHECK(H5Tset_size(t.get(), H5T_VARIABLE), "cannot set string size");
  DDPV_HDF5_CHECK(H5Tset_cset(t.get(), H5T_CSET_UTF8), "cannot set string charset");
  return t;
}

// Replaces an attribute of the same name, so writers may rewrite one (e.g. a checkpoint's step).
void write_attr(hid_t loc, const std::string& name, hid_t file_type, hid_t space, hid_t mem_type,
                const void* data) {
  quiet_errors();
  if (H5Aexists(loc, name.c_str()) > 0)
    DDPV_HDF5_CHECK(H5Adelete(loc, name.c_str()), "cannot replace attribute '", name, "'");
  Handle attr(
      DDPV_HDF5_CHECK(H5Acreate2(loc, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT),
                      "cannot create attribute '", name, "'"),
      H5Aclose);
  DDPV_HDF5_CHECK(H5Awrite(attr.get(), mem_type, data), "cannot write attribute '", name, "'");
}

struct OpenAttr {
  Handle attr, type, space;
  size_t count = 0;
};

OpenAttr open_attr(hid_t loc, const std::string& name) {
  quiet_errors();
  DDPV_CHECK(has_attr(loc, name), "attribute '", name, "' is missing");
  OpenAttr a;
  a.attr = Handle(DDPV_HDF5_CHECK(H5Aopen(loc, name.c_str(), H5P_DEFAULT),
                                  "cannot open attribute '", name, "'"),
                  H5Aclose);
  a.type = Handle(DDPV_HDF5_CHECK(H5Aget_type(a.attr.get()), "attribute type"), H5Tclose);
  a.space = Handle(DDPV_HDF5_CHECK(H5Aget_space(a.attr.get()), "attribute space"), H5Sclose);
  a.count = static_cast<size_t>(
      DDPV_HDF5_CHECK(H5Sget_simple_extent_npoints(a.space.get()), "attribute size"));
  return a;
}

template <typename T>
std::vector<T> read_numeric(hid_t loc, const std::string& name, H5T_class_t want, hid_t mem) {
  OpenAttr a = open_attr(loc, name);
  const H5T_class_t cls = H5Tget_class(a.type.get());
  const bool ok = cls == want || (want == H5T_FLOAT && cls == H5T_INTEGER);
  DDPV_CHECK(ok, "attribute '", name, "' is ", type_info(a.type.get()).str(), ", expected ",
             want == H5T_FLOAT ? "a number" : "an integer");
  std::vector<T> v(a.count);
  DDPV_HDF5_CHECK(H5Aread(a.attr.get(), mem, v.data()), "cannot read attribute '", name, "'");
  return v;
}

}  // namespace

bool has_attr(hid_t loc, const std::string& name) {
  quiet_errors();
  const htri_t r = H5Aexists(loc, name.c_str());
  if (r < 0) H5Eclear2(H5E_DEFAULT);
  return r > 0;
}

void write_attr_string(hid_t loc, const std::string& name, const std::string& value) {
  Handle type = vlen_string_type();
  Handle space = scalar_space();
  const char* p = value.c_str();
  write_attr(loc, name, type.get(), space.get(), type.get(), &p);
}

void write_attr_strings(hid_t loc, const std::string& name, const std::vector<std::string>& v) {
  Handle type = vlen_string_type();
  Handle space = vector_space(v.size());
  std::vector<const char*> ptrs;
  for (const auto& s : v) ptrs.push_back(s.c_str());
  write_attr(loc, name, type.get(), space.get(), type.get(), ptrs.data());
}

void write_attr_i64(hid_t loc, const std::string& name, int64_t value) {
  Handle space = scalar_space();
  write_attr(loc, name, H5T_STD_I64LE, space.get(), H5T_NATIVE_INT64, &value);
}

void write_attr_f64(hid_t loc, const std::string& name, double value) {
  Handle space = scalar_space();
  write_attr(loc, name, H5T_IEEE_F64LE, space.get(), H5T_NATIVE_DOUBLE, &value);
}

void write_attr_u64(hid_t loc, const std::string& name, uint64_t value) {
  Handle space = scalar_space();
  write_attr(loc, name, H5T_STD_U64LE, space.get(), H5T_NATIVE_UINT64, &value);
}

void write_attr_u64s(hid_t loc, const std::string& name, const std::vector<uint64_t>& values) {
  Handle space = vector_space(values.size());
  write_attr(loc, name, H5T_STD_U64LE, space.get(), H5T_NATIVE_UINT64, values.data());
}

void write_attr_f32s(hid_t loc, const std::string& name, const std::vector<float>& values) {
  Handle space = vector_space(values.size());
  write_attr(loc, name, H5T_IEEE_F32LE, space.get(), H5T_NATIVE_FLOAT, values.data());
}

std::vector<std::string> read_attr_strings(hid_t loc, const std::string& name) {
  OpenAttr a = open_attr(loc, name);
  DDPV_CHECK(H5Tget_class(a.type.get()) == H5T_STRING, "attribute '", name, "' is ",
             type_info(a.type.get()).str(), ", expected a string");
  std::vector<std::string> out;
  if (H5Tis_variable_str(a.type.get()) > 0) {
    // Note [Variable-length base size]: libhdf5 sizes its conversion buffer as the stored
    // length times the base type's size, both read from the file; a damaged datatype message
    // that claims 4 GiB characters makes one short string cost gigabytes before a byte is read.
    Handle base(H5Tget_super(a.type.get()), H5Tclose);
    DDPV_CHECK(base.get() >= 0 && H5Tget_size(base.get()) == 1, "attribute '", name,
               "' is a variable-length string whose characters are not one byte: the file is "
               "damaged");
    Handle mem = vlen_string_type();
    std::vector<char*> ptrs(a.count, nullptr);
    DDPV_HDF5_CHECK(H5Aread(a.attr.get(), mem.get(), ptrs.data()), "cannot read attribute '", name,
                    "'");
    for (char* p : ptrs) out.emplace_back(p ? p : "");
    H5Dvlen_reclaim(mem.get(), a.space.get(), H5P_DEFAULT, ptrs.data());
  } else {
    const size_t size = H5Tget_size(a.type.get());
    std::vector<char> buf(size * a.count + 1, '\0');
    DDPV_HDF5_CHECK(H5Aread(a.attr.get(), a.type.get(), buf.data()), "cannot read attribute '",
                    name, "'");
    for (size_t i = 0; i < a.count; ++i) {
      const char* s = buf.data() + i * size;
      out.emplace_back(s, strnlen(s, size));  // fixed strings may be null- or space-padded
      while (!out.back().empty() && out.back().back() == ' ') out.back().pop_back();
    }
  }
  return out;
}

std::string read_attr_string(hid_t loc, const std::string& name) {
  std::vector<std::string> v = read_attr_strings(loc, name);
  DDPV_CHECK(v.size() == 1, "attribute '", name, "' holds ", v.size(), " strings, expected one");
  return v[0];
}

int64_t read_attr_i64(hid_t loc, const std::string& name) {
  std::vector<int64_t> v = read_numeric<int64_t>(loc, name, H5T_INTEGER, H5T_NATIVE_INT64);
  DDPV_CHECK(v.size() == 1, "attribute '", name, "' holds ", v.size(), " values, expected one");
  return v[0];
}

double read_attr_f64(hid_t loc, const std::string& name) {
  std::vector<double> v = read_attr_f64s(loc, name);
  DDPV_CHECK(v.size() == 1, "attribute '", name, "' holds ", v.size(), " values, expected one");
  return v[0];
}

std::vector<double> read_attr_f64s(hid_t loc, const std::string& name) {
  return read_numeric<double>(loc, name, H5T_FLOAT, H5T_NATIVE_DOUBLE);
}

std::vector<uint64_t> read_attr_u64s(hid_t loc, const std::string& name) {
  return read_numeric<uint64_t>(loc, name, H5T_INTEGER, H5T_NATIVE_UINT64);
}

}  // namespace ddpv::h5
