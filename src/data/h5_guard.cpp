// HDF5 helpers for files that fail: a written file given up without HDF5 crashing at exit
// (Note [Abandoning a file] in h5.hpp).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "data/h5.hpp"

namespace ddpv::h5 {

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
