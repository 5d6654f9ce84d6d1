// Shared pieces of ddpv-convert: subcommand entry points, option helpers, file reading, progress.
#pragma once

#include <boost/program_options.hpp>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddpv/data/store_writer.hpp"

namespace ddpv::convert {

namespace po = boost::program_options;

// A mistake in the command line: exit code 2. Data errors (ddpv::Error) exit with 1.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using Args = std::vector<std::string>;
int run_idx(const Args& args);
int run_cifar(const Args& args);
int run_folder(const Args& args);
int run_inspect(const Args& args);

// Parses `args` against `options` plus --help. Returns false after printing help for --help.
// Throws UsageError for unknown or malformed options and for missing required ones.
bool parse_args(const std::string& command, const std::string& synopsis,
                po::options_description& options, const Args& args, po::variables_map& vm);

// --out, --chunk-images, --compress, --checksum.
void add_writer_options(po::options_description& options);
StoreWriterOptions writer_options(const po::variables_map& vm);
// --out, checked: not empty, not an existing directory, and neither OUT nor OUT.tmp one of
// `inputs` (compared by file identity, so another spelling, a hard link or a symlink of an input
// counts). Throws UsageError naming it.
std::string output_path(const po::variables_map& vm, const std::vector<std::string>& inputs);

// The whole file, gunzipped when it is gzip (zlib reads raw files unchanged). A truncated or
// corrupt gzip stream is an error naming the file, as is a missing file.
std::vector<uint8_t> read_file(const std::string& path);
// One class name per line (blank lines ignored); at least one.
std::vector<std::string> read_class_names(const std::string& path);

// An IDX file's header (MNIST family): magic 0 0 0x08 rank, then `rank` big-endian uint32 dims;
// the data starts at `offset`.
struct IdxHeader {
  std::vector<int64_t> dims;
  size_t offset = 0;
};
// Checks the bytes of an IDX file of `what` ("images", "labels"): the magic, the unsigned-byte
// type, `rank` dims, and that the dims' product (never wrapped) is the bytes after the header.
// Throws ddpv::Error naming `path`.
IdxHeader parse_idx(const uint8_t* bytes, size_t size, int rank, const std::string& path,
                    const char* what);

// CIFAR binary records: label byte(s), then planar 32x32 RGB.
struct CifarLayout {
  int label_bytes;   // 1 for CIFAR-10; 2 (coarse, fine) for CIFAR-100
  int label_offset;  // which of them is the label
  int num_classes;
  static constexpr int kSide = 32;
  static constexpr int64_t kPixels = kSide * kSide * 3;
  int64_t record() const { return label_bytes + kPixels; }
};
// Decodes the whole records of a batch file's bytes into images (N, 32, 32, 3) and labels (N),
// resized to fit. Throws ddpv::Error naming `path` when the size is not a positive multiple of
// the record. Labels are not range-checked here (the writer does).
int64_t decode_cifar(const uint8_t* bytes, size_t size, const CifarLayout& layout,
                     const std::string& path, std::vector<uint8_t>* images,
                     std::vector<int32_t>* labels);

// A progress line on stdout with the rate and the time left, only when stdout is a terminal
// (logs and CI stay clean).
class Progress {
 public:
  Progress(std::string what, int64_t total);
  ~Progress();
  void update(int64_t done);

 private:
  std::string what_;
  int64_t total_;
  bool enabled_;
  std::chrono::steady_clock::time_point last_, start_;
};

// "ddpv-convert: wrote OUT: train 60000, test 10000 images of 28x28x1, 10 classes in 1.3 s"
void print_summary(const std::string& out,
                   const std::vector<std::pair<std::string, int64_t>>& splits, int height,
                   int width, int channels, size_t num_classes,
                   std::chrono::steady_clock::time_point start, bool encoded = false);

}  // namespace ddpv::convert
