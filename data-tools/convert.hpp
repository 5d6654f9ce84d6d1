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

// A progress line on stdout, only when stdout is a terminal (logs and CI stay clean).
class Progress {
 public:
  Progress(std::string what, int64_t total);
  ~Progress();
  void update(int64_t done);

 private:
  std::string what_;
  int64_t total_;
  bool enabled_;
  std::chrono::steady_clock::time_point last_;
};

// "ddpv-convert: wrote OUT: train 60000, test 10000 images of 28x28x1, 10 classes in 1.3 s"
void print_summary(const std::string& out,
                   const std::vector<std::pair<std::string, int64_t>>& splits, int height,
                   int width, int channels, size_t num_classes,
                   std::chrono::steady_clock::time_point start);

}  // namespace ddpv::convert
