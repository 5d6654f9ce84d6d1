// ImageStore: read-only access to an HDF5 image store (format versions 1 and 2,
// docs/data-format.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ddpv {

inline constexpr const char* kStoreFormat = "ddpvision-image-store";
// Version 2 adds encoded splits; a store without one is written as version 1, so older builds
// still read it.
inline constexpr int64_t kStoreFormatVersion = 2;

// How a split holds its images: raw (N, H, W, C) uint8 rows of the store's size, or encoded
// byte strings of any size (/data, /offsets, /shapes).
enum class SplitEncoding { kRaw, kJpeg };

// Encoded images read for a batch: position i's bytes are bytes[begin[i], begin[i] + size[i]).
// An encoded image's (height, width, channels) as /shapes holds it: sides 1..65535, channels
// 1 or 3. The reader checks every one at open, the writer every one it appends.
inline bool plausible_shape(const int32_t* shape) {
  return shape[0] > 0 && shape[1] > 0 && shape[0] <= 65535 && shape[1] <= 65535 &&
         (shape[2] == 1 || shape[2] == 3);
}

struct EncodedBatch {
  std::vector<uint8_t> bytes;
  std::vector<int64_t> begin, size;
};

// Opens a store and validates all of it before anything is read: the format attributes, every
// split's dataset shapes and types, equal image and label counts, and every label in
// [0, num_classes). A violation throws ddpv::Error with one line naming the file and the fault,
// so a bad --data path fails at start-up, not hours into training.
class ImageStore {
 public:
  explicit ImageStore(const std::string& path);
  ~ImageStore();
  ImageStore(ImageStore&&) noexcept;
  ImageStore& operator=(ImageStore&&) noexcept;

  const std::string& path() const;
  int64_t format_version() const;  // what the file says: 1 or 2
  int64_t num_classes() const;
  const std::vector<std::string>& class_names() const;
  int height() const;
  int width() const;
  int channels() const;
  int64_t image_bytes() const { return int64_t{height()} * width() * channels(); }
  // For raw splits the stored image size; for encoded ones the size the loader crops to unless
  // told otherwise (the converter's --size).
  const std::vector<float>& mean() const;  // (C) of the train split, 0..1 scale
  const std::vector<float>& std() const;   // (C)
  const std::string& source() const;

  std::vector<std::string> splits() const;  // in name order
  bool has_split(const std::string& split) const;
  int64_t split_size(const std::string& split) const;  // throws listing the splits present
  const std::vector<int32_t>& labels(const std::string& split) const;  // (N), all validated
  SplitEncoding encoding(const std::string& split) const;
  bool any_encoded() const;  // whether some split is encoded (the crop then sizes the model)
  // Encoded splits: (N, 3) height, width, channels of each encoded image, and (N + 1) byte
  // offsets into /data, all validated at open; empty for raw splits.
  const std::vector<int32_t>& shapes(const std::string& split) const;
  const std::vector<int64_t>& offsets(const std::string& split) const;

  // Reads rows indices[0..n) of `split` into out (n, H, W, C) in the order given, duplicates
  // allowed, sorted and merged into runs (see Note [Reading a batch]).
  void read_rows(const std::string& split, const int64_t* indices, size_t n, uint8_t* out) const;
  void read_rows(const std::string& split, const std::vector<int64_t>& indices,
                 uint8_t* out) const {
    read_rows(split, indices.data(), indices.size(), out);
  }
  // Rows [begin, begin + count) into out (count, H, W, C).
  void read_range(const std::string& split, int64_t begin, int64_t count, uint8_t* out) const;
  // The encoded bytes of images indices[0..n) of an encoded split, one byte-range read per run
  // of consecutive indices (Note [Reading a batch]); a duplicate shares its bytes.
  void read_encoded(const std::string& split, const int64_t* indices, size_t n,
                    EncodedBatch* out) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddpv
