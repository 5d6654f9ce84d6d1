// The checkpoint reader on a file's bytes in memory (verify_checkpoint_bytes, and
// load_checkpoint_bytes into lenet for 4x4x1 images of 3 classes, the
// model of the seeds fuzz/make_seeds.sh makes). Byte 0 chooses:
//   bit 0  re-sign: the header's table and checksums are recomputed for the mutated bytes, so
//          that damage to the HDF5 metadata gets past Note [Verify before parse] to libhdf5
//          and to our reading of what it parses (without it almost every mutation is refused
//          by the payload checksum, which is the point of the checksum, not of the fuzzing);
//   bit 1  load into a model as well as verify.
// The rest is the file.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>

#include "ddpv/backend/backend.hpp"
#include "ddpv/core/crc32c.hpp"
#include "ddpv/nn/model.hpp"
#include "ddpv/train/checkpoint.hpp"
#include "fuzz_support.hpp"
#include "train/checkpoint_image.hpp"

namespace {

// The header's userblock and tensor table, read with plain string handling, then the file's
// checksums recomputed over what the bytes are now. Leaves the bytes alone when the header
// cannot be read or re-rendered.
void resign(std::vector<uint8_t>& file) {
  if (file.empty()) return;
  const size_t text_end = std::min(file.size(), size_t{1} << 20);
  const std::string head(reinterpret_cast<const char*>(file.data()),
                         strnlen(reinterpret_cast<const char*>(file.data()), text_end));
  std::istringstream in(head);
  std::string line;
  uint64_t userblock = 0;
  std::vector<ddpv::ckpt::TensorRecord> tensors;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key;
    ls >> key;
    if (key == "userblock") {
      ls >> userblock;
    } else if (key.size() == 8 && key.find_first_not_of("0123456789abcdef") == std::string::npos) {
      ddpv::ckpt::TensorRecord t;
      ls >> t.offset >> t.bytes >> t.name;
      if (!ls || t.offset > file.size() || t.bytes > file.size() - t.offset) return;
      t.crc = ddpv::crc32c(file.data() + t.offset, t.bytes);
      tensors.push_back(t);
    }
  }
  if (userblock == 0 || userblock > file.size()) return;
  const uint32_t payload = ddpv::crc32c(file.data() + userblock, file.size() - userblock);
  try {
    const std::string h = ddpv::ckpt::render_header(userblock, file.size(), payload, tensors);
    std::memcpy(file.data(), h.data(), userblock);
  } catch (const ddpv::Error&) {  // a table that no longer fits its user block
  }
}

ddpv::Model& model() {
  static std::unique_ptr<ddpv::Backend> backend = [] {
    ddpv::BackendOptions o;
    o.device = ddpv::Device::kCpu;
    o.threads = 1;
    return ddpv::make_backend(o);
  }();
  static std::unique_ptr<ddpv::Model> m = [] {
    auto made = ddpv::make_model("lenet", *backend, ddpv::Shape{4, 4, 1}, 3);
    made->init_parameters(1);
    return made;
  }();
  return *m;
}

}  // namespace

DDPV_FUZZ_TARGET(checkpoint) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  std::vector<uint8_t> file(data + 1, data + size);
  if (mode & 1) resign(file);
  try {
    ddpv::verify_checkpoint_bytes(file.data(), file.size(), "fuzz.h5");
  } catch (const ddpv::Error&) {
  }
  if (mode & 2) {
    try {
      ddpv::load_checkpoint_bytes(file.data(), file.size(), "fuzz.h5", model());
    } catch (const ddpv::Error&) {
    }
  }
  return 0;
}
