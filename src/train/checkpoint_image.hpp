// Private: a checkpoint file's bytes (format 2). The HDF5 file is built in memory behind a user
// block that holds a text header with the checksums of the HDF5 payload and of every tensor;
// a reader reads the file once, checks the header before libhdf5 parses a byte, and opens the
// verified bytes from memory. Layout in docs/checkpoint-format.md.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddpv/h5/h5.hpp"

namespace ddpv::ckpt {

// One tensor of the header's table, and the crc32c attribute of its dataset.
struct TensorRecord {
  std::string name;     // "/params/fc1.weight"
  uint64_t offset = 0;  // of its first byte in the file
  uint64_t bytes = 0;
  uint32_t crc = 0;  // CRC32C of its values as little-endian float32 (int64 for counts)
};

// A buffer of a file's bytes, its pages faulted in by one mmap(MAP_POPULATE) rather than one
// fault per page (half the time to read a 200 MB checkpoint into it). Move-only.
class Bytes {
 public:
  Bytes() = default;
  explicit Bytes(size_t size);
  ~Bytes();
  Bytes(Bytes&& o) noexcept;
  Bytes& operator=(Bytes&& o) noexcept;
  Bytes(const Bytes&) = delete;
  Bytes& operator=(const Bytes&) = delete;
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Reads the whole of `path`; with `from_disk`, asks the kernel to drop its cached pages first,
// so that a file just written is read back from the disk. A missing file throws ddpv::Error; a
// file that cannot be read throws CheckpointDamaged.
Bytes read_file(const std::string& path, bool from_disk = false);

// What a check of a file's bytes found.
struct Verified {
  bool has_header = false;            // format 2: everything was checked against the header
  int64_t version = 0;                // the header's format version (0 without a header)
  uint64_t userblock = 0;             // the header's size in the file (0 without one)
  std::vector<TensorRecord> tensors;  // the header's table, in the order written
};

// Note [Verify before parse]: checks a checkpoint's bytes without libhdf5 (which can crash on
// damaged input): a file with our header must match it byte for byte (length, header CRC,
// zero padding, payload CRC; on a payload mismatch the table names the damaged tensor); a file
// without one must start with the HDF5 signature (format 1, or rewritten by h5py), and is left
// to the per-tensor crc32c attributes. Throws CheckpointDamaged naming `name` and the damage,
// or ddpv::Error for a header of a newer format.
Verified verify_bytes(const uint8_t* data, size_t size, const std::string& name);

// ---- writing --------------------------------------------------------------------------------

// An HDF5 file built in memory (core driver, no backing store) with a user block sized for a
// header listing `tensor_names`; add_tensor() writes a contiguous dataset with its crc32c
// attribute and records where it went; finish() writes the header into the user block and
// returns the whole file's bytes, for durable::write_file. Note [Zero-copy image]: the core
// driver allocates its image through our file-image callbacks, so those bytes are its own
// buffer, valid until the writer is destroyed. Note [Write in memory] says why in memory.
class ImageWriter {
 public:
  ImageWriter(const std::vector<std::string>& tensor_names, size_t payload_hint);
  ImageWriter(const ImageWriter&) = delete;
  ImageWriter& operator=(const ImageWriter&) = delete;
  hid_t file() const { return file_.get(); }
  // `group` is the open group named `group_name` ("params"); `data` holds the values in the
  // file type's byte order (little-endian float32 or int64); empty dims write a scalar.
  void add_tensor(hid_t group, const std::string& group_name, const std::string& name,
                  const std::vector<int64_t>& dims, hid_t file_type, hid_t mem_type,
                  const void* data, size_t bytes);
  struct View {
    const uint8_t* data;
    size_t size;
  };
  View finish();

  struct Memory {  // the core driver's image, owned here (the callbacks' user data)
    uint8_t* ptr = nullptr;
    size_t size = 0;
    ~Memory();
  };

 private:
  uint64_t userblock_ = 0;
  std::vector<TensorRecord> tensors_;
  Memory memory_;  // declared before file_: unmapped after the file is closed
  h5::Handle file_;
};

// The header text for a file of `file_bytes` bytes whose payload has CRC `payload_crc`, padded
// with zeros to `userblock` bytes (exposed for tests).
std::string render_header(uint64_t userblock, uint64_t file_bytes, uint32_t payload_crc,
                          const std::vector<TensorRecord>& tensors);

// ---- reading --------------------------------------------------------------------------------

// An HDF5 file opened read-only on bytes in memory without copying them (file-image callbacks);
// the bytes must outlive it. Throws ddpv::Error when libhdf5 cannot open them.
class ImageFile {
 public:
  ImageFile(const uint8_t* data, size_t size, const std::string& name);
  ImageFile(const ImageFile&) = delete;
  ImageFile& operator=(const ImageFile&) = delete;
  hid_t get() const { return file_.get(); }

  struct View {  // the callbacks' user data; its address is handed to libhdf5
    void* data;
    size_t size;
  };

 private:
  View view_;
  h5::Handle file_;
};

// The crc32c attribute of a dataset: true and its value in *crc when present.
bool read_crc_attr(hid_t dataset, uint32_t* crc);

}  // namespace ddpv::ckpt
