// What the Winograd convolutions share (Note [Winograd convolution] in
// kernels/winograd/conv2d.cpp): the geometry of a layer's tiles, which layers take Winograd, which
// build of the tile loops this CPU runs, and the check that spares a filter transform when the
// weights have not changed. Used by the Winograd op (kernels/winograd/conv2d.cpp) and the
// single-channel one (kernels/single_channel/conv2d.cpp).
#include <algorithm>
#include <cstring>

#include "backend/cpu/kernels/winograd/winograd.hpp"

namespace ddpv::cpu {

bool weights_changed(std::vector<float>& seen, const float* w, size_t count) {
  if (seen.size() == count && std::memcmp(seen.data(), w, count * sizeof(float)) == 0) return false;
  seen.assign(w, w + count);
  return true;
}

WinogradGeometry winograd_geometry(const Conv2dConfig& cfg, int m) {
  WinogradGeometry g;
  g.m = m;
  g.r = cfg.kernel;
  g.alpha = m + cfg.kernel - 1;
  g.pad = cfg.padding;
  g.in_h = cfg.in_h;
  g.in_w = cfg.in_w;
  g.out_h = cfg.out_h();
  g.out_w = cfg.out_w();
  g.tiles_h = (g.out_h + m - 1) / m;
  g.tiles_w = (g.out_w + m - 1) / m;
  g.cin = cfg.in_channels;
  g.cout = cfg.out_channels;
  g.in_block = cfg.in_block > 0 ? cfg.in_block : cfg.in_channels;
  g.out_block = cfg.out_block > 0 ? cfg.out_block : cfg.out_channels;
  return g;
}

int winograd_tile(ConvAlgorithm algorithm, const Conv2dConfig& c) {
  if (algorithm == ConvAlgorithm::kDirect) return 0;
  if (c.stride != 1 || (c.kernel != 3 && c.kernel != 5)) return 0;
  if (c.in_channels % 8 != 0 || c.out_channels % 8 != 0) return 0;
  if (c.out_h() < 1 || c.out_w() < 1) return 0;
  // Outputs of 2 x 2 or less waste most of a 4 x 4 tile.
  const int m = std::min(c.out_h(), c.out_w()) <= 2 ? 2 : 4;
  if (algorithm == ConvAlgorithm::kWinograd) return m;
  // kAuto: where it was measured faster than oneDNN's direct kernels (conv_bench;
  // docs/performance.md, "CPU engine"): 16 channels and more. resnet20's stage 1 (16 -> 16, 3x3
  // on 32x32) joined once the transforms had their prefetches and shared columns; with the
  // first transforms it only broke even.
  return std::min(c.in_channels, c.out_channels) >= 16 ? m : 0;
}

const WinogradKernels* winograd_kernels_fastest(int m, int r) {
  const WinogradKernels* k = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl"))
    k = winograd_kernels_avx512(m, r);  // Note [Wide Winograd GEMMs]
  if (k == nullptr && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    k = winograd_kernels_avx2(m, r);
  if (k == nullptr) k = winograd_kernels_generic(m, r);
  return k;
}

}  // namespace ddpv::cpu
