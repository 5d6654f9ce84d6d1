// Loader throughput (images/s delivered by one loader thread) for Fashion-MNIST-like 28x28x1
// and CIFAR-like 32x32x3 stores, cached and read from HDF5, plus StoreWriter speed.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>

#include "ddpv/data/loader.hpp"
#include "ddpv/data/store_writer.hpp"

namespace {

// A store of n random images under the temp dir, written once per process and shape.
std::string bench_store(int64_t n, int h, int w, int c) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("ddpv-bench-" + std::to_string(getpid()) + "-" + std::to_string(h) +
                             "x" + std::to_string(w) + "x" + std::to_string(c) + ".h5"))
                               .string();
  if (std::filesystem::exists(path)) return path;
  std::mt19937 gen(1);
  const int64_t image = int64_t{h} * w * c, block = 4096;
  std::vector<uint8_t> images(static_cast<size_t>(block * image));
  std::vector<int32_t> labels(static_cast<size_t>(block));
  ddpv::StoreWriter writer(path, h, w, c, {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"},
                           "bench");
  writer.begin_split("train");
  for (int64_t b = 0; b < n; b += block) {
    const int64_t m = std::min(block, n - b);
    for (auto& v : images) v = static_cast<uint8_t>(gen());
    for (auto& l : labels) l = static_cast<int32_t>(gen() % 10);
    writer.append(images.data(), labels.data(), m);
  }
  writer.commit();
  return path;
}

struct StoreCleanup {
  ~StoreCleanup() {
    for (const auto& e :
         std::filesystem::directory_iterator(std::filesystem::temp_directory_path()))
      if (e.path().filename().string().rfind("ddpv-bench-" + std::to_string(getpid()) + "-", 0) ==
          0)
        std::filesystem::remove(e.path());
  }
} cleanup;

// Args: height, width, channels, augment (0/1), cache (0/1). Batch 128 per rank, as training.
void BM_Loader(benchmark::State& state) {
  const int h = static_cast<int>(state.range(0)), w = static_cast<int>(state.range(1)),
            c = static_cast<int>(state.range(2));
  const ddpv::ImageStore store(bench_store(c == 1 ? 60000 : 50000, h, w, c));
  ddpv::LoaderOptions opt;
  opt.batch_size = 128;
  opt.augment = state.range(3) != 0;
  opt.cache_mb = state.range(4) ? 2048 : 0;
  ddpv::Loader loader(store, opt);
  int64_t epoch = 0, images = 0;
  loader.start_epoch(epoch);
  for (auto _ : state) {
    auto batch = loader.next();
    if (!batch) {
      loader.start_epoch(++epoch);
      batch = loader.next();
    }
    images += batch->size;
    benchmark::DoNotOptimize(batch->images.raw());
  }
  state.SetItemsProcessed(images);
  state.counters["cached"] = loader.cached();
}
BENCHMARK(BM_Loader)
    ->ArgNames({"H", "W", "C", "augment", "cache"})
    ->Args({28, 28, 1, 1, 1})
    ->Args({28, 28, 1, 1, 0})
    ->Args({32, 32, 3, 1, 1})
    ->Args({32, 32, 3, 1, 0})
    ->Args({32, 32, 3, 0, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// Writing 70000 28x28x1 images (the HDF5 half of converting Fashion-MNIST).
void BM_StoreWriter(benchmark::State& state) {
  const int64_t n = 70000, image = 28 * 28;
  std::vector<uint8_t> images(static_cast<size_t>(n * image));
  std::mt19937 gen(2);
  for (auto& v : images) v = static_cast<uint8_t>(gen());
  std::vector<int32_t> labels(static_cast<size_t>(n), 3);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("ddpv-bench-" + std::to_string(getpid()) + "-writer.h5"))
                               .string();
  ddpv::StoreWriterOptions opt;
  opt.gzip_level = static_cast<int>(state.range(0));
  for (auto _ : state) {
    ddpv::StoreWriter writer(path, 28, 28, 1, {"0", "1", "2", "3"}, "bench", opt);
    writer.begin_split("train");
    for (int64_t b = 0; b < n; b += 8192)
      writer.append(images.data() + b * image, labels.data() + b, std::min<int64_t>(8192, n - b));
    writer.commit();
  }
  state.SetItemsProcessed(state.iterations() * n);
  std::filesystem::remove(path);
}
BENCHMARK(BM_StoreWriter)
    ->ArgName("gzip")
    ->Arg(-1)
    ->Arg(4)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
