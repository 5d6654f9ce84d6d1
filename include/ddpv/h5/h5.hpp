// HDF5 helpers: the DDPV_HDF5_CHECK macro, RAII handles and small read/write helpers for
// datasets, groups and attributes. Their own target (ddpv_h5), which the image store (data),
// the checkpoints (train) and the data tools build their HDF5 code on.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ddpv/core/error.hpp"

namespace ddpv::h5 {

// Note [HDF5 errors]: HDF5 prints its whole error stack to stderr by default, dozens of lines
// per failure and from every thread. We switch that off (per thread: the thread-safe build keeps
// the setting per thread) and fold the innermost useful lines of the stack into the one-line
// ddpv::Error instead. Every handle constructor calls quiet_errors(), so the loader thread and
// the main thread are both covered without a global initialiser.
void quiet_errors();
// The current thread's error stack as one line ("H5Fopen: unable to open file: file signature
// not found"), then cleared. Empty when the stack is empty.
std::string take_error_stack();

template <typename T, typename MessageFn>
T checked(T value, const char* file, int line, MessageFn&& message) {
  if (value < 0) [[unlikely]] {
    std::string stack = take_error_stack();
    ::ddpv::throw_error(message() + (stack.empty() ? "" : " (" + stack + ")"), file, line);
  }
  return value;
}

// A move-only owner of one hid_t and the H5?close function that releases it.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer close) : id_(id), close_(close) {}
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, -1)), close_(o.close_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, -1);
      close_ = o.close_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset() noexcept {
    if (id_ >= 0 && close_) close_(id_);  // a failed close cannot be reported from here
    id_ = -1;
  }
  // Closes now and reports failure (a file close is where buffered writes hit the disk).
  void close(const std::string& what);
  // Gives up ownership: the id, for a caller that closes it itself.
  hid_t release() noexcept { return std::exchange(id_, -1); }

 private:
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

// Note [Abandoning a file]: HDF5 1.10 does not survive a failed close. When H5Fclose's flush
// fails (a full disk, a quota), H5F__dest frees the file but leaves its id registered, and the
// library's atexit handler later closes that freed file: a segfault after the error message
// (found with gdb: H5_term_library -> H5F__close_cb; fixed upstream in 2023, HDFGroup/hdf5
// PR 2291). A failed H5Dclose leaves its id behind the same way, and a failed H5Fflush leaves
// the metadata cache unable to flush again ("slist already enabled?"). So a writer
//   - writes its chunks without a chunk cache, so a full disk fails in H5Dwrite (which HDF5
//     survives) and a dataset's close has nothing to write;
//   - calls reserve_for_flush() before its last H5Fflush: the disk blocks of the whole file are
//     allocated (fallocate), so a full disk or a quota fails there, recoverably;
//   - gives a file up with discard_writes() first: the sec2 driver's descriptor is pointed at an
//     anonymous memory file (memfd), so the flushes of the closes that follow succeed and go
//     nowhere; then it closes every dataset, group and the file, and removes the file by name.
// A memory file has the same size limit as any (RLIMIT_FSIZE, `ulimit -f`): under one, a writer
// stops before a write would pass it (StoreWriter's check_size_limit).
void reserve_for_flush(hid_t file, const std::string& path);
void discard_writes(hid_t file) noexcept;

// ---- files and groups ----------------------------------------------------------------------
bool is_hdf5(const std::string& path);  // false for a missing or non-HDF5 file, never throws
Handle open_file(const std::string& path, bool writable = false);
Handle create_file(const std::string& path);  // truncates
Handle open_group(hid_t loc, const std::string& name);
Handle create_group(hid_t loc, const std::string& name);
bool exists(hid_t loc, const std::string& path);  // every component of a/b/c, never throws
bool is_group(hid_t loc, const std::string& name);
bool is_dataset(hid_t loc, const std::string& name);
std::vector<std::string> child_names(hid_t group);  // in name order

// ---- datasets ------------------------------------------------------------------------------
Handle open_dataset(hid_t loc, const std::string& name);
// With a chunk cache of `cache_bytes` (0: none, so unfiltered chunks are read in place).
Handle open_dataset(hid_t loc, const std::string& name, size_t cache_bytes);
Handle dataset_space(hid_t dataset);
Handle dataset_type(hid_t dataset);
std::vector<int64_t> dataset_dims(hid_t dataset);

