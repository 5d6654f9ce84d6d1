// What the fuzz targets share (docs/fuzzing.md): the target macro, a reader of the input's
// bytes as choices, and a per-process file for readers that take a path.
//
// Note [One source, two programs]: each targets/<name>.cpp defines one DDPV_FUZZ_TARGET. Built
// with DDPV_LIBFUZZER (scripts/fuzz.sh: clang, ASan + UBSan) it is LLVMFuzzerTestOneInput of
// its own ddpv-fuzz-<name> program; otherwise it registers itself with ddpv-fuzz-replay, which
// runs the seed corpora and the regression inputs through every target in `make test` and
// `make sanitize`. A target returns normally for input our code refuses with a ddpv::Error (a
// one-line message is what bad input should get); anything else escaping it (std::bad_alloc,
// a std::filesystem error, an abort of ours) is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddpv::fuzz {

using TargetFn = int (*)(const uint8_t* data, size_t size);

struct Target {
  const char* name;
  TargetFn fn;
};
std::vector<Target>& targets();  // the registered ones (ddpv-fuzz-replay)
struct Registration {
  Registration(const char* name, TargetFn fn) { targets().push_back({name, fn}); }
};

// Reads an input's bytes as a sequence of choices; past the end every read is 0, so any input
// describes something.
class Choices {
 public:
  Choices(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  uint8_t u8() { return p_ < end_ ? *p_++ : 0; }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = (v << 8) | u8();
    return v;
  }
  uint64_t u64() { return (uint64_t{u32()} << 32) | u32(); }
  bool flag() { return u8() & 1; }
  // One of n (n > 0).
  size_t pick(size_t n) { return u8() % n; }
  // A size that is usually small, sometimes one of the edges a hostile file would claim.
  uint64_t size_claim();
  size_t left() const { return static_cast<size_t>(end_ - p_); }
  std::vector<uint8_t> bytes(size_t n);

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// A file of this process's own in /dev/shm (or $TMPDIR), removed at exit: libhdf5 1.10 opens
// files by name only (it cannot realpath() a /proc/self/fd/N of a memfd).
const std::string& scratch_path();
void write_scratch(const uint8_t* data, size_t size);

// What ddpv-train does with a store, on `path`: open it (the whole validation), read every
// split's labels, its first, middle and last rows in one batch and a short range. A ddpv::Error
// is the store refused; anything else escapes.
void read_store(const std::string& path);

}  // namespace ddpv::fuzz

#ifdef DDPV_LIBFUZZER
#define DDPV_FUZZ_TARGET(name)                                                   \
  static int ddpv_fuzz_##name(const uint8_t* data, size_t size);                \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {     \
    return ddpv_fuzz_##name(data, size);                                        \
  }                                                                              \
  static int ddpv_fuzz_##name(const uint8_t* data, size_t size)
#else
#define DDPV_FUZZ_TARGET(name)                                                   \
  static int ddpv_fuzz_##name(const uint8_t* data, size_t size);                \
  static const ::ddpv::fuzz::Registration ddpv_fuzz_registration_##name(#name,  \
                                                                  ddpv_fuzz_##name); \
  static int ddpv_fuzz_##name(const uint8_t* data, size_t size)
#endif
