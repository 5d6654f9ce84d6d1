// ddpv-convert folder: root/<class>/<image> trees of JPEG and PNG files (one tree split in
// two, or ImageNet's train and val trees), stored raw at one size or as JPEG bytes.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "convert.hpp"
#include "data/image_codec.hpp"
#include "data/work_pool.hpp"
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
  bool jpeg = false;  // --encode jpeg
  int max_side = 0;   // 0: any size kept
  int quality = 90;
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

// Runs work(i, error) for items [begin, end) on the pool; an exception of one item (an
// unreadable file, no memory for one image) becomes its error, so it is skipped, not fatal.
void for_each_item(WorkPool& pool, size_t begin, size_t end, std::vector<std::string>& errors,
                   const std::function<void(size_t, std::string&)>& work) {
  errors.assign(end - begin, "");
  pool.run(static_cast<int64_t>(end - begin), [&](int64_t k, int) {
    std::string& error = errors[static_cast<size_t>(k)];
    try {
      work(begin + static_cast<size_t>(k), error);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
}

// Decodes and resizes the items of one block on the pool; fills pixels and errors per item.
void decode_block(WorkPool& pool, const std::vector<Item>& items, size_t begin, size_t end,
                  const Settings& s, std::vector<uint8_t>& pixels,
                  std::vector<std::string>& errors) {
  const size_t image_bytes = static_cast<size_t>(s.height) * s.width * s.channels;
  pixels.assign((end - begin) * image_bytes, 0);
  for_each_item(pool, begin, end, errors, [&](size_t i, std::string& error) {
    const std::vector<uint8_t> bytes = read_bytes(items[i].path);
    codec::Image image;
    if (!codec::decode_image(bytes.data(), bytes.size(), s.channels, s.max_pixels, &image, &error))
      return;
    const codec::Image out = codec::resize_center_crop(image, s.height, s.width);
    std::copy(out.pixels.begin(), out.pixels.end(), pixels.begin() + (i - begin) * image_bytes);
  });
}

int64_t write_split(WorkPool& pool, StoreWriter& writer, const std::string& name,
                    const std::vector<Item>& items, const Settings& s, Progress& progress,
                    int64_t& done, Skipped& skipped, std::vector<int64_t>& per_class) {
  writer.begin_split(name);
  const size_t block = static_cast<size_t>(64 * s.threads);
  const size_t image_bytes = static_cast<size_t>(s.height) * s.width * s.channels;
  std::vector<uint8_t> pixels, kept;
  std::vector<std::string> errors;
  std::vector<int32_t> labels;
  for (size_t begin = 0; begin < items.size(); begin += block) {
    const size_t end = std::min(items.size(), begin + block);
    decode_block(pool, items, begin, end, s, pixels, errors);
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
      ++per_class[static_cast<size_t>(items[i].label)];
    }
    writer.append(kept.data(), labels.data(), static_cast<int64_t>(labels.size()));
    progress.update(done += static_cast<int64_t>(end - begin));
  }
  return writer.split_count();
}

// One image of an encoded split: its bytes and what they decode to.
struct Encoded {
  std::vector<uint8_t> bytes;
  int32_t shape[3] = {0, 0, 0};
  bool kept = false;           // the source's own JPEG bytes
  std::vector<uint8_t> stats;  // pixels (n, C) for the train statistics; empty when not sampled
};

// Note [Encoded statistics]: the train split's mean and std come from a full decode of every
// 8th image (by position in the split, so the same whatever the threads); every other image is
// decoded at scale 1/8 only, which entropy-decodes all of its data (so truncated or corrupt
// bytes are still found) at a fraction of the cost. The mean of a 1/8 decode would do (DC
// coefficients are block means), its std would not (the variance inside a block is gone).
constexpr size_t kStatsEvery = 8;

// Note [Kept bytes]: a JPEG within --max-side that libjpeg decodes to RGB or gray is stored
// as it came (its quality untouched, no time spent encoding); anything else (a PNG, a CMYK
// JPEG, one larger than --max-side) is decoded, shrunk to fit --max-side and encoded at
// --quality.
void encode_one(const std::string& path, const Settings& s, bool sample_stats, Encoded* e,
                std::string* error) {
  const std::vector<uint8_t> src = read_bytes(path);
  codec::JpegHeader header;
  bool keep = false;
  int height = 0, width = 0;  // of what is stored
  if (codec::is_jpeg(src.data(), src.size())) {
    if (!codec::read_jpeg_header(src.data(), src.size(), &header, &*error)) return;
    if (int64_t{header.height} * header.width > s.max_pixels) {
      *error = codec::pixel_cap_error("JPEG", header.width, header.height, s.max_pixels);
      return;
    }
    keep = !header.cmyk && (s.max_side == 0 || std::max(header.height, header.width) <= s.max_side);
  }
  if (keep) {
    e->bytes = src;
    height = header.height, width = header.width;
  } else {
    codec::Image image;
    if (!codec::decode_image(src.data(), src.size(), s.channels, s.max_pixels, &image, &*error))
      return;
    const int side = std::max(image.height, image.width);
    if (s.max_side > 0 && side > s.max_side) {
      const double f = static_cast<double>(s.max_side) / side;
      codec::Image small;
      small.height = std::max(1, static_cast<int>(std::lround(image.height * f)));
      small.width = std::max(1, static_cast<int>(std::lround(image.width * f)));
      small.channels = image.channels;
      small.pixels.resize(static_cast<size_t>(small.height) * small.width * small.channels);
      codec::resize_bilinear_aa(image.pixels.data(), image.height, image.width, image.channels,
                                small.pixels.data(), small.height, small.width);
      image = std::move(small);
    }
    e->bytes = codec::encode_jpeg(image, s.quality);
    height = image.height, width = image.width;
  }
  e->kept = keep;
  // Validate what is stored (and sample the statistics) by decoding it.
  codec::Image decoded;
  codec::Region scaled;
  const codec::Region whole{0, 0, static_cast<double>(height), static_cast<double>(width)};
  const int min_side = sample_stats ? std::max(height, width) : 1;
  if (!codec::decode_jpeg_region(e->bytes.data(), e->bytes.size(), s.channels, whole, min_side,
                                 min_side, 0, &decoded, &scaled, &*error, height, width))
    return;
  e->shape[0] = height, e->shape[1] = width, e->shape[2] = s.channels;
  if (sample_stats) e->stats = std::move(decoded.pixels);
}

int64_t write_encoded_split(WorkPool& pool, StoreWriter& writer, const std::string& name,
                            const std::vector<Item>& items, const Settings& s, Progress& progress,
                            int64_t& done, Skipped& skipped, int64_t& kept,
                            std::vector<int64_t>& per_class) {
  writer.begin_split(name, SplitEncoding::kJpeg);
  const size_t block = static_cast<size_t>(64 * s.threads);
  std::vector<Encoded> out;
  std::vector<std::string> errors;
  std::vector<uint8_t> bytes;
  std::vector<int64_t> sizes;
  std::vector<int32_t> shapes, labels;
  for (size_t begin = 0; begin < items.size(); begin += block) {
    const size_t end = std::min(items.size(), begin + block);
    out.assign(end - begin, Encoded{});
    for_each_item(pool, begin, end, errors, [&](size_t i, std::string& error) {
      encode_one(items[i].path, s, name == "train" && i % kStatsEvery == 0, &out[i - begin],
                 &error);
    });
    bytes.clear(), sizes.clear(), shapes.clear(), labels.clear();
    for (size_t i = begin; i < end; ++i) {
      const Encoded& e = out[i - begin];
      const std::string& error = errors[i - begin];
      if (!error.empty()) {
        skipped.add(items[i].path, error, "corrupt or unreadable image");
        continue;
      }
      bytes.insert(bytes.end(), e.bytes.begin(), e.bytes.end());
      sizes.push_back(static_cast<int64_t>(e.bytes.size()));
      shapes.insert(shapes.end(), e.shape, e.shape + 3);
      labels.push_back(items[i].label);
      ++per_class[static_cast<size_t>(items[i].label)];
      if (!e.stats.empty())
        writer.add_train_pixels(e.stats.data(), static_cast<int64_t>(e.stats.size()) / s.channels);
      kept += e.kept ? 1 : 0;
    }
    writer.append_encoded(bytes.data(), sizes.data(), shapes.data(), labels.data(),
                          static_cast<int64_t>(labels.size()));
    progress.update(done += static_cast<int64_t>(end - begin));
  }
  return writer.split_count();
}

// The image files of one class folder, sorted; links that go nowhere are skipped.
std::vector<std::string> class_files(const fs::path& dir, Skipped& skipped) {
  std::string why;
  std::vector<std::string> files;
  for (const auto& e : list_dir(dir)) {
    if (!is_image_name(e.path())) continue;  // a README, a .txt of labels: not ours
    const Kind k = kind_of(e, &why);
    if (k == Kind::kFile)
      files.push_back(e.path().string());
    else
      skipped.add(e.path().string(), why, reason_of(k));
  }
  std::sort(files.begin(), files.end());
  return files;
}

// The class subfolders of `root`, sorted; a broken link among them is skipped like a bad
// image, as it may have been meant as a class. Files beside the class folders are ignored.
std::vector<fs::path> class_dirs_of(const fs::path& root, Skipped& skipped) {
  std::error_code ec;
  DDPV_CHECK(fs::is_directory(root, ec), root.string(), ": not a directory");
  std::string why;
  std::vector<fs::path> dirs;
  for (const auto& e : list_dir(root)) {
    const Kind k = kind_of(e, &why);
    if (k == Kind::kDirectory)
      dirs.push_back(e.path());
    else if (k == Kind::kLoop || k == Kind::kDangling || k == Kind::kUnreadable)
      skipped.add(e.path().string(), why, reason_of(k));
  }
  DDPV_CHECK(!dirs.empty(), root.string(), ": no class subfolders (expected root/<class>/<image>)");
  return dirs;
}

// --val-labels: "FILE CLASS" per line (CLASS a class folder name of the train tree or a label
// index; blank lines and lines starting with # ignored) for the flat val folder `root`.
std::vector<Item> labelled_val(const fs::path& root, const std::string& labels_path,
                               const std::vector<std::string>& names, Skipped& skipped) {
  std::ifstream in(labels_path);
  DDPV_CHECK(in.good(), labels_path, ": cannot open --val-labels");
  std::map<std::string, int32_t> label_of;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    std::istringstream words(line);
    std::string file, cls, extra;
    if (!(words >> file) || file[0] == '#') continue;
    DDPV_CHECK(static_cast<bool>(words >> cls) && !(words >> extra), labels_path, ":", number,
               ": expected 'FILE CLASS', got '", line, "'");
    int32_t label = -1;
    const auto it = std::find(names.begin(), names.end(), cls);
    if (it != names.end()) {
      label = static_cast<int32_t>(it - names.begin());
    } else {
      char* endp = nullptr;
      const long v = std::strtol(cls.c_str(), &endp, 10);
      DDPV_CHECK(*endp == '\0' && !cls.empty() && v >= 0 && v < static_cast<long>(names.size()),
                 labels_path, ":", number, ": class '", cls,
                 "' is neither a class folder of the train tree nor an index below ", names.size());
      label = static_cast<int32_t>(v);
    }
    DDPV_CHECK(label_of.emplace(file, label).second, labels_path, ":", number, ": '", file,
               "' is labelled twice");
  }
  std::vector<Item> items;
  std::string why;
  for (const auto& e : list_dir(root)) {
    if (!is_image_name(e.path())) continue;
    const auto it = label_of.find(e.path().filename().string());
    if (it == label_of.end()) {
      skipped.add(e.path().string(), "not listed in " + labels_path, "unlabelled val image");
      continue;
    }
    const Kind k = kind_of(e, &why);
    if (k == Kind::kFile)
      items.push_back(Item{e.path().string(), it->second});
    else
      skipped.add(e.path().string(), why, reason_of(k));
    label_of.erase(it);
  }
  DDPV_CHECK(label_of.empty(), labels_path, ": lists '", label_of.begin()->first,
             "', which is not an image in ", root.string(),
             (label_of.size() > 1 ? " (and " + std::to_string(label_of.size() - 1) + " more)"
                                  : std::string()));
  return items;
}

}  // namespace