// Note [Claimed rows]: a dataset's dims are only a claim. A corrupt or hostile file may declare
// 2^40 rows (a chunked dataset extended but never written costs a few bytes), and a reader
// allocates from them. check_claim() throws "<what> claims N rows (dims, bytes) but ..." unless
//   - the dims' byte count fits in int64 (no overflow, no dim >= 2^63);
//   - a contiguous or compact dataset stores all of those bytes;
//   - unfiltered data is no larger than the file (compressed data legitimately is);
//   - a chunked dataset has every chunk its dims need (every_chunk: H5Dget_num_chunks walks
//     the chunk index), or else the chunk of its last row (one index lookup);
//   - it is not a virtual dataset (data in other files: none of this can be checked).
// `remedy` ends the message ("convert the data again").
void check_claim(hid_t dataset, const std::string& what, const std::vector<int64_t>& dims,
                 uint64_t element_bytes, bool every_chunk, const std::string& remedy);

// What a stored type is, in terms a validator can put in a message ("int32", "float64").
struct TypeInfo {
  H5T_class_t cls = H5T_NO_CLASS;
  size_t size = 0;
  bool is_signed = false;
  std::string str() const;
};
TypeInfo type_info(hid_t type);

// Filters of a chunked dataset, for inspection.
struct Layout {
  bool chunked = false;
  std::vector<int64_t> chunk_dims;
  std::vector<std::string> filters;  // "deflate(6)", "shuffle", "fletcher32"
};
Layout dataset_layout(hid_t dataset);

// Whole-dataset helpers; `mem_type` is a native type (H5T_NATIVE_FLOAT, ...), HDF5 converts.
void write_dataset(hid_t loc, const std::string& name, const std::vector<int64_t>& dims,
                   hid_t file_type, hid_t mem_type, const void* data);
void read_dataset(hid_t loc, const std::string& name, hid_t mem_type, void* data,
                  size_t expected_elements);
void write_f32(hid_t loc, const std::string& name, const std::vector<int64_t>& dims,
               const float* data);
std::vector<float> read_f32(hid_t loc, const std::string& name, std::vector<int64_t>* dims);
// int64 datasets; empty dims write a scalar (rank-0) dataset, as PyTorch's 0-dim tensors.
void write_i64(hid_t loc, const std::string& name, const std::vector<int64_t>& dims,
               const int64_t* data);
std::vector<int64_t> read_i64(hid_t loc, const std::string& name, std::vector<int64_t>* dims);

// ---- attributes ----------------------------------------------------------------------------
bool has_attr(hid_t loc, const std::string& name);
void write_attr_string(hid_t loc, const std::string& name, const std::string& value);
void write_attr_strings(hid_t loc, const std::string& name, const std::vector<std::string>& v);
void write_attr_i64(hid_t loc, const std::string& name, int64_t value);
void write_attr_f64(hid_t loc, const std::string& name, double value);
void write_attr_f32s(hid_t loc, const std::string& name, const std::vector<float>& values);
void write_attr_u64(hid_t loc, const std::string& name, uint64_t value);
void write_attr_u64s(hid_t loc, const std::string& name, const std::vector<uint64_t>& values);
// Readers accept fixed or variable-length strings and any integer or float width, so files
// written by h5py or another tool read the same; they throw naming the attribute on mismatch.
std::string read_attr_string(hid_t loc, const std::string& name);
std::vector<std::string> read_attr_strings(hid_t loc, const std::string& name);
int64_t read_attr_i64(hid_t loc, const std::string& name);
double read_attr_f64(hid_t loc, const std::string& name);
std::vector<double> read_attr_f64s(hid_t loc, const std::string& name);
std::vector<uint64_t> read_attr_u64s(hid_t loc, const std::string& name);  // any integer width

}  // namespace ddpv::h5

// Checks an HDF5 call (negative return = failure) and evaluates to its result:
//   h5::Handle f(DDPV_HDF5_CHECK(H5Fopen(p, ...), "cannot open ", p), H5Fclose);
// The streamed message is built only on failure.
#define DDPV_HDF5_CHECK(expr, ...)                \
  ::ddpv::h5::checked((expr), __FILE__, __LINE__, \
                      [&] { return ::ddpv::detail::concat(__VA_ARGS__); })
