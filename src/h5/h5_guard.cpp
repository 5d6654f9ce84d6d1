// HDF5 helpers for files that lie or fail: dims checked against what a file holds (Note
// [Claimed rows]) and a written file given up without HDF5 crashing at exit (Note [Abandoning
// a file]); both notes are in h5.hpp.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ddpv/h5/h5.hpp"

namespace ddpv::h5 {

namespace {
std::string dims_text(const std::vector<int64_t>& dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + ")";
}
}  // namespace

void check_claim(hid_t ds, const std::string& what, const std::vector<int64_t>& dims,
                 uint64_t element_bytes, bool every_chunk, const std::string& remedy) {
  const std::string corrupt = ": a truncated or corrupt file (" + remedy + ")";
  uint64_t bytes = element_bytes;
  for (int64_t d : dims) {
    DDPV_CHECK(d >= 0 && !__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes) &&
                   bytes <= static_cast<uint64_t>(INT64_MAX),
               what, " declares dims ", dims_text(dims), ", more bytes than any file holds",
               corrupt);
  }
  if (bytes == 0) return;
  Handle plist(DDPV_HDF5_CHECK(H5Dget_create_plist(ds), what, ": no properties"), H5Pclose);
  const H5D_layout_t layout = H5Pget_layout(plist.get());
  DDPV_CHECK(layout != H5D_VIRTUAL, what,
             " is a virtual dataset (its data lives in other files), which is not supported");
  const std::string claim = what + " claims " + std::to_string(dims.empty() ? 1 : dims[0]) +
                            " rows (dims " + dims_text(dims) + ", " + std::to_string(bytes) +
                            " bytes)";
  // The larger of the file's end and its end of allocation; a file shorter than the latter
  // does not open, so this is at most what is on disk.
  Handle file(DDPV_HDF5_CHECK(H5Iget_file_id(ds), what, ": no file"), H5Fclose);
  hsize_t file_bytes = 0;
  DDPV_HDF5_CHECK(H5Fget_filesize(file.get(), &file_bytes), what, ": no file size");
  DDPV_CHECK(H5Pget_nfilters(plist.get()) > 0 || bytes <= file_bytes, claim, " but the file has ",
             file_bytes, " bytes", corrupt);
  if (layout != H5D_CHUNKED) {
    const uint64_t stored = H5Dget_storage_size(ds);
    DDPV_CHECK(stored >= bytes, claim, " but stores ", stored, " bytes", corrupt);
    return;
  }
  std::vector<hsize_t> chunk(dims.size());
  DDPV_HDF5_CHECK(H5Pget_chunk(plist.get(), static_cast<int>(chunk.size()), chunk.data()), what,
                  ": bad chunking");
  if (every_chunk) {
    uint64_t needed = 1;
    for (size_t i = 0; i < dims.size(); ++i)  // at most `bytes`: no overflow
      needed *= (static_cast<uint64_t>(dims[i]) + chunk[i] - 1) / chunk[i];
    hsize_t allocated = 0;
    Handle space = dataset_space(ds);
    DDPV_HDF5_CHECK(H5Dget_num_chunks(ds, space.get(), &allocated), what, ": cannot count chunks");
    DDPV_CHECK(allocated >= needed, claim, " but only ", allocated, " of the ", needed,
               " chunks those need are in the file", corrupt);
    return;
  }
  std::vector<hsize_t> last(dims.size(), 0);
  last[0] = (static_cast<hsize_t>(dims[0]) - 1) / chunk[0] * chunk[0];
  unsigned mask = 0;
  haddr_t addr = HADDR_UNDEF;
  hsize_t size = 0;
  DDPV_HDF5_CHECK(H5Dget_chunk_info_by_coord(ds, last.data(), &mask, &addr, &size), what,
                  ": cannot look up its last chunk");
  DDPV_CHECK(addr != HADDR_UNDEF && size > 0, claim,
             " but the chunk of its last row is not in the file", corrupt);
}

namespace {
// The POSIX descriptor under an HDF5 file of the default (sec2) driver; -1 for other drivers.
int posix_fd(hid_t file) {
  int fd = -1;
  const hid_t fapl = H5Fget_access_plist(file);
  void* handle = nullptr;
  if (fapl >= 0 && H5Pget_driver(fapl) == H5FD_SEC2 &&
      H5Fget_vfd_handle(file, fapl, &handle) >= 0 && handle != nullptr)
    fd = *static_cast<int*>(handle);
  if (fapl >= 0) H5Pclose(fapl);
  H5Eclear2(H5E_DEFAULT);
  return fd;
}
}  // namespace

void reserve_for_flush(hid_t file, const std::string& path) {
  quiet_errors();
  const int fd = posix_fd(file);
  hsize_t size = 0;
  if (fd < 0 || H5Fget_filesize(file, &size) < 0) return;
  if (fallocate(fd, 0, 0, static_cast<off_t>(size)) == 0) return;
  const int err = errno;
  DDPV_CHECK(err != ENOSPC && err != EDQUOT && err != EFBIG, path, ": cannot reserve the ", size,
             " bytes of the file: ", std::strerror(err));
  // Any other error: fallocate is not supported here (NFSv3, some FUSE and parallel file
  // systems), so the holes the flush may fill are compared with the free space instead.
  struct stat st {};
  struct statvfs vfs {};
  if (fstat(fd, &st) != 0 || fstatvfs(fd, &vfs) != 0) return;
  const uint64_t held = static_cast<uint64_t>(st.st_blocks) * 512;
  const uint64_t need = size > held ? size - held : 0;
  DDPV_CHECK(static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize >= need, path, ": cannot write ",
             need, " more bytes: ", std::strerror(ENOSPC));
}

void discard_writes(hid_t file) noexcept {
  quiet_errors();
  const int fd = posix_fd(file);
  if (fd < 0) return;
  const int sink = memfd_create("ddpv-discarded-hdf5", MFD_CLOEXEC);
  if (sink >= 0) {
    dup2(sink, fd);  // fd now writes to memory; the file's own description is released
    ::close(sink);
  } else {
    (void)!ftruncate(fd, 0);  // no memfd: at least give the disk space back for the flush
  }
}

}  // namespace ddpv::h5
