// A Winograd convolution, the BatchNorm and the ReLU after it, training forward, on the CPU
// backend: the plain ops one by one (BatchNorm reading its input for the batch statistics,
// then a ReLU pass) against the fused block (Note [Fused blocks]: the statistics from the
// convolution's output transform, Note [Batch statistics from the convolution], and the ReLU
// in the BatchNorm's pass), alternated in one run; median times.
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
  std::printf("%-17s %9s %9s %7s\n", "layer", "plain", "fused", "ratio");
  Rng rng(7);
  for (const Layer& s : kShapes) {
    FusedBlockConfig f;
    Conv2dConfig& c = f.conv;
    c.in_channels = c.out_channels = s.channels;
    c.in_h = c.in_w = s.hw;
    c.kernel = 3;
    c.padding = 1;
    c.bias = false;
    c.in_block = c.out_block = block_for(s.channels, blk);
    f.batch_norm = f.relu = true;
    BatchNormConfig& bc = f.bn;
    bc.channels = s.channels;
    bc.h = bc.w = s.hw;
    bc.block = c.out_block;
    const size_t n = size_t(batch) * s.hw * s.hw * s.channels;
    std::vector<float> x(n), y(n), z(n), saved(n), w(size_t(s.channels) * s.channels * 9);
    std::vector<float> gamma(size_t(s.channels), 1.0f), beta(size_t(s.channels), 0.0f);
    std::vector<float> mean(size_t(s.channels), 0.0f), var(size_t(s.channels), 1.0f);
    for (auto& v : x) v = rng.normal();
    for (auto& v : w) v = 0.1f * rng.normal();
    std::unique_ptr<Conv2dOp> conv = be->conv2d(c);
    std::unique_ptr<BatchNormOp> bn = be->batchnorm2d(bc);
    std::unique_ptr<FusedBlockOp> block = be->fused_block(f);
    if (!block || block->describe_batch_norm().find("statistics") == std::string::npos) {
      std::fprintf(stderr, "conv_bn_bench: the fused block takes no statistics from the conv\n");
      return 1;
    }
    FusedBlockParams p;
    p.w = w.data();
    p.gamma = gamma.data();
    p.beta = beta.data();
    p.running_mean = mean.data();
    p.running_var = var.data();
    std::vector<double> t[2];
    for (int r = -2; r < rounds; ++r)  // two warm-up rounds
      for (int a = 0; a < 2; ++a) {
        const double t0 = now();
        if (a == 0) {
          conv->forward(batch, x.data(), w.data(), nullptr, y.data());
          bn->forward_train(batch, y.data(), gamma.data(), beta.data(), z.data(), mean.data(),
                            var.data());
          be->relu_forward(int64_t(n), z.data(), z.data());
        } else {
          block->forward(batch, true, x.data(), p, nullptr, saved.data(), z.data());
        }
        if (r >= 0) t[a].push_back(now() - t0);
      }
    const double plain = median(t[0]), fused = median(t[1]);
    std::printf("%-17s %7.3fms %7.3fms %6.2fx\n", s.name, plain * 1e3, fused * 1e3, plain / fused);
  }
  return 0;
}
