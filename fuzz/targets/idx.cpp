// IDX files (ddpv-convert idx). Byte 0 picks images (rank 3) or labels (rank 1); the rest is the
// file. What parse_idx accepts, the converter reads to its end: every data byte is touched.
#include <cstdlib>

#include "convert.hpp"
#include "ddpv/core/error.hpp"
#include "fuzz_support.hpp"

DDPV_FUZZ_TARGET(idx) {
  if (size < 1) return 0;
  const int rank = (data[0] & 1) ? 3 : 1;
  const uint8_t* file = data + 1;
  const size_t bytes = size - 1;
  try {
    const ddpv::convert::IdxHeader h =
        ddpv::convert::parse_idx(file, bytes, rank, "fuzz.idx", rank == 3 ? "images" : "labels");
    uint64_t n = 1;
    for (int64_t d : h.dims) n *= static_cast<uint64_t>(d);
    if (h.offset + n != bytes) std::abort();  // the promise the readers rely on
    unsigned sum = 0;
    for (uint64_t i = 0; i < n; ++i) sum += file[h.offset + i];
    if (sum == ~0u) std::abort();
  } catch (const ddpv::Error&) {
  }
  return 0;
}
