// The node's physical memory, which a size read from a file is checked against before it is
// allocated: a corrupt or hostile size then fails with a message, not std::bad_alloc or the OOM
// killer.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace ddpv {

inline uint64_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return UINT64_MAX;  // unknown: no limit
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

// "12.5 GiB"
inline std::string gib_text(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace ddpv
