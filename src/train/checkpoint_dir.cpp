// Checkpoint directory management: file names, the `latest` pointer, pruning of old files, and
// the durable-write helpers of durable_file.hpp (see Note [Atomic replace]).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <tuple>
#include <vector>

#include "ddpv/core/log.hpp"
#include "ddpv/train/checkpoint.hpp"
#include "train/durable_file.hpp"

namespace fs = std::filesystem;

namespace ddpv {
namespace durable {

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
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    DDPV_FAIL("cannot rename ", tmp, " to ", path, ": ", std::strerror(errno));
  fsync_path(parent_dir(path));
}

void write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  try {
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (f == nullptr)
      DDPV_FAIL("cannot write ", tmp, ": ", std::strerror(errno),
                " (check the directory exists and is writable)");
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    const bool closed = std::fclose(f) == 0;
    if (!ok || !closed) DDPV_FAIL("writing ", tmp, " failed: ", std::strerror(errno));
    commit(tmp, path);
  } catch (...) {
    remove_quietly(tmp);
    throw;
  }
}

void remove_quietly(const std::string& path) noexcept {
  std::error_code ec;
  fs::remove(path, ec);
}

}  // namespace durable

namespace {

// Parses "ckpt-e<epoch>-s<step>.h5"; false for any other name (including "*.h5.tmp").
bool parse_checkpoint_name(const std::string& name, int64_t* epoch, int64_t* step) {
  long long e = 0, s = 0;
  int consumed = 0;
  if (std::sscanf(name.c_str(), "ckpt-e%lld-s%lld.h5%n", &e, &s, &consumed) != 2) return false;
  if (static_cast<size_t>(consumed) != name.size()) return false;
  *epoch = e;
  *step = s;
  return true;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

}  // namespace

std::string checkpoint_file_name(int64_t epoch, int64_t step) {
  // Zero-padded so that `ls` lists checkpoints in training order.
  char buf[64];
  std::snprintf(buf, sizeof(buf), "ckpt-e%04" PRId64 "-s%08" PRId64 ".h5", epoch, step);
  return buf;
}

void update_latest(const std::string& dir, const std::string& file_name) {
  DDPV_CHECK(!file_name.empty() && file_name.find('/') == std::string::npos,
             "update_latest: expected a file name inside ", dir, ", got '", file_name, "'");
  durable::write_text((fs::path(dir) / "latest").string(), file_name + "\n");
}

std::string find_latest(const std::string& dir) {
  const fs::path latest = fs::path(dir) / "latest";
  std::error_code ec;
  if (!fs::exists(latest, ec)) return "";
  std::ifstream in(latest);
  DDPV_CHECK(in.good(), "cannot read ", latest.string());
  std::string line;
  std::getline(in, line);
  const std::string name = trim(line);
  DDPV_CHECK(!name.empty(), latest.string(), " is empty; remove it or pass --resume PATH");
  const fs::path target = fs::path(dir) / name;
  DDPV_CHECK(fs::is_regular_file(target, ec), latest.string(), " names ", target.string(),
             ", which does not exist; remove ", latest.string(), " or pass --resume PATH");
  return target.string();
}

void prune_checkpoints(const std::string& dir, int keep) {
  DDPV_CHECK(keep >= 0, "prune_checkpoints: keep must be >= 0, got ", keep);
  if (keep == 0) return;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  struct Entry {
    int64_t epoch, step;
    std::string name;
  };
  std::vector<Entry> entries;
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    Entry e{0, 0, de.path().filename().string()};
    if (de.is_regular_file(ec) && parse_checkpoint_name(e.name, &e.epoch, &e.step))
      entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.epoch, a.step, a.name) > std::tie(b.epoch, b.step, b.name);  // newest first
  });
  // The file `latest` names is never removed, even when newer files exist (a resumed run that
  // went back in time must not lose its starting point).
  std::string latest_name;
  try {
    const std::string latest = find_latest(dir);
    if (!latest.empty()) latest_name = fs::path(latest).filename().string();
  } catch (const Error&) {
    // A dangling `latest` protects nothing; pruning by age is still right.
  }
  for (size_t i = static_cast<size_t>(keep); i < entries.size(); ++i) {
    if (entries[i].name == latest_name) continue;
    const fs::path p = fs::path(dir) / entries[i].name;
    if (!fs::remove(p, ec) && ec)
      DDPV_WARN("could not remove old checkpoint ", p.string(), ": ", ec.message());
  }
}

}  // namespace ddpv
