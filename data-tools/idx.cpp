// ddpv-convert idx: MNIST-family IDX files (ubyte images and labels, gzip or raw).
#include <cstdio>
#include <iostream>
#include <sstream>

#include "convert.hpp"
#include "ddpv/core/error.hpp"

namespace ddpv::convert {
namespace {

const std::vector<std::string> kFashionMnist = {"T-shirt/top", "Trouser",   "Pullover", "Dress",
                                                "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                                "Bag",         "Ankle boot"};
const std::vector<std::string> kMnist = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};

// An IDX file's bytes and its checked header.
struct Idx : IdxHeader {
  std::vector<uint8_t> bytes;
  const uint8_t* data() const { return bytes.data() + offset; }
};

Idx read_idx(const std::string& path, int rank, const char* what) {
  Idx idx;
  idx.bytes = read_file(path);
  static_cast<IdxHeader&>(idx) = parse_idx(idx.bytes.data(), idx.bytes.size(), rank, path, what);
  return idx;
}

struct Pair {
  Idx images, labels;
  std::string labels_path;
  int64_t count() const { return images.dims[0]; }
};

Pair read_pair(const std::string& images_path, const std::string& labels_path) {
  Pair p{read_idx(images_path, 3, "images"), read_idx(labels_path, 1, "labels"), labels_path};
  DDPV_CHECK(p.images.dims[0] == p.labels.dims[0], images_path, " holds ", p.images.dims[0],
             " images but ", labels_path, " holds ", p.labels.dims[0], " labels");
  DDPV_CHECK(p.images.dims[1] > 0 && p.images.dims[2] > 0, images_path, ": empty images");
  return p;
}

void write_split(StoreWriter& writer, const std::string& name, const Pair& p, Progress& progress,
                 int64_t& done) {
  writer.begin_split(name);
  const int64_t n = p.count(), image = p.images.dims[1] * p.images.dims[2];
  constexpr int64_t kBlock = 8192;
  std::vector<int32_t> labels(kBlock);
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t m = std::min(kBlock, n - begin);
    for (int64_t i = 0; i < m; ++i) labels[static_cast<size_t>(i)] = p.labels.data()[begin + i];
    try {
      writer.check_labels(labels.data(), m);
    } catch (const ddpv::Error& e) {  // name the labels file: it holds the bad label
      DDPV_FAIL(p.labels_path, ": ", e.message());
    }
    writer.append(p.images.data() + begin * image, labels.data(), m);
    progress.update(done += m);
  }
}

}  // namespace

IdxHeader parse_idx(const uint8_t* b, size_t size, int rank, const std::string& path,
                    const char* what) {
  if (size < 4 || b[0] != 0 || b[1] != 0) {
    char magic[16] = "(too short)";
    if (size >= 4)
      std::snprintf(magic, sizeof(magic), "%02x %02x %02x %02x", b[0], b[1], b[2], b[3]);
    DDPV_FAIL(path, ": not an IDX file (bad magic ", magic, "); expected MNIST-style ", what,
              " such as train-", what, "-idx", rank == 3 ? 3 : 1, "-ubyte(.gz)");
  }
  DDPV_CHECK(b[2] == 0x08, path, ": IDX element type 0x", std::hex, int{b[2]},
             " is not unsigned byte (0x08)");
  DDPV_CHECK(b[3] == rank, path, ": IDX file has ", int{b[3]}, " dimensions, expected ", rank,
             " for ", what);
  IdxHeader h;
  h.offset = 4 + 4 * static_cast<size_t>(rank);
  DDPV_CHECK(size >= h.offset, path, ": file too short for its IDX header");
  // Each dim is below 2^32, so three of them can pass 2^64: a product that wrapped could
  // match a short file and send the reader past its end.
  const uint64_t data_bytes = size - h.offset;
  uint64_t expect = 1;
  bool wrapped = false;
  std::ostringstream dims;
  for (int i = 0; i < rank; ++i) {
    const uint8_t* p = b + 4 + 4 * i;
    const uint64_t d = (uint64_t{p[0]} << 24) | (uint64_t{p[1]} << 16) | (uint64_t{p[2]} << 8) | p[3];
    h.dims.push_back(static_cast<int64_t>(d));
    dims << (i ? "x" : "") << d;
    wrapped |= __builtin_mul_overflow(expect, d, &expect);
  }
  if (wrapped)
    DDPV_FAIL(path, ": the header declares dims ", dims.str(),
              ", more bytes than 64 bits can count: not an IDX file");
  DDPV_CHECK(data_bytes == expect, path, ": the header declares ", expect,
             " bytes of data (dims ", dims.str(), ") but the file holds ", data_bytes,
             ": truncated or not an IDX file");
  return h;
}

