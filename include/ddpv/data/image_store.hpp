// ImageStore: read-only access to an HDF5 image store (format version 1, docs/data-format.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ddpv {

inline constexpr const char* kStoreFormat = "ddpvision-image-store";
inline constexpr int64_t kStoreFormatVersion = 1;

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
  int64_t num_classes() const;
  const std::vector<std::string>& class_names() const;
  int height() const;
  int width() const;
  int channels() const;
  int64_t image_bytes() const { return int64_t{height()} * width() * channels(); }
  const std::vector<float>& mean() const;  // (C) of the train split, 0..1 scale
  const std::vector<float>& std() const;   // (C)
  const std::string& source() const;

  std::vector<std::string> splits() const;  // in name order
  bool has_split(const std::string& split) const;
  int64_t split_size(const std::string& split) const;  // throws listing the splits present
  const std::vector<int32_t>& labels(const std::string& split) const;  // (N), all validated

  // Reads rows indices[0..n) of `split` into out (n, H, W, C) in the order given, duplicates
  // allowed, sorted and merged into runs (see Note [Reading a batch]).
  void read_rows(const std::string& split, const int64_t* indices, size_t n, uint8_t* out) const;
  void read_rows(const std::string& split, const std::vector<int64_t>& indices,
                 uint8_t* out) const {
    read_rows(split, indices.data(), indices.size(), out);
  }
  // Rows [begin, begin + count) into out (count, H, W, C).
  void read_range(const std::string& split, int64_t begin, int64_t count, uint8_t* out) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddpv
