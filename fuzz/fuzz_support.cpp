#include "fuzz_support.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "ddpv/core/error.hpp"
#include "ddpv/data/image_store.hpp"

namespace ddpv::fuzz {

std::vector<Target>& targets() {
  static std::vector<Target> all;
  return all;
}

uint64_t Choices::size_claim() {
  switch (u8() % 8) {
    case 0: return 0;
    case 1: return 1;
    case 2: return uint64_t{1} << (u8() % 64);
    case 3: return ~uint64_t{0} >> (u8() % 64);
    default: return u8() % 16;
  }
}

std::vector<uint8_t> Choices::bytes(size_t n) {
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = u8();
  return v;
}

namespace {
struct Scratch {
  std::string path;
  Scratch() {
    const char* dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : std::getenv("TMPDIR");
    path = std::string(dir ? dir : "/tmp") + "/ddpv-fuzz-" + std::to_string(getpid()) + ".h5";
  }
  ~Scratch() { std::remove(path.c_str()); }
};
}  // namespace

const std::string& scratch_path() {
  static Scratch s;
  return s.path;
}

void write_scratch(const uint8_t* data, size_t size) {
  std::ofstream out(scratch_path(), std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", scratch_path().c_str());
    std::abort();
  }
}

void read_store(const std::string& path) {
  try {
    const ImageStore store(path);
    for (const std::string& split : store.splits()) {
      const int64_t n = store.split_size(split);
      if (static_cast<int64_t>(store.labels(split).size()) != n) std::abort();
      for (int32_t l : store.labels(split))
        if (l < 0 || l >= store.num_classes()) std::abort();
      if (n == 0) continue;
      const std::vector<int64_t> rows = {n - 1, 0, n / 2, n - 1};
      std::vector<uint8_t> out(rows.size() * static_cast<size_t>(store.image_bytes()));
      store.read_rows(split, rows, out.data());
      const int64_t count = std::min<int64_t>(n, 3);
      store.read_range(split, n - count, count, out.data());
    }
  } catch (const Error&) {
  }
}

}  // namespace ddpv::fuzz
