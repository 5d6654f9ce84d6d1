// ddpv-convert folder: root/<class>/<image> trees of JPEG and PNG files, resized and split.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "convert.hpp"
#include "data/image_codec.hpp"
#include "ddpv/core/error.hpp"
#include "ddpv/core/log.hpp"
#include "ddpv/core/rng.hpp"

namespace ddpv::convert {
namespace fs = std::filesystem;
namespace {

struct Item {
  std::string path;
  int32_t label;
};

bool is_image_name(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

std::pair<int, int> parse_size(const std::string& s) {
  int h = 0, w = 0;
  char sep = 0;
  std::istringstream in(s);
  if (s.find('x') != std::string::npos) {
    in >> h >> sep >> w;
  } else {
    in >> h;
    w = h;
  }
  if (!in || !in.eof() || h <= 0 || w <= 0 || h > 4096 || w > 4096)
    throw UsageError("--size '" + s + "' is not HxW or N with sides in 1..4096");
  return {h, w};
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DDPV_CHECK(in.good(), path, ": cannot open");
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

struct Settings {
  int height, width, channels, threads;
  int64_t max_pixels;
  bool strict;
};

// Files left out of the store, by reason, for the summary line.
class Skipped {
 public:
  explicit Skipped(bool strict) : strict_(strict) {}
  // Warns and counts, or with --strict throws naming the path.
  void add(const std::string& path, const std::string& why, const std::string& reason) {
    DDPV_CHECK(!strict_, path, ": ", why, " (without --strict it would be skipped)");
    DDPV_WARN("skipping ", path, ": ", why);
    auto it = std::find_if(counts_.begin(), counts_.end(),
                           [&](const auto& c) { return c.first == reason; });
    if (it == counts_.end()) it = counts_.insert(it, {reason, 0});
    ++it->second;
  }
  // "3 files: 2 corrupt or unreadable images, 1 dangling symlink"; empty when none.
  std::string summary() const {
    int64_t total = 0;
    std::string parts;
    for (const auto& [r, n] : counts_) {
      total += n;
      parts += (parts.empty() ? "" : ", ") + std::to_string(n) + " " + r + (n == 1 ? "" : "s");
    }
    if (total == 0) return "";
    return std::to_string(total) + (total == 1 ? " file: " : " files: ") + parts;
  }

 private:
  bool strict_;
  std::vector<std::pair<std::string, int64_t>> counts_;  // in the order first seen
};

// What a directory entry is once its links are followed. A symlink loop or a dangling symlink
// is reported as such (Skipped), not thrown as a std::filesystem error.
enum class Kind { kFile, kDirectory, kOther, kLoop, kDangling, kUnreadable };
Kind kind_of(const fs::directory_entry& e, std::string* why) {
  std::error_code ec;
  const fs::file_status st = fs::status(e.path(), ec);
  if (ec == std::errc::too_many_symbolic_link_levels) {
    *why = "symlink loop";
    return Kind::kLoop;
  }
  if (st.type() == fs::file_type::not_found && fs::is_symlink(e.path(), ec)) {
    *why = "dangling symlink (its target does not exist)";
    return Kind::kDangling;
  }
  if (ec || st.type() == fs::file_type::not_found) {  // e.g. removed since it was listed
    *why = "cannot stat: " + (ec ? ec.message() : std::string("no such file"));
    return Kind::kUnreadable;
  }
  if (fs::is_regular_file(st)) return Kind::kFile;
  if (fs::is_directory(st)) return Kind::kDirectory;
  *why = "not a regular file";
  return Kind::kOther;
}

const char* reason_of(Kind k) {
  switch (k) {
    case Kind::kLoop:
      return "symlink loop";
    case Kind::kDangling:
      return "dangling symlink";
    case Kind::kUnreadable:
      return "unreadable path";
    default:
      return "non-regular file";
  }
}

// The entries of `dir`, sorted; a directory that cannot be listed is an error naming it.
std::vector<fs::directory_entry> list_dir(const fs::path& dir) {
  std::error_code ec;
  std::vector<fs::directory_entry> entries;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) entries.push_back(*it);
  DDPV_CHECK(!ec, dir.string(), ": cannot list the folder: ", ec.message());
  std::sort(entries.begin(), entries.end());
  return entries;
}

// Decodes and resizes the items of one block on `threads` threads; fills ok/errors per item.
void decode_block(const std::vector<Item>& items, size_t begin, size_t end, const Settings& s,
                  std::vector<uint8_t>& pixels, std::vector<std::string>& errors) {
  const size_t image_bytes = static_cast<size_t>(s.height) * s.width * s.channels;
  pixels.assign((end - begin) * image_bytes, 0);
  errors.assign(end - begin, "");
  auto work = [&](size_t t) {
    for (size_t i = begin + t; i < end; i += static_cast<size_t>(s.threads)) {
      std::string& error = errors[i - begin];
      try {
        const std::vector<uint8_t> bytes = read_bytes(items[i].path);
        codec::Image image;
        if (!codec::decode_image(bytes.data(), bytes.size(), s.channels, s.max_pixels, &image,
                                 &error))
          continue;
        const codec::Image out = codec::resize_center_crop(image, s.height, s.width);
        std::copy(out.pixels.begin(), out.pixels.end(), pixels.begin() + (i - begin) * image_bytes);
      } catch (const std::exception& e) {  // unreadable file, out of memory for one image
        error = e.what();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < s.threads; ++t) pool.emplace_back(work, static_cast<size_t>(t));
  work(0);
  for (auto& th : pool) th.join();
}

int64_t write_split(StoreWriter& writer, const std::string& name, const std::vector<Item>& items,
                    const Settings& s, Progress& progress, int64_t& done, Skipped& skipped) {
  writer.begin_split(name);
  const size_t block = static_cast<size_t>(64 * s.threads);
  const size_t image_bytes = static_cast<size_t>(s.height) * s.width * s.channels;
  std::vector<uint8_t> pixels, kept;
  std::vector<std::string> errors;
  std::vector<int32_t> labels;
  for (size_t begin = 0; begin < items.size(); begin += block) {
    const size_t end = std::min(items.size(), begin + block);
    decode_block(items, begin, end, s, pixels, errors);
    kept.clear();
    labels.clear();
    for (size_t i = begin; i < end; ++i) {
      const std::string& error = errors[i - begin];
      if (!error.empty()) {
        skipped.add(items[i].path, error, "corrupt or unreadable image");
        continue;
      }
      kept.insert(kept.end(), pixels.begin() + (i - begin) * image_bytes,
                  pixels.begin() + (i - begin + 1) * image_bytes);
      labels.push_back(items[i].label);
    }
    writer.append(kept.data(), labels.data(), static_cast<int64_t>(labels.size()));
    progress.update(done += static_cast<int64_t>(end - begin));
  }
  return writer.split_count();
}

}  // namespace

int run_folder(const Args& args) {
  po::options_description options("folder options");
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto add = options.add_options();
  add("root", po::value<std::string>()->required(),
      "folder with one subfolder of images per class");
  add("size", po::value<std::string>()->required(),
      "output size HxW or N (shorter side resized, center crop)");
  add("channels", po::value<int>()->default_value(3), "3 (RGB) or 1 (grayscale)");
  add("val-fraction", po::value<double>()->default_value(0.1),
      "share of each class put in the 'val' split");
  add("seed", po::value<uint64_t>()->default_value(0), "seed of the train/val split");
  add("threads", po::value<int>()->default_value(cores), "decoding threads");
  add("strict", po::bool_switch(), "stop at the first corrupt image instead of skipping it");
  add("max-pixels", po::value<int64_t>()->default_value(int64_t{1} << 26),
      "largest image (width x height) accepted, checked before decoding");
  add_writer_options(options);
  po::variables_map vm;
  if (!parse_args("folder", "--root DIR --size HxW --out OUT.h5", options, args, vm)) return 0;
  const auto [height, width] = parse_size(vm["size"].as<std::string>());
  Settings s{height,
             width,
             vm["channels"].as<int>(),
             vm["threads"].as<int>(),
             vm["max-pixels"].as<int64_t>(),
             vm["strict"].as<bool>()};
  if (s.channels != 1 && s.channels != 3) throw UsageError("--channels must be 1 or 3");
  if (s.threads < 1 || s.threads > 256) throw UsageError("--threads must be in 1..256");
  if (s.max_pixels < 1) throw UsageError("--max-pixels must be positive");
  const double val_fraction = vm["val-fraction"].as<double>();
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    throw UsageError("--val-fraction must be in [0, 1)");
  const StoreWriterOptions wopt = writer_options(vm);
  const auto start = std::chrono::steady_clock::now();

  const fs::path root = vm["root"].as<std::string>();
  std::error_code ec;
  DDPV_CHECK(fs::is_directory(root, ec), root.string(), ": not a directory");
  // Classes are the subfolders; a broken link among them is skipped like a bad image, as it
  // may have been meant as a class. Files beside the class folders are ignored.
  Skipped skipped(s.strict);
  std::string why;
  std::vector<fs::path> class_dirs;
  for (const auto& e : list_dir(root)) {
    const Kind k = kind_of(e, &why);
    if (k == Kind::kDirectory)
      class_dirs.push_back(e.path());
    else if (k == Kind::kLoop || k == Kind::kDangling || k == Kind::kUnreadable)
      skipped.add(e.path().string(), why, reason_of(k));
  }
  DDPV_CHECK(!class_dirs.empty(), root.string(),
             ": no class subfolders (expected root/<class>/<image>)");

  std::vector<std::string> names;
  std::vector<Item> train, val;
  const uint64_t seed = vm["seed"].as<uint64_t>();
  for (size_t c = 0; c < class_dirs.size(); ++c) {
    std::vector<std::string> files;
    for (const auto& e : list_dir(class_dirs[c])) {
      if (!is_image_name(e.path())) continue;  // a README, a .txt of labels: not ours
      const Kind k = kind_of(e, &why);
      if (k == Kind::kFile)
        files.push_back(e.path().string());
      else
        skipped.add(e.path().string(), why, reason_of(k));
    }
    DDPV_CHECK(!files.empty(), class_dirs[c].string(),
               ": empty class folder (no .jpg, .jpeg or .png files); remove it or add images");
    std::sort(files.begin(), files.end());
    // Per-class split: a fixed shuffle from (seed, class) picks the val files.
    Rng rng(derive_key(seed, c));
    for (size_t i = files.size(); i > 1; --i)
      std::swap(files[i - 1], files[rng.uniform_int(static_cast<uint32_t>(i))]);
    const size_t n_val =
        static_cast<size_t>(std::llround(val_fraction * static_cast<double>(files.size())));
    std::sort(files.begin(), files.begin() + static_cast<std::ptrdiff_t>(n_val));
    std::sort(files.begin() + static_cast<std::ptrdiff_t>(n_val), files.end());
    for (size_t i = 0; i < files.size(); ++i)
      (i < n_val ? val : train).push_back(Item{files[i], static_cast<int32_t>(c)});
    names.push_back(class_dirs[c].filename().string());
  }
  DDPV_CHECK(!train.empty(), root.string(), ": --val-fraction ", val_fraction,
             " leaves no train images");

  std::vector<std::string> inputs;
  for (const auto* list : {&train, &val})
    for (const Item& item : *list) inputs.push_back(item.path);
  const std::string out = output_path(vm, inputs);
  StoreWriter writer(out, height, width, s.channels, names, "folder: " + root.string(), wopt);
  int64_t done = 0;
  std::vector<std::pair<std::string, int64_t>> counts;
  {
    Progress progress("decoding", static_cast<int64_t>(train.size() + val.size()));
    counts.emplace_back("train", write_split(writer, "train", train, s, progress, done, skipped));
    if (!val.empty())
      counts.emplace_back("val", write_split(writer, "val", val, s, progress, done, skipped));
  }
  writer.commit();
  print_summary(out, counts, height, width, s.channels, names.size(), start);
  const std::string skips = skipped.summary();
  if (!skips.empty())
    std::printf("ddpv-convert: skipped %s (see the warnings; --strict makes them fatal)\n",
                skips.c_str());
  return 0;
}

}  // namespace ddpv::convert
