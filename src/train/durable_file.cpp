// Crash-safe file replacement (Note [Atomic replace] in durable_file.hpp).
#include "train/durable_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "ddpv/core/error.hpp"

namespace fs = std::filesystem;

namespace ddpv::durable {
namespace {

[[noreturn]] void fail_write(const std::string& tmp, int err, size_t done, size_t size) {
  if (err == ENOSPC || err == EDQUOT)
    DDPV_FAIL("no space left for ", tmp, " (", done, " of ", size,
              " bytes written: ", std::strerror(err),
              "); free space on that file system or give another "
              "--checkpoint-dir");
  DDPV_FAIL("writing ", tmp, " failed after ", done, " of ", size, " bytes: ", std::strerror(err));
}

void rename_durably(const std::string& tmp, const std::string& path) {
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    DDPV_FAIL("cannot rename ", tmp, " to ", path, ": ", std::strerror(errno));
  fsync_path(parent_dir(path));
}

}  // namespace

void fsync_path(const std::string& path) {
  // O_RDONLY is enough for fsync on Linux, and the only way to open a directory.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) DDPV_FAIL("cannot open ", path, " to sync it to disk: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems (and /proc-like mounts) cannot fsync a directory: that is no data loss.
  if (rc != 0 && err != EINVAL && err != ENOTSUP)
    DDPV_FAIL("fsync of ", path, " failed: ", std::strerror(err));
}

std::string parent_dir(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

void commit(const std::string& tmp, const std::string& path) {
  fsync_path(tmp);
  rename_durably(tmp, path);
}

void write_file(const std::string& path, const void* data, size_t size) {
  const std::string tmp = path + ".tmp";
  try {
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
      DDPV_FAIL("cannot write ", tmp, ": ", std::strerror(errno),
                " (check the directory exists and is writable)");
    const auto* p = static_cast<const char*>(data);
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::write(fd, p + done, size - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n < 0 ? errno : ENOSPC;  // a write of 0 bytes: the disk is full
        ::close(fd);
        fail_write(tmp, err, done, size);
      }
      done += static_cast<size_t>(n);
    }
    // Network file systems report a full disk at fsync or close, not at write.
    if (::fsync(fd) != 0) {
      const int err = errno;
      ::close(fd);
      fail_write(tmp, err, done, size);
    }
    if (::close(fd) != 0) fail_write(tmp, errno, done, size);
    rename_durably(tmp, path);
  } catch (...) {
    remove_quietly(tmp);
    throw;
  }
}

void write_text(const std::string& path, const std::string& text) {
  write_file(path, text.data(), text.size());
}

void remove_quietly(const std::string& path) noexcept {
  std::error_code ec;
  fs::remove(path, ec);
}

}  // namespace ddpv::durable
