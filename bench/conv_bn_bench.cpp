// A Winograd convolution and the BatchNorm after it, training forward, on the CPU backend:
// BatchNorm reading its input for the batch statistics (oneDNN's passes) against taking them
// from the convolution's output transform (Note [Batch statistics from the convolution]),
// alternated in one run; median times of the convolution, the BatchNorm and both.
//   conv_bn_bench [--batch 64] [--threads 1] [--rounds 31]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ddpv/backend/backend.hpp"
#include "ddpv/core/rng.hpp"

namespace {

using Clock = std::chrono::steady_clock;
double now() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Layer {
  const char* name;
  int channels, hw;
};

// resnet20's three stages (3x3, stride 1, padding 1, no bias, BatchNorm + ReLU after).
const Layer kShapes[] = {
    {"stage1 16x32x32", 16, 32}, {"stage2 32x16x16", 32, 16}, {"stage3 64x8x8", 64, 8}};

}  // namespace

int main(int argc, char** argv) {
  int batch = 64, threads = 1, rounds = 31;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 == argc) {
      std::fprintf(stderr, "conv_bn_bench: option %s needs a value\n", argv[i]);
      return 2;
    }
    if (!std::strcmp(argv[i], "--batch"))
      batch = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads"))
      threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--rounds"))
      rounds = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "conv_bn_bench: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  using namespace ddpv;
  BackendOptions bo;
  bo.threads = threads;
  bo.conv_algorithm = ConvAlgorithm::kWinograd;
  auto be = make_backend(bo);
  const int blk = be->activation_block();
  std::printf("conv_bn_bench: batch %d, %d thread(s), activation block %d, median of %d rounds\n",
              batch, threads, blk, rounds);
  std::printf("%-17s %-13s %9s %9s %9s\n", "layer", "statistics", "conv", "batchnorm", "both");
  Rng rng(7);
  for (const Layer& s : kShapes) {
    Conv2dConfig c;
    c.in_channels = c.out_channels = s.channels;
    c.in_h = c.in_w = s.hw;
    c.kernel = 3;
    c.padding = 1;
    c.bias = false;
    c.in_block = c.out_block = block_for(s.channels, blk);
    BatchNormConfig bc;
    bc.channels = s.channels;
    bc.h = bc.w = s.hw;
    bc.block = c.out_block;
    const size_t n = size_t(batch) * s.hw * s.hw * s.channels;
    std::vector<float> x(n), y(n), z(n), w(size_t(s.channels) * s.channels * 9);
    std::vector<float> gamma(size_t(s.channels), 1.0f), beta(size_t(s.channels), 0.0f);
    std::vector<float> mean(size_t(s.channels), 0.0f), var(size_t(s.channels), 1.0f);
    for (auto& v : x) v = rng.normal();
    for (auto& v : w) v = 0.1f * rng.normal();
    // [0]: BatchNorm computes its statistics; [1]: the convolution hands them over.
    std::unique_ptr<Conv2dOp> conv[2] = {be->conv2d(c), be->conv2d(c)};
    std::unique_ptr<BatchNormOp> bn[2] = {be->batchnorm2d(bc), be->batchnorm2d(bc)};
    for (auto& b : bn) b->fuse_relu();
    if (!conv[1]->write_batch_stats(bn[1]->given_stats())) {
      std::fprintf(stderr, "conv_bn_bench: the convolution gives no statistics\n");
      return 1;
    }
    bn[1]->take_given_stats();
    std::vector<double> tc[2], tb[2];
    for (int r = -2; r < rounds; ++r)  // two warm-up rounds
      for (int a = 0; a < 2; ++a) {
        const double t0 = now();
        conv[a]->forward(batch, x.data(), w.data(), nullptr, y.data());
        const double t1 = now();
        bn[a]->forward_train(batch, y.data(), gamma.data(), beta.data(), z.data(), mean.data(),
                             var.data());
        const double t2 = now();
        if (r < 0) continue;
        tc[a].push_back(t1 - t0);
        tb[a].push_back(t2 - t1);
      }
    for (int a = 0; a < 2; ++a) {
      std::vector<double> both(tc[a].size());
      for (size_t i = 0; i < both.size(); ++i) both[i] = tc[a][i] + tb[a][i];
      std::printf("%-17s %-13s %7.3fms %7.3fms %7.3fms\n", s.name,
                  a == 0 ? "batchnorm's" : "the conv's", median(tc[a]) * 1e3, median(tb[a]) * 1e3,
                  median(both) * 1e3);
    }
  }
  return 0;
}
