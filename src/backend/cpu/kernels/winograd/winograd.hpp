// Private to the CPU backend: Winograd convolution (Note [Winograd convolution] in
// kernels/winograd/conv2d.cpp): the transform matrices, the shape of one layer's tiles, and the
// inner loops, compiled once per instruction set (kernels/winograd/per_isa_kernels.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_ops.hpp"
#include "backend/cpu/dnnl_check.hpp"
#include "ddpv/backend/backend.hpp"

namespace ddpv::cpu {

// F(m x m, r x r): m x m outputs of an r x r kernel from alpha x alpha inputs, alpha = m + r - 1.
// Row-major, in float: at (m x alpha), g (alpha x r), bt (alpha x alpha), so that for a 1-D
// correlation y_i = sum_k g_k d_{i+k} (i < m), y = at [(g w) * (bt d)] elementwise in the middle.
struct WinogradMatrices {
  int m = 0, r = 0, alpha = 0;
  std::vector<float> at, g, bt;
};
// The same matrices in double, exactly as constructed (tests check the identity on them).
struct WinogradMatricesF64 {
  int m = 0, r = 0, alpha = 0;
  std::vector<double> at, g, bt;
};
WinogradMatricesF64 winograd_matrices_f64(int m, int r);
WinogradMatrices winograd_matrices(int m, int r);
// Whether w has every entry the transform loops assume instead of reading (Note [Paired
// points] and Note [Known entries] in kernels/winograd/per_isa_kernels.hpp).
bool winograd_known_entries(const WinogradMatrices& w);

// One layer's tiling. Activations are n images of c channels in blocks of `block` channels
// (block == c: NHWC; Note [Blocked activations]); channel groups of 8 are contiguous in both.
struct WinogradGeometry {
  int m = 0, r = 0, alpha = 0, pad = 0;
  int in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  int tiles_h = 0, tiles_w = 0;
  int cin = 0, cout = 0, in_block = 0, out_block = 0;
  bool relu = false;  // output writes max(0, y) (Note [Fused ReLU])
  // Note [Max pooling fused into the convolution]: 2 where output writes the 2 x 2 max pooling
  // of its rectified tiles (m even) and output_adjoint takes its gradient; 0: none.
  int pool = 0;
  int tiles() const { return tiles_h * tiles_w; }
};

// The transformed buffers hold, tile after tile, each tile's alpha^2 points of `channels`
// values: a tile's transform reads or writes one contiguous run. The per-point GEMMs see the
// point's matrix (tiles x channels) at offset point * channels, one tile per row, with this
// row stride: a tile's floats plus a cache line, so that the rows of a matrix do not all fall
// on one cache set (a tile's size is often a multiple of 4 KiB).
inline int64_t winograd_tile_stride(int alpha, int channels) {
  return int64_t{alpha} * alpha * channels + 16;
}

// The per-point products: for each point p < points, C_p (m x n) = A_p B_p, or C_p += A_p B_p
// with `accumulate`. A_p(i, k) = a[p * a_point + i * a_row + k * a_col] (either layout of a
// transformed buffer, or its transpose), B_p row-major at b + p * b_point with row stride ldb,
// C_p likewise at c + p * c_point with ldc. n is a multiple of 8.
struct WinogradGemm {
  int64_t points = 0, m = 0, n = 0, k = 0;
  const float* a = nullptr;
  int64_t a_point = 0, a_row = 0, a_col = 0;
  const float* b = nullptr;
  int64_t b_point = 0, ldb = 0;
  float* c = nullptr;
  int64_t c_point = 0, ldc = 0;
  bool accumulate = false;
};

// The most tiles in a row of single_forward's output (it transforms a row's tiles first).
constexpr int kSingleForwardRowTiles = 16;

// The transforms over the tiles of images [n0, n1), with transformed buffers laid out as
// winograd_tile_stride says. Each runs its own OpenMP loop over images.
struct WinogradKernels {
  // v = bt d bt^T of every input tile d of x (zero outside the image).
  void (*input)(const WinogradGeometry& g, const float* bt, const float* x, int n0, int n1,
                float* v);
  // y = at mm at^T + bias of every output tile (bias null: none), cut to the output's size;
  // with g.pool, y is the pooling's output instead, its window positions at `positions`.
  // With stats (not with g.pool): also stats[c] += the sum of y over images [n0, n1) and
  // positions, per output channel c, and stats[cout + c] += the sum of its squares (Note
  // [Batch statistics from the convolution]).
  void (*output)(const WinogradGeometry& g, const float* at, const float* mm, const float* bias,
                 int n0, int n1, float* y, int32_t* positions, double* stats);
  // The adjoint of output: dm = at^T dy at of every output tile of dy (zero past its edge);
  // with g.pool, dy is the pooling's output gradient, routed by `positions`. With db, also
  // db += the sum of dy over images [n0, n1) and positions, per output channel (with g.pool:
  // of the pooled dy where `positions` has a window's maximum; Note [Bias gradient in
  // output_adjoint]).
  void (*output_adjoint)(const WinogradGeometry& g, const float* at, const float* dy,
                         const int32_t* positions, int n0, int n1, float* dm, float* db);
  // The adjoint of input: dx += bt^T dv bt, tile by tile (tiles overlap by r - 1).
  void (*input_adjoint)(const WinogradGeometry& g, const float* bt, const float* dv, int n0, int n1,
                        float* dx);
  // The per-point GEMMs (points in parallel).
  void (*gemm)(const WinogradGemm& args);
  // u[p][ci][co] = (g w g^T)[p] of the weights w[cout][cin][r][r], g being a x r.
  void (*filter)(const WinogradGeometry& g, const float* gm, const float* w, float* u);
  // dw[co][ci] = g^T du[.][ci][co] g, stored or (accumulate) added.
  void (*filter_adjoint)(const WinogradGeometry& g, const float* gm, const float* du, float* dw,
                         bool accumulate);
  // Note [Single-channel Winograd forward]: y (with g.pool: its pooling and positions) of the
  // one-channel images [n0, n1) of xp, zero-padded by g.pad and followed by 8 floats of slack,
  // from the transformed filters u[p][co], plus bias (null: none); whole tiles only.
  void (*single_forward)(const WinogradGeometry& g, const float* bt, const float* at,
                         const float* u, const float* xp, const float* bias, int n0, int n1,
                         float* y, int32_t* positions);
};
// The loops for F(m x m, r x r) compiled for AVX-512 and for AVX2 + FMA (null where not built
// or no such instance), and for the baseline instruction set (null where no such instance).
const WinogradKernels* winograd_kernels_avx512(int m, int r);
const WinogradKernels* winograd_kernels_avx2(int m, int r);
const WinogradKernels* winograd_kernels_generic(int m, int r);
// The fastest of those the CPU runs (null where none has the instance).
const WinogradKernels* winograd_kernels_fastest(int m, int r);

// Whether the count weights at w differ from `seen`, which then becomes their copy: the
// filter transforms run only when the weights changed (backward and evaluation see the
// weights the last forward transformed).
bool weights_changed(std::vector<float>& seen, const float* w, size_t count);

// The geometry of F(m x m, kernel) over the layer (no ReLU, no pooling; tiles cover the
// output, the last row and column of tiles possibly partial).
WinogradGeometry winograd_geometry(const Conv2dConfig& cfg, int m);

// The output tile size m for the layer, or 0 when it should (or must) run the direct
// convolution: algorithm kDirect, stride != 1, a kernel other than 3 or 5, channel counts not
// multiples of 8, a change of layout, or kAuto judging Winograd not worth it.
int winograd_tile(ConvAlgorithm algorithm, const Conv2dConfig& c);

std::unique_ptr<FusableConv> make_winograd_conv2d(const CpuContext& ctx, const Conv2dConfig& cfg,
                                                  int tile);

}  // namespace ddpv::cpu