int run_idx(const Args& args) {
  po::options_description options("idx options");
  auto add = options.add_options();
  add("train-images", po::value<std::string>()->required(),
      "train images, e.g. train-images-idx3-ubyte.gz");
  add("train-labels", po::value<std::string>()->required(),
      "train labels, e.g. train-labels-idx1-ubyte.gz");
  add("test-images", po::value<std::string>(), "test images (t10k-images-idx3-ubyte.gz)");
  add("test-labels", po::value<std::string>(), "test labels (t10k-labels-idx1-ubyte.gz)");
  add("preset", po::value<std::string>(), "class names of fashion-mnist or mnist");
  add("class-names", po::value<std::string>(), "file with one class name per line (label order)");
  add_writer_options(options);
  po::variables_map vm;
  if (!parse_args(
          "idx", "--train-images F --train-labels F [--test-images F --test-labels F] --out OUT.h5",
          options, args, vm))
    return 0;
  if (vm.count("test-images") != vm.count("test-labels"))
    throw UsageError("--test-images and --test-labels go together");
  if (vm.count("preset") && vm.count("class-names"))
    throw UsageError("give --preset or --class-names, not both");
  const StoreWriterOptions wopt = writer_options(vm);
  std::vector<std::string> inputs;
  for (const char* o :
       {"train-images", "train-labels", "test-images", "test-labels", "class-names"})
    if (vm.count(o)) inputs.push_back(vm[o].as<std::string>());
  const std::string out = output_path(vm, inputs);
  const auto start = std::chrono::steady_clock::now();

  std::vector<std::pair<std::string, Pair>> splits;
  splits.emplace_back("train", read_pair(vm["train-images"].as<std::string>(),
                                         vm["train-labels"].as<std::string>()));
  if (vm.count("test-images"))
    splits.emplace_back("test", read_pair(vm["test-images"].as<std::string>(),
                                          vm["test-labels"].as<std::string>()));
  const int64_t h = splits[0].second.images.dims[1], w = splits[0].second.images.dims[2];
  for (const auto& [name, p] : splits)
    DDPV_CHECK(p.images.dims[1] == h && p.images.dims[2] == w, "the ", name, " images are ",
               p.images.dims[1], "x", p.images.dims[2], " but the train images are ", h, "x", w);

  std::vector<std::string> names;
  if (vm.count("preset")) {
    const std::string preset = vm["preset"].as<std::string>();
    if (preset == "fashion-mnist")
      names = kFashionMnist;
    else if (preset == "mnist")
      names = kMnist;
    else
      throw UsageError("--preset '" + preset + "' is unknown: use fashion-mnist or mnist");
  } else if (vm.count("class-names")) {
    names = read_class_names(vm["class-names"].as<std::string>());
  } else {  // numbered classes 0..max label
    int max_label = 0;
    for (const auto& [name, p] : splits)
      for (int64_t i = 0; i < p.count(); ++i)
        max_label = std::max<int>(max_label, p.labels.data()[i]);
    for (int c = 0; c <= max_label; ++c) names.push_back(std::to_string(c));
  }

  StoreWriter writer(out, static_cast<int>(h), static_cast<int>(w), 1, names,
                     "idx: " + vm["train-images"].as<std::string>(), wopt);
  int64_t total = 0, done = 0;
  for (const auto& [name, p] : splits) total += p.count();
  std::vector<std::pair<std::string, int64_t>> counts;
  {
    Progress progress("converting", total);
    for (const auto& [name, p] : splits) {
      write_split(writer, name, p, progress, done);
      counts.emplace_back(name, p.count());
    }
  }
  writer.commit();
  print_summary(out, counts, static_cast<int>(h), static_cast<int>(w), 1, names.size(), start);
  return 0;
}

}  // namespace ddpv::convert