int run_folder(const Args& args) {
  po::options_description options("folder options");
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto add = options.add_options();
  add("root", po::value<std::string>(),
      "folder with one subfolder of images per class, split into train and val by "
      "--val-fraction");
  add("train-root", po::value<std::string>(),
      "instead of --root: the train tree (one subfolder per class)");
  add("val-root", po::value<std::string>(),
      "with --train-root: the val tree, one subfolder per class (named as the train ones), or "
      "a flat folder with --val-labels");
  add("val-labels", po::value<std::string>(),
      "labels of a flat --val-root: 'FILE CLASS' per line, CLASS a train class folder's name or "
      "index");
  add("encode", po::value<std::string>()->default_value("raw"),
      "raw (decoded, resized to --size) or jpeg (JPEG bytes as they are, Note [Kept bytes])");
  add("size", po::value<std::string>(),
      "raw: output size HxW or N (shorter side resized, center crop); jpeg: the crop size "
      "training defaults to (default 224)");
  add("max-side", po::value<int>()->default_value(0),
      "jpeg: images with a longer side are shrunk to it and re-encoded (0: keep any size)");
  add("quality", po::value<int>()->default_value(90), "jpeg: quality of re-encoded images");
  add("channels", po::value<int>()->default_value(3), "3 (RGB) or 1 (grayscale)");
  add("val-fraction", po::value<double>()->default_value(0.1),
      "with --root: share of each class put in the 'val' split");
  add("seed", po::value<uint64_t>()->default_value(0), "seed of the train/val split");
  add("threads", po::value<int>()->default_value(cores), "decoding threads");
  add("strict", po::bool_switch(), "stop at the first corrupt image instead of skipping it");
  add("max-pixels", po::value<int64_t>()->default_value(int64_t{1} << 26),
      "largest image (width x height) accepted, checked before decoding");
  add_writer_options(options);
  po::variables_map vm;
  if (!parse_args("folder",
                  "(--root DIR | --train-root DIR [--val-root DIR [--val-labels F]]) "
                  "[--encode raw|jpeg] [--size HxW] --out OUT.h5",
                  options, args, vm))
    return 0;
  const std::string encode = vm["encode"].as<std::string>();
  if (encode != "raw" && encode != "jpeg")
    throw UsageError("--encode '" + encode + "' is not understood: use raw or jpeg");
  const bool jpeg = encode == "jpeg";
  if (!jpeg && !vm.count("size")) throw UsageError("--size is required with --encode raw");
  const auto [height, width] = parse_size(vm.count("size") ? vm["size"].as<std::string>() : "224");
  Settings s{height,
             width,
             vm["channels"].as<int>(),
             vm["threads"].as<int>(),
             vm["max-pixels"].as<int64_t>(),
             vm["strict"].as<bool>(),
             jpeg,
             vm["max-side"].as<int>(),
             vm["quality"].as<int>()};
  if (s.channels != 1 && s.channels != 3) throw UsageError("--channels must be 1 or 3");
  if (s.threads < 1 || s.threads > 256) throw UsageError("--threads must be in 1..256");
  if (s.max_pixels < 1) throw UsageError("--max-pixels must be positive");
  if (s.max_side < 0 || s.max_side > 65535) throw UsageError("--max-side must be in 0..65535");
  if (s.quality < 1 || s.quality > 100) throw UsageError("--quality must be in 1..100");
  if (!jpeg && (!vm["max-side"].defaulted() || !vm["quality"].defaulted()))
    throw UsageError("--max-side and --quality apply to --encode jpeg");
  const bool two_trees = vm.count("train-root") > 0;
  if (two_trees == (vm.count("root") > 0))
    throw UsageError(
        "give either --root (one tree, split by --val-fraction) or --train-root "
        "(and optionally --val-root)");
  if (!two_trees && (vm.count("val-root") || vm.count("val-labels")))
    throw UsageError("--val-root and --val-labels go with --train-root, not --root");
  if (vm.count("val-labels") && !vm.count("val-root"))
    throw UsageError("--val-labels needs --val-root (the folder of the images it labels)");
  if (two_trees && !vm["val-fraction"].defaulted())
    throw UsageError(
        "--val-fraction splits a --root tree; with --train-root the val split is "
        "--val-root");
  const double val_fraction = two_trees ? 0.0 : vm["val-fraction"].as<double>();
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    throw UsageError("--val-fraction must be in [0, 1)");
  const StoreWriterOptions wopt = writer_options(vm);
  const auto start = std::chrono::steady_clock::now();

  const fs::path root = vm[two_trees ? "train-root" : "root"].as<std::string>();
  Skipped skipped(s.strict);
  const std::vector<fs::path> class_dirs = class_dirs_of(root, skipped);
  std::vector<std::string> names;
  std::vector<Item> train, val;
  const uint64_t seed = vm["seed"].as<uint64_t>();
  for (size_t c = 0; c < class_dirs.size(); ++c) {
    std::vector<std::string> files = class_files(class_dirs[c], skipped);
    DDPV_CHECK(!files.empty(), class_dirs[c].string(),
               ": empty class folder (no .jpg, .jpeg or .png files); remove it or add images");
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
  if (vm.count("val-root")) {
    const fs::path val_root = vm["val-root"].as<std::string>();
    if (vm.count("val-labels")) {
      std::error_code ec;
      DDPV_CHECK(fs::is_directory(val_root, ec), val_root.string(), ": not a directory");
      val = labelled_val(val_root, vm["val-labels"].as<std::string>(), names, skipped);
    } else {
      for (const fs::path& dir : class_dirs_of(val_root, skipped)) {
        const std::string cls = dir.filename().string();
        const auto it = std::find(names.begin(), names.end(), cls);
        DDPV_CHECK(it != names.end(), dir.string(), ": class '", cls,
                   "' is not a class folder of the train tree ", root.string());
        const std::vector<std::string> files = class_files(dir, skipped);
        DDPV_CHECK(!files.empty(), dir.string(),
                   ": empty class folder (no .jpg, .jpeg or .png files); remove it or add images");
        for (const std::string& f : files)
          val.push_back(Item{f, static_cast<int32_t>(it - names.begin())});
      }
    }
    DDPV_CHECK(!val.empty(), val_root.string(), ": no val images");
  }

  std::vector<std::string> inputs;
  for (const auto* list : {&train, &val})
    for (const Item& item : *list) inputs.push_back(item.path);
  const std::string out = output_path(vm, inputs);
  StoreWriter writer(out, height, width, s.channels, names, "folder: " + root.string(), wopt);
  int64_t done = 0, kept = 0;
  WorkPool pool(s.threads);
  std::vector<std::pair<std::string, int64_t>> counts;
  {
    Progress progress(jpeg ? "reading" : "decoding",
                      static_cast<int64_t>(train.size() + val.size()));
    for (const auto& [name, items] : {std::pair{"train", &train}, std::pair{"val", &val}}) {
      if (items->empty()) continue;
      std::vector<int64_t> listed(names.size(), 0), per_class(names.size(), 0);
      for (const Item& it : *items) ++listed[static_cast<size_t>(it.label)];
      counts.emplace_back(name, jpeg ? write_encoded_split(pool, writer, name, *items, s, progress,
                                                           done, skipped, kept, per_class)
                                     : write_split(pool, writer, name, *items, s, progress, done,
                                                   skipped, per_class));
      // A class whose every file was skipped would train as a class without examples.
      for (size_t c = 0; c < names.size(); ++c)
        DDPV_CHECK(listed[c] == 0 || per_class[c] > 0, "class '", names[c], "': every ", name,
                   " image of it was skipped (see the warnings); fix or remove them");
    }
  }
  writer.commit();
  print_summary(out, counts, height, width, s.channels, names.size(), start, jpeg);
  if (jpeg) {
    int64_t total = 0;
    for (const auto& c : counts) total += c.second;
    std::printf(
        "ddpv-convert: JPEG store: %lld images kept as they were, %lld re-encoded "
        "(quality %d); training crops to %dx%d unless --crop\n",
        static_cast<long long>(kept), static_cast<long long>(total - kept), s.quality, height,
        width);
  }
  const std::string skips = skipped.summary();
  if (!skips.empty())
    std::printf("ddpv-convert: skipped %s (see the warnings; --strict makes them fatal)\n",
                skips.c_str());
  return 0;
}

}  // namespace ddpv::convert
