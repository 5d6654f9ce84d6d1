// One convolution layer on the CPU backend, direct (oneDNN) against Winograd (Note [Winograd
// convolution]), alternated in one run: median time of forward, backward-data +
// backward-weights, and the ratio per layer.
//   conv_bench [--layers lenet|resnet20|all] [--batch 64] [--threads 1] [--rounds 15]
//              [--block -1]     (activation block: -1 the backend's, 0 NHWC, 8, 16)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ddpv/backend/backend.hpp"
#include "ddpv/core/rng.hpp"

namespace {

using Clock = std::chrono::steady_clock;
double now() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

struct Layer {
  const char* model;
  const char* name;
  int cin, cout, hw, kernel, padding;
};

// The stride-1 convolutions of lenet and resnet20 (resnet20: one of each stage's shapes).
const Layer kLayers[] = {
    {"lenet", "conv2 32->64 5x5 14x14", 32, 64, 14, 5, 2},
    {"resnet20", "stage1 16->16 3x3 32x32", 16, 16, 32, 3, 1},
    {"resnet20", "stage2 32->32 3x3 16x16", 32, 32, 16, 3, 1},
    {"resnet20", "stage3 64->64 3x3 8x8", 64, 64, 8, 3, 1},
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string which = "all";
  int batch = 64, threads = 1, rounds = 15, block = -1;
  for (int i = 1; i + 1 < argc + 1; i += 2) {
    if (i + 1 == argc) {
      std::fprintf(stderr, "conv_bench: option %s needs a value\n", argv[i]);
      return 2;
    }
    if (!std::strcmp(argv[i], "--layers"))
      which = argv[i + 1];
    else if (!std::strcmp(argv[i], "--batch"))
      batch = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads"))
      threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--rounds"))
      rounds = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--block"))
      block = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "conv_bench: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  using namespace ddpv;
  std::unique_ptr<Backend> backends[2];
  for (int a = 0; a < 2; ++a) {
    BackendOptions bo;
    bo.threads = threads;
    bo.activation_block = block;
    bo.conv_algorithm = a == 0 ? ConvAlgorithm::kDirect : ConvAlgorithm::kWinograd;
    backends[a] = make_backend(bo);
  }
  const int b = backends[0]->activation_block();
  std::printf("conv_bench: batch %d, %d thread(s), activation block %d, median of %d rounds\n",
              batch, threads, b, rounds);
  std::printf("%-9s %-26s %-22s %9s %9s %9s %9s %7s\n", "model", "layer", "winograd as", "fwd dir",
              "fwd win", "bwd dir", "bwd win", "ratio");
  Rng rng(7);
  for (const Layer& l : kLayers) {
    if (which != "all" && which != l.model) continue;
    Conv2dConfig c;
    c.in_channels = l.cin;
    c.out_channels = l.cout;
    c.in_h = c.in_w = l.hw;
    c.kernel = l.kernel;
    c.padding = l.padding;
    c.bias = true;
    c.in_block = block_for(l.cin, b);
    c.out_block = block_for(l.cout, b);
    const size_t nx = size_t(batch) * l.hw * l.hw * l.cin,
                 ny = size_t(batch) * l.hw * l.hw * l.cout;
    const size_t nw = size_t(l.cout) * l.cin * l.kernel * l.kernel;
    std::vector<float> x(nx), w(nw), bias(l.cout), y(ny), dy(ny), dx(nx), dw(nw), db(l.cout);
    for (auto& v : x) v = rng.normal();
    for (auto& v : dy) v = rng.normal();
    for (auto& v : w) v = 0.05f * rng.normal();
    std::unique_ptr<Conv2dOp> ops[2] = {backends[0]->conv2d(c), backends[1]->conv2d(c)};
    std::vector<double> fwd[2], bwd[2];
    for (int r = -2; r < rounds; ++r)  // two warm-up rounds
      for (int a = 0; a < 2; ++a) {
        const double t0 = now();
        ops[a]->forward(batch, x.data(), w.data(), bias.data(), y.data());
        const double t1 = now();
        ops[a]->backward(batch, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(),
                         false);
        const double t2 = now();
        if (r < 0) continue;
        fwd[a].push_back(t1 - t0);
        bwd[a].push_back(t2 - t1);
      }
    const double fd = median(fwd[0]), fw = median(fwd[1]), bd = median(bwd[0]), bw = median(bwd[1]);
    std::printf("%-9s %-26s %-22s %7.2fms %7.2fms %7.2fms %7.2fms %6.2fx\n", l.model, l.name,
                ops[1]->algorithm().c_str(), fd * 1e3, fw * 1e3, bd * 1e3, bw * 1e3,
                (fd + bd) / (fw + bw));
  }
  return 0;
}
