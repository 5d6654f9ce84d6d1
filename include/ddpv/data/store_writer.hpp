// StoreWriter: writes an HDF5 image store (format version 1, or 2 with an encoded split) safely,
// for ddpv-convert and tests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddpv/data/image_store.hpp"

namespace ddpv {

struct StoreWriterOptions {
  int64_t chunk_images = 0;  // images per chunk; 0 picks about 256 KiB per chunk
  int gzip_level = -1;       // -1: no compression; 0..9: deflate with the shuffle filter
  bool checksum = false;     // fletcher32 on every chunk
};

// Parses "none", "gzip" (level 4) or "gzip:N" into a gzip level (-1 for none); throws otherwise.
int parse_compression(const std::string& spec);

// Note [Atomic store]: everything is written to "<out>.tmp", which is closed (flushing HDF5's
// buffers) and renamed to <out> only by commit(). A writer destroyed before commit() -- an
// exception anywhere in a converter -- deletes the temporary, so a failed conversion leaves
// neither <out> nor <out>.tmp, and a previous <out> is untouched. That holds for a failed write
// too (a full disk): the destructor closes the half-written file without flushing it
// (Note [Abandoning a file] in include/ddpv/h5/h5.hpp).
class StoreWriter {
 public:
  StoreWriter(const std::string& out_path, int height, int width, int channels,
              std::vector<std::string> class_names, const std::string& source,
              StoreWriterOptions options = {});
  ~StoreWriter();
  StoreWriter(const StoreWriter&) = delete;
  StoreWriter& operator=(const StoreWriter&) = delete;

  // Starts a split (a group with extendible images and labels datasets, or for an encoded one
  // data, offsets, shapes and labels: Note [Encoded split]); ends the previous one.
  void begin_split(const std::string& name, SplitEncoding encoding = SplitEncoding::kRaw);
  // Appends n images (n, H, W, C) and their labels; each label must lie in [0, num_classes).
  void append(const uint8_t* images, const int32_t* labels, int64_t n);
  // Encoded splits: appends n encoded images, image i being sizes[i] bytes from bytes +
  // (sizes[0] + ... + sizes[i-1]), decoding to shapes[3i..3i+3) = (height, width, channels).
  // The bytes are stored as given, never filtered (JPEG does not compress further, and a filter
  // would make every read decompress whole chunks).
  void append_encoded(const uint8_t* bytes, const int64_t* sizes, const int32_t* shapes,
                      const int32_t* labels, int64_t n);
  // Adds pixels (count, C) to the train statistics: for an encoded train split, whose images
  // the writer cannot see, the converter passes what they decode to (Note [Encoded statistics]).
  void add_train_pixels(const uint8_t* pixels, int64_t count);
  // The label check of append() alone, so a converter can name the input that holds a bad label
  // without blaming that input for a write error.
  void check_labels(const int32_t* labels, int64_t n) const;
  int64_t split_count() const;  // images appended to the current split

  // Writes the attributes, with mean/std over the "train" split (required), closes and renames.
  void commit();

  // Per-channel mean and std of the "train" images so far, on the 0..1 scale.
  std::vector<float> train_mean() const;
  std::vector<float> train_std() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddpv
