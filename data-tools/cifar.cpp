// ddpv-convert cifar: CIFAR-10 and CIFAR-100 binary batches (planar RGB records).
#include <filesystem>

#include "convert.hpp"
#include "ddpv/core/error.hpp"

namespace ddpv::convert {
namespace {

constexpr int kSide = CifarLayout::kSide;
constexpr int64_t kPixels = CifarLayout::kPixels;
const std::vector<std::string> kCifar10 = {"airplane", "automobile", "bird",  "cat",  "deer",
                                           "dog",      "frog",       "horse", "ship", "truck"};
using Layout = CifarLayout;

// CIFAR-100 ships fine_label_names.txt / coarse_label_names.txt next to its batches.
std::vector<std::string> default_names(const Layout& layout, bool fine, const std::string& batch) {
  if (layout.num_classes == 10) return kCifar10;
  const auto dir = std::filesystem::path(batch).parent_path();
  const auto file = dir / (fine ? "fine_label_names.txt" : "coarse_label_names.txt");
  std::error_code ec;
  if (std::filesystem::is_regular_file(file, ec)) return read_class_names(file.string());
  std::vector<std::string> names;
  for (int c = 0; c < layout.num_classes; ++c) names.push_back(std::to_string(c));
  return names;
}

void write_files(StoreWriter& writer, const std::string& split,
                 const std::vector<std::string>& files, const Layout& layout, Progress& progress,
                 int64_t& done, std::vector<std::pair<std::string, int64_t>>& counts) {
  writer.begin_split(split);
  std::vector<uint8_t> images;
  std::vector<int32_t> labels;
  for (const std::string& path : files) {
    const std::vector<uint8_t> bytes = read_file(path);
    const int64_t n = decode_cifar(bytes.data(), bytes.size(), layout, path, &images, &labels);
    try {
      writer.check_labels(labels.data(), n);
    } catch (const ddpv::Error& e) {
      DDPV_FAIL(path, ": ", e.message());
    }
    writer.append(images.data(), labels.data(), n);
    progress.update(done += n);
  }
  counts.emplace_back(split, writer.split_count());
}

}  // namespace

int64_t decode_cifar(const uint8_t* bytes, size_t size, const CifarLayout& layout,
                     const std::string& path, std::vector<uint8_t>* images,
                     std::vector<int32_t>* labels) {
  const uint64_t record = static_cast<uint64_t>(layout.record());
  DDPV_CHECK(size > 0 && size % record == 0, path, ": size ", size,
             " is not a multiple of the ", record, "-byte record of CIFAR-", layout.num_classes,
             layout.num_classes == 10 ? " (is this a CIFAR-100 file? use --variant 100)"
                                      : " (is this a CIFAR-10 file? use --variant 10)");
  const int64_t n = static_cast<int64_t>(size / record);
  images->resize(static_cast<size_t>(n * kPixels));
  labels->resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* rec = bytes + i * layout.record();
    (*labels)[static_cast<size_t>(i)] = rec[layout.label_offset];
    const uint8_t* planes = rec + layout.label_bytes;  // (C, H, W): R plane, G plane, B plane
    uint8_t* out = images->data() + i * kPixels;       // (H, W, C)
    for (int p = 0; p < kSide * kSide; ++p)
      for (int c = 0; c < 3; ++c) out[p * 3 + c] = planes[c * kSide * kSide + p];
  }
  return n;
}

int run_cifar(const Args& args) {
  po::options_description options("cifar options");
  auto add = options.add_options();
  add("variant", po::value<int>()->default_value(10), "10 (CIFAR-10) or 100 (CIFAR-100)");
  add("train", po::value<std::vector<std::string>>()->multitoken()->required(),
      "train batches, e.g. data_batch_{1..5}.bin");
  add("test", po::value<std::vector<std::string>>()->multitoken(),
      "test batch(es), e.g. test_batch.bin");
  add("label", po::value<std::string>()->default_value("fine"),
      "CIFAR-100 labels: fine (100 classes) or coarse (20)");
  add("class-names", po::value<std::string>(), "file with one class name per line (label order)");
  add_writer_options(options);
  po::variables_map vm;
  if (!parse_args("cifar", "[--variant 10|100] --train F... [--test F...] --out OUT.h5", options,
                  args, vm))
    return 0;
  const int variant = vm["variant"].as<int>();
  if (variant != 10 && variant != 100) throw UsageError("--variant must be 10 or 100");
  const std::string label = vm["label"].as<std::string>();
  if (label != "fine" && label != "coarse") throw UsageError("--label must be fine or coarse");
  const bool fine = label == "fine";
  const Layout layout = variant == 10 ? Layout{1, 0, 10} : Layout{2, fine ? 1 : 0, fine ? 100 : 20};
  const StoreWriterOptions wopt = writer_options(vm);
  const auto start = std::chrono::steady_clock::now();

  const auto train = vm["train"].as<std::vector<std::string>>();
  const auto test =
      vm.count("test") ? vm["test"].as<std::vector<std::string>>() : std::vector<std::string>{};
  std::vector<std::string> names = vm.count("class-names")
                                       ? read_class_names(vm["class-names"].as<std::string>())
                                       : default_names(layout, fine, train[0]);
  DDPV_CHECK(static_cast<int>(names.size()) == layout.num_classes, "CIFAR-", variant, " (", label,
             ") has ", layout.num_classes, " classes but ", names.size(),
             " class names were given");
  int64_t total = 0, done = 0;
  for (const auto* list : {&train, &test})
    for (const auto& f : *list) {
      std::error_code ec;
      total += static_cast<int64_t>(std::filesystem::file_size(f, ec) / layout.record());
    }

  std::vector<std::string> inputs = train;
  inputs.insert(inputs.end(), test.begin(), test.end());
  if (vm.count("class-names")) inputs.push_back(vm["class-names"].as<std::string>());
  const std::string out = output_path(vm, inputs);
  StoreWriter writer(out, kSide, kSide, 3, names,
                     "cifar-" + std::to_string(variant) + ": " + train[0], wopt);
  std::vector<std::pair<std::string, int64_t>> counts;
  {
    Progress progress("converting", total);
    write_files(writer, "train", train, layout, progress, done, counts);
    if (!test.empty()) write_files(writer, "test", test, layout, progress, done, counts);
  }
  writer.commit();
  print_summary(out, counts, kSide, kSide, 3, names.size(), start);
  return 0;
}

}  // namespace ddpv::convert
