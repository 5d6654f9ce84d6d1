// Checkpoint directory management: file names, the `latest` pointer, the files `--resume auto`
// walks back through, stale temporaries, and pruning that counts only checkpoints that verify.
#include <sys/stat.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <tuple>
#include <vector>

#include "ddpv/core/log.hpp"
#include "ddpv/train/checkpoint.hpp"
#include "train/checkpoint_image.hpp"
#include "train/durable_file.hpp"

namespace fs = std::filesystem;

namespace ddpv {
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

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// The first line of `latest`, trimmed; "" when it cannot be read.
std::string read_latest_name(const fs::path& latest) {
  std::ifstream in(latest);
  std::string line;
  std::getline(in, line);
  return trim(line);
}

// Size and modification time (ns), which a rewritten file changes; false when absent.
bool file_stamp(const std::string& path, FileCheck* stamp) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  stamp->size = static_cast<uintmax_t>(st.st_size);
  stamp->mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return true;
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
  const std::string name = read_latest_name(latest);
  DDPV_CHECK(!name.empty(), latest.string(), " is empty; remove it or pass --resume PATH");
  const fs::path target = fs::path(dir) / name;
  DDPV_CHECK(fs::is_regular_file(target, ec), latest.string(), " names ", target.string(),
             ", which does not exist; remove ", latest.string(), " or pass --resume PATH");
  return target.string();
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  struct Entry {
    int64_t epoch, step;
    std::string name;
  };
  std::vector<Entry> entries;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    Entry e{0, 0, de.path().filename().string()};
    if (de.is_regular_file(ec) && parse_checkpoint_name(e.name, &e.epoch, &e.step))
      entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.epoch, a.step, a.name) > std::tie(b.epoch, b.step, b.name);  // newest first
  });
  std::vector<std::string> names;
  for (Entry& e : entries) names.push_back(std::move(e.name));
  return names;
}

std::vector<std::string> resume_candidates(const std::string& dir, std::string* why) {
  why->clear();
  const std::vector<std::string> names = list_checkpoints(dir);
  auto paths = [&](const std::vector<std::string>& v) {
    std::vector<std::string> out;
    for (const std::string& n : v) out.push_back((fs::path(dir) / n).string());
    return out;
  };
  const fs::path latest = fs::path(dir) / "latest";
  std::error_code ec;
  if (!fs::exists(latest, ec)) {
    if (!names.empty()) *why = latest.string() + " is missing";
    return paths(names);
  }
  const std::string start = read_latest_name(latest);
  if (start.empty()) {
    *why = latest.string() + " is empty";
    return paths(names);
  }
  if (!fs::is_regular_file(fs::path(dir) / start, ec)) {
    *why = latest.string() + " names " + start + ", which does not exist";
    return paths(names);
  }
  // Note [Walk back]: files newer than the one `latest` names belong to a run that a later
  // resume from an older file replaced; only older ones are a way back.
  std::vector<std::string> out{start};
  int64_t e0 = 0, s0 = 0;
  const bool ordered = parse_checkpoint_name(start, &e0, &s0);
  for (const std::string& n : names) {
    int64_t e = 0, s = 0;
    parse_checkpoint_name(n, &e, &s);
    if (n != start && (!ordered || std::tie(e, s) < std::tie(e0, s0))) out.push_back(n);
  }
  return paths(out);
}

std::vector<std::string> remove_stale_temporaries(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return removed;
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    const std::string name = de.path().filename().string();
    const bool stale =
        name == "latest.tmp" || (name.rfind("ckpt-", 0) == 0 && ends_with(name, ".h5.tmp"));
    if (stale && de.is_regular_file(ec) && fs::remove(de.path(), ec)) removed.push_back(name);
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

bool check_checkpoint_file(const std::string& path, VerifiedFiles* cache, std::string* why,
                           bool* cached) {
  FileCheck stamp;
  const bool stamped = file_stamp(path, &stamp);
  if (cached != nullptr) *cached = false;
  if (cache != nullptr && stamped) {
    const auto it = cache->find(path);
    if (it != cache->end() && it->second.size == stamp.size &&
        it->second.mtime_ns == stamp.mtime_ns) {
      if (cached != nullptr) *cached = true;
      *why = it->second.damage;
      return why->empty();
    }
  }
  why->clear();
  try {
    const ckpt::Bytes bytes = ckpt::read_file(path, /*from_disk=*/true);
    verify_checkpoint_bytes(bytes.data(), bytes.size(), path);
  } catch (const Error& e) {
    *why = e.message();
  }
  if (cache != nullptr && stamped) {
    stamp.damage = *why;
    (*cache)[path] = stamp;
  }
  return why->empty();
}

void verify_checkpoint_file(const std::string& path, VerifiedFiles* cache) {
  std::string why;
  if (!check_checkpoint_file(path, cache, &why)) throw CheckpointDamaged(why, __FILE__, __LINE__);
}

void note_verified(const std::string& path, VerifiedFiles* cache) {
  FileCheck stamp;
  if (file_stamp(path, &stamp)) (*cache)[path] = stamp;
}

void prune_checkpoints(const std::string& dir, int keep, VerifiedFiles* cache) {
  DDPV_CHECK(keep >= 0, "prune_checkpoints: keep must be >= 0, got ", keep);
  if (keep == 0) return;
  // The file `latest` names is never removed, even when newer files exist (a resumed run that
  // went back in time must not lose its starting point).
  std::string latest_name;
  try {
    const std::string latest = find_latest(dir);
    if (!latest.empty()) latest_name = fs::path(latest).filename().string();
  } catch (const Error&) {
    // A dangling `latest` protects nothing; pruning by age is still right.
  }
  // Note [Pruning]: newest first, a file counts towards `keep` only once it verifies; past the
  // newest `keep` good ones, everything goes. A damaged file inside that window stays (it is
  // evidence, and the walk-back skips it) until it ages out.
  int good = 0;
  std::error_code ec;
  for (const std::string& name : list_checkpoints(dir)) {
    const fs::path p = fs::path(dir) / name;
    if (good < keep) {
      std::string why;
      bool cached = false;
      if (check_checkpoint_file(p.string(), cache, &why, &cached)) {
        ++good;
      } else if (!cached) {
        DDPV_WARN(why, "; it does not count among the ", keep, " checkpoints kept");
      }
      continue;
    }
    if (name == latest_name) continue;
    if (!fs::remove(p, ec) && ec)
      DDPV_WARN("could not remove old checkpoint ", p.string(), ": ", ec.message());
  }
}

}  // namespace ddpv
