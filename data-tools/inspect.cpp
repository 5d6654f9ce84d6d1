// ddpv-convert inspect: summary of a store and a check of every invariant of the format.
#include <cstdio>
#include <iostream>

#include "convert.hpp"
#include "ddpv/h5/h5.hpp"
#include "ddpv/core/error.hpp"
#include "ddpv/data/image_store.hpp"

namespace ddpv::convert {
namespace {

std::string join_dims(const std::vector<int64_t>& d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + ")";
}

std::string join_floats(const std::vector<float>& v) {
  std::string s = "[";
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof(buf), "%s%.4f", i ? ", " : "", v[i]);
    s += buf;
  }
  return s + "]";
}

std::string describe_layout(hid_t file, const std::string& dataset) {
  h5::Handle ds = h5::open_dataset(file, dataset);
  const h5::Layout layout = h5::dataset_layout(ds.get());
  if (!layout.chunked) return "contiguous";
  std::string s = "chunks " + join_dims(layout.chunk_dims) + ", filters ";
  if (layout.filters.empty()) return s + "none";
  for (size_t i = 0; i < layout.filters.size(); ++i) s += (i ? "+" : "") + layout.filters[i];
  return s;
}

}  // namespace

int run_inspect(const Args& args) {
  po::options_description options("inspect options");
  auto add = options.add_options();
  add("store", po::value<std::string>()->required(),
      "the store to inspect (also the first positional argument)");
  add("read-all", po::bool_switch(),
      "also read every image (verifies checksums and compressed chunks)");
  po::positional_options_description positional;
  positional.add("store", 1);
  po::variables_map vm;
  options.add_options()("help,h", "print this help");
  try {
    po::store(po::command_line_parser(args).options(options).positional(positional).run(), vm);
    if (vm.count("help")) {
      std::cout << "usage: ddpv-convert inspect STORE.h5 [--read-all]\n\n" << options;
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }
  const std::string path = vm["store"].as<std::string>();
  const ImageStore store(path);  // validates every invariant or throws one line
  std::printf("store       %s\n", path.c_str());
  std::printf("format      %s, version %lld\n", kStoreFormat,
              static_cast<long long>(kStoreFormatVersion));
  std::printf("source      %s\n", store.source().empty() ? "-" : store.source().c_str());
  std::printf("images      %dx%dx%d (H x W x C), uint8\n", store.height(), store.width(),
              store.channels());
  std::printf("classes     %lld\n", static_cast<long long>(store.num_classes()));
  std::printf("mean        %s\n", join_floats(store.mean()).c_str());
  std::printf("std         %s\n", join_floats(store.std()).c_str());
  h5::Handle file = h5::open_file(path);
  for (const std::string& split : store.splits()) {
    const int64_t n = store.split_size(split);
    std::printf("split %-6s %lld images\n", split.c_str(), static_cast<long long>(n));
    std::printf("  images    %s\n", describe_layout(file.get(), split + "/images").c_str());
    std::printf("  labels    %s\n", describe_layout(file.get(), split + "/labels").c_str());
    std::vector<int64_t> counts(static_cast<size_t>(store.num_classes()), 0);
    for (int32_t l : store.labels(split)) ++counts[static_cast<size_t>(l)];
    std::printf("  per class");
    for (size_t c = 0; c < counts.size(); ++c)
      std::printf("%s %s: %lld", c ? "," : "", store.class_names()[c].c_str(),
                  static_cast<long long>(counts[c]));
    std::printf("\n");
    if (vm["read-all"].as<bool>()) {
      const int64_t block = std::max<int64_t>(1, (64 << 20) / store.image_bytes());
      std::vector<uint8_t> buf(static_cast<size_t>(std::min(block, n) * store.image_bytes()));
      for (int64_t b = 0; b < n; b += block)
        store.read_range(split, b, std::min(block, n - b), buf.data());
      std::printf("  read-all  every image read back\n");
    }
  }
  std::printf("OK: %s is a valid image store\n", path.c_str());
  return 0;
}

}  // namespace ddpv::convert
