// ddpv-convert helpers: option parsing, gzip-aware file reading, class names, progress.
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "convert.hpp"
#include "ddpv/core/error.hpp"

namespace ddpv::convert {

bool parse_args(const std::string& command, const std::string& synopsis,
                po::options_description& options, const Args& args, po::variables_map& vm) {
  options.add_options()("help,h", "print this help");
  try {
    po::store(po::command_line_parser(args).options(options).run(), vm);
    if (vm.count("help")) {
      std::cout << "usage: ddpv-convert " << command << " " << synopsis << "\n\n" << options;
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }
  return true;
}

void add_writer_options(po::options_description& options) {
  auto add = options.add_options();
  add("out,o", po::value<std::string>()->required(),
      "output store (written as OUT.tmp, renamed when complete)");
  add("chunk-images", po::value<int64_t>()->default_value(0),
      "images per HDF5 chunk (0: about 256 KiB per chunk)");
  add("compress", po::value<std::string>()->default_value("none"),
      "none | gzip | gzip:LEVEL (deflate with the shuffle filter)");
  add("checksum", po::bool_switch(), "fletcher32 checksum on every chunk");
}

StoreWriterOptions writer_options(const po::variables_map& vm) {
  StoreWriterOptions o;
  o.chunk_images = vm["chunk-images"].as<int64_t>();
  if (o.chunk_images < 0) throw UsageError("--chunk-images must be 0 (automatic) or positive");
  try {
    o.gzip_level = parse_compression(vm["compress"].as<std::string>());
  } catch (const ddpv::Error& e) {
    throw UsageError(e.message());
  }
  o.checksum = vm["checksum"].as<bool>();
  return o;
}

std::string output_path(const po::variables_map& vm, const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  const std::string out = vm["out"].as<std::string>();
  if (out.empty()) throw UsageError("--out is empty: name the store to write, e.g. --out data.h5");
  std::error_code ec;
  if (fs::is_directory(out, ec))
    throw UsageError("--out " + out +
                     " is an existing directory: name the store file in it, e.g. " +
                     (fs::path(out) / "store.h5").string());
  // Only a path that exists can be an input; one stat per input then (a folder's images too).
  for (const std::string& target : {out, out + ".tmp"}) {
    if (!fs::exists(target, ec)) continue;
    for (const std::string& in : inputs) {
      if (!fs::equivalent(target, in, ec)) continue;  // false, with ec set, for a missing input
      throw UsageError("--out " + out +
                       (target == out ? "" : " (its temporary " + target + ", written first)") +
                       " is the input " + in + ": write the store to another path");
    }
  }
  return out;
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::error_code ec;
  DDPV_CHECK(std::filesystem::is_regular_file(path, ec), path, ": no such file");
  gzFile f = gzopen(path.c_str(), "rb");
  DDPV_CHECK(f != nullptr, path, ": cannot open: ", std::strerror(errno));
  gzbuffer(f, 1 << 20);
  std::vector<uint8_t> data;
  std::vector<uint8_t> buf(1 << 20);
  int n = 0;
  while ((n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()))) > 0)
    data.insert(data.end(), buf.data(), buf.data() + n);
  int errnum = Z_OK;
  const std::string message = gzerror(f, &errnum);
  gzclose(f);
  // A gzip stream cut short reads as Z_BUF_ERROR ("unexpected end of file"); bad data or a bad
  // CRC as Z_DATA_ERROR. Either way the data cannot be trusted.
  DDPV_CHECK(n >= 0 && errnum == Z_OK, path, ": truncated or corrupt gzip data (", message,
             "): download the file again");
  return data;
}

std::vector<std::string> read_class_names(const std::string& path) {
  std::ifstream in(path);
  DDPV_CHECK(in.good(), path, ": cannot read the class-names file");
  std::vector<std::string> names;
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty()) names.push_back(line);
  }
  DDPV_CHECK(!names.empty(), path, ": no class names in the file (one name per line)");
  return names;
}

Progress::Progress(std::string what, int64_t total)
    : what_(std::move(what)),
      total_(total),
      enabled_(isatty(STDOUT_FILENO) != 0),
      start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() {
  if (enabled_) {
    std::printf("\r\033[K");
    std::fflush(stdout);
  }
}

void Progress::update(int64_t done) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (done < total_ && now - last_ < std::chrono::milliseconds(200)) return;
  last_ = now;
  const double seconds = std::chrono::duration<double>(now - start_).count();
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0.0;
  const double left = rate > 0 ? static_cast<double>(total_ - done) / rate : 0.0;
  std::printf("\r\033[K%s: %lld / %lld (%.0f%%), %.0f images/s, %d:%02d left", what_.c_str(),
              static_cast<long long>(done), static_cast<long long>(total_),
              total_ ? 100.0 * done / total_ : 100.0, rate, static_cast<int>(left) / 60,
              static_cast<int>(left) % 60);
  std::fflush(stdout);
}

void print_summary(const std::string& out,
                   const std::vector<std::pair<std::string, int64_t>>& splits, int height,
                   int width, int channels, size_t num_classes,
                   std::chrono::steady_clock::time_point start, bool encoded) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string parts;
  for (const auto& [name, n] : splits)
    parts += (parts.empty() ? "" : ", ") + name + " " + std::to_string(n);
  if (encoded)
    std::printf("ddpv-convert: wrote %s: %s JPEG images (%d channels), %zu classes in %.2f s\n",
                out.c_str(), parts.c_str(), channels, num_classes, seconds);
  else
    std::printf("ddpv-convert: wrote %s: %s images of %dx%dx%d, %zu classes in %.2f s\n",
                out.c_str(), parts.c_str(), height, width, channels, num_classes, seconds);
}

}  // namespace ddpv::convert
