// The image store reader on arbitrary bytes as the HDF5 file: libhdf5's parsing of a damaged
// or hostile file, then our validation and reads (fuzz_support's read_store).
#include "fuzz_support.hpp"

DDPV_FUZZ_TARGET(store_raw) {
  ddpv::fuzz::write_scratch(data, size);
  ddpv::fuzz::read_store(ddpv::fuzz::scratch_path());
  return 0;
}
