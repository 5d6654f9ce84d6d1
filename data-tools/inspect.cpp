// ddpv-convert inspect: summary of a store and a check of every invariant of the format.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <thread>

#include "convert.hpp"
#include "data/image_codec.hpp"
#include "data/work_pool.hpp"
#include "ddpv/core/error.hpp"
#include "ddpv/data/image_store.hpp"
#include "ddpv/h5/h5.hpp"

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

// --read-all of an encoded split: every image read and decoded in full on all cores, its size
// checked against /shapes. Every bad image is named (the first 10), then it fails.
void read_all_encoded(const ImageStore& store, const std::string& split) {
  const int64_t n = store.split_size(split);
  const std::vector<int32_t>& shapes = store.shapes(split);
  const std::vector<int64_t>& offsets = store.offsets(split);
  WorkPool pool(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  std::mutex mu;
  std::vector<std::pair<int64_t, std::string>> bad;
  EncodedBatch batch;
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < n;) {
    int64_t e = b;  // about 64 MiB of bytes per read
    while (e < n && (e == b || offsets[static_cast<size_t>(e)] - offsets[static_cast<size_t>(b)] <
                                   (int64_t{64} << 20)))
      ++e;
    rows.resize(static_cast<size_t>(e - b));
    for (int64_t i = b; i < e; ++i) rows[static_cast<size_t>(i - b)] = i;
    store.read_encoded(split, rows.data(), rows.size(), &batch);
    pool.run(e - b, [&](int64_t k, int) {
      const int64_t i = b + k;
      codec::Image image;
      std::string error;
      const size_t at = static_cast<size_t>(3 * i);
      const bool ok = codec::decode_image(batch.bytes.data() + batch.begin[static_cast<size_t>(k)],
                                          static_cast<size_t>(batch.size[static_cast<size_t>(k)]),
                                          store.channels(), int64_t{1} << 32, &image, &error);
      if (ok && (image.height != shapes[at] || image.width != shapes[at + 1]))
        error = "decodes to " + std::to_string(image.height) + "x" + std::to_string(image.width) +
                " but /shapes says " + std::to_string(shapes[at]) + "x" +
                std::to_string(shapes[at + 1]);
      if (!ok || !error.empty()) {
        std::lock_guard<std::mutex> lock(mu);
        bad.emplace_back(i, error);
      }
    });
    b = e;
  }
  std::sort(bad.begin(), bad.end());
  for (size_t i = 0; i < bad.size() && i < 10; ++i)
    std::fprintf(stderr, "ddpv-convert inspect: %s: split '%s' image %lld: %s\n",
                 store.path().c_str(), split.c_str(), static_cast<long long>(bad[i].first),
                 bad[i].second.c_str());
  DDPV_CHECK(bad.empty(), store.path(), ": split '", split, "' has ", bad.size(),
             " image(s) that do not decode (the first is ", bad.empty() ? 0 : bad[0].first,
             "): convert the data again");
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
              static_cast<long long>(store.format_version()));
  std::printf("source      %s\n", store.source().empty() ? "-" : store.source().c_str());
  if (store.any_encoded())
    std::printf("images      JPEG, %d channels; training crops to %dx%d unless --crop\n",
                store.channels(), store.height(), store.width());
  else
    std::printf("images      %dx%dx%d (H x W x C), uint8\n", store.height(), store.width(),
                store.channels());
  std::printf("classes     %lld\n", static_cast<long long>(store.num_classes()));
  std::printf("mean        %s\n", join_floats(store.mean()).c_str());
  std::printf("std         %s\n", join_floats(store.std()).c_str());
  h5::Handle file = h5::open_file(path);
  for (const std::string& split : store.splits()) {
    const int64_t n = store.split_size(split);
    const bool encoded = store.encoding(split) != SplitEncoding::kRaw;
    std::printf("split %-6s %lld images%s\n", split.c_str(), static_cast<long long>(n),
                encoded ? ", JPEG" : "");
    if (encoded) {
      const std::vector<int32_t>& shapes = store.shapes(split);
      int32_t min_side = 0, max_side = 0;
      for (size_t i = 0; i < shapes.size(); i += 3) {
        const int32_t lo = std::min(shapes[i], shapes[i + 1]),
                      hi = std::max(shapes[i], shapes[i + 1]);
        min_side = i == 0 ? lo : std::min(min_side, lo);
        max_side = std::max(max_side, hi);
      }
      const double mb = static_cast<double>(store.offsets(split).back()) / (1 << 20);
      std::printf("  data      %.1f MiB (%.1f KiB an image), sides %d..%d, %s\n", mb,
                  n ? mb * 1024 / static_cast<double>(n) : 0.0, min_side, max_side,
                  describe_layout(file.get(), split + "/data").c_str());
    } else {
      std::printf("  images    %s\n", describe_layout(file.get(), split + "/images").c_str());
    }
    std::printf("  labels    %s\n", describe_layout(file.get(), split + "/labels").c_str());
    std::vector<int64_t> counts(static_cast<size_t>(store.num_classes()), 0);
    for (int32_t l : store.labels(split)) ++counts[static_cast<size_t>(l)];
    std::printf("  per class");
    for (size_t c = 0; c < counts.size(); ++c)
      std::printf("%s %s: %lld", c ? "," : "", store.class_names()[c].c_str(),
                  static_cast<long long>(counts[c]));
    std::printf("\n");
    if (vm["read-all"].as<bool>() && encoded) {
      read_all_encoded(store, split);
      std::printf("  read-all  every image read back and decoded\n");
    } else if (vm["read-all"].as<bool>()) {
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
