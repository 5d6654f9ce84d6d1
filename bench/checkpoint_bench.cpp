// Checkpoint write and load times for ResNet-20 (CIFAR shape) and ResNet-50 (ImageNet shape)
// arenas on the CPU backend: save_checkpoint (build in memory, write, fsync, rename), the
// trainer's check after writing (verify_checkpoint_file: read back past the page cache, verify)
// and load_checkpoint (read, verify, parse, copy into the arenas); best of a few runs each, as
// the machine may be shared.
//   checkpoint_bench [DIR] [RUNS]    (DIR: where the files go, default the temp dir)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "ddpv/nn/model.hpp"
#include "ddpv/train/checkpoint.hpp"

namespace {

double best(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

template <typename F>
double seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  const fs::path dir = argc > 1 ? fs::path(argv[1]) : fs::temp_directory_path();
  const int runs = argc > 2 ? std::max(1, std::atoi(argv[2])) : 5;
  ddpv::BackendOptions bo;
  bo.device = ddpv::Device::kCpu;
  bo.threads = 1;
  auto backend = ddpv::make_backend(bo);
  struct Case {
    const char* model;
    ddpv::Shape input;
    int classes;
  };
  for (const Case& c : {Case{"resnet20", ddpv::Shape{32, 32, 3}, 10},
                        Case{"resnet50", ddpv::Shape{224, 224, 3}, 1000}}) {
    auto model = ddpv::make_model(c.model, *backend, c.input, c.classes);
    model->init_parameters(1);
    const std::string path =
        (dir / ("ddpv-ckpt-bench-" + std::to_string(getpid()) + ".h5")).string();
    std::vector<double> save, verify, load;
    for (int r = 0; r < runs; ++r) {
      save.push_back(seconds([&] { ddpv::save_checkpoint(path, *model, ddpv::CheckpointMeta{}); }));
      verify.push_back(seconds([&] { ddpv::verify_checkpoint_file(path, nullptr); }));
      load.push_back(seconds([&] { ddpv::load_checkpoint(path, *model); }));
    }
    const double mb = static_cast<double>(fs::file_size(path)) / 1e6;
    std::printf("%-9s %7.1f MB  save %7.1f ms  verify after save %7.1f ms  load %7.1f ms\n",
                c.model, mb, 1e3 * best(save), 1e3 * best(verify), 1e3 * best(load));
    fs::remove(path);
  }
  return 0;
}
