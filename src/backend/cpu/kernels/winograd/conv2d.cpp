// Conv2dOp by Winograd's minimal filtering (Note [Winograd convolution]): the filter
// transforms, the order of the stages and the chunks between threads. The matrices are in
// kernels/winograd/matrices.cpp, the choice of the layers it serves and of the loops in
// kernels/winograd/choice.cpp, the tile loops in kernels/winograd/per_isa_kernels.hpp.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "backend/cpu/cpu_ops.hpp"
#include "backend/cpu/kernels/simd/transpose8.hpp"
#include "backend/cpu/kernels/winograd/winograd.hpp"
#include "backend/cpu/team.hpp"

namespace ddpv::cpu {

constinit thread_local bool t_alone = false;  // Note [Alone in a chunk] (team.hpp)

// Note [Winograd convolution]: a stride-1 r x r convolution computes m x m outputs of a tile
// from the (m + r - 1)^2 inputs around it as Y = At [(G w Gt) * (Bt d B)] A, where * is
// elementwise (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2016).
// Summed over input channels, the elementwise products become one GEMM per point of the
// alpha x alpha transformed tile: (tiles x Cin) times (Cin x Cout). F(4x4, 5x5) needs 64
// multiplications per tile and channel pair where the direct method needs 16 * 25 = 400, so
// lenet's conv2 (32 -> 64 channels, 5x5 on 14x14), which ran near the sgemm peak in oneDNN's
// direct kernels and was most of the step, needs about a sixth of the arithmetic.
//
// Training needs all three directions, and each is the adjoint of a forward stage:
//   forward:          V = Bt d B,  U = G w Gt,  M_p = V_p U_p,  y = At M A (+ bias)
//   backward-data:    dM = A dy At,  dV_p = dM_p U_p^T,  dx = sum over tiles of B dV Bt
//   backward-weights: dU_p = V_p^T dM_p (summed over tiles),  dw = Gt dU G
// so the gradients are exactly those of the computed forward, up to rounding.
//
// The matrices come from the Cook-Toom construction on the points 0, 1, -1, 2, -2, 1/2, -1/2
// and infinity (winograd_matrices_f64). Rounding grows with the tile: F(4x4, 5x5) and
// F(4x4, 3x3) lose about 1e-5 of the magnitude of the sums in fp32 (the direct method: about
// 1e-7), which training does not notice (the golden tests against PyTorch run through it).
//
// The transforms are memory-bound passes; the GEMMs are our own (Note [Winograd GEMMs] in
// kernels/winograd/per_isa_kernels.hpp). Images go through in
// chunks so that a chunk's transformed input and output stay in cache between the transform
// and the GEMM that reads it. The layers it serves (winograd_tile, kernels/winograd/choice.cpp) are
// those where it was measured faster than oneDNN's direct kernels (conv_bench; the ratios in
// docs/performance.md, "CPU engine").

namespace {

// Tiles per chunk of images (at least): the per-point GEMMs have this many rows. With fewer,
// each GEMM's fixed costs show; with more, the chunk's transformed tiles leave the L2 cache
// before the next stage reads them. In conv_bench (lenet's conv2 against oneDNN's direct
// kernels, on AVX2) 32 and 64 rows beat 16 and 128; resnet20's shapes did not care. Once the
// weight gradient's products ran on packed panels (Note [Packed weight-gradient panels]),
// whose k is this many rows, 64 rows won narrowly over 32 in lenet's step, alternated, with
// resnet20 unchanged.
constexpr int kChunkRows = 64;

}  // namespace

namespace {

// Note [Page-aligned transformed buffers]: the transforms' time depended on where malloc put
// the transformed buffers within a page (past glibc's mmap threshold, which rises after the
// first large free, a large block starts at any 16-byte offset): with an unrelated 3 KB
// allocation made earlier, conv2's output transform and output_adjoint took a markedly larger
// share of lenet's step (model_bench --sgd 1 under perf; aliasing between the tile loads and
// the stack copies they go to). Page-
// aligned buffers take that out of malloc's hands: offsets of 0, 8, 256 and 512 floats from
// a page boundary all gave the fast case. Grow-only; contents are not kept when it grows.
class PageBuffer {
 public:
  float* data() { return p_.get(); }
  void grow(size_t n) {
    if (n <= n_) return;
    const size_t bytes = (n * sizeof(float) + kPage - 1) / kPage * kPage;
    p_.reset(static_cast<float*>(std::aligned_alloc(kPage, bytes)));
    DDPV_CHECK(p_ != nullptr, "winograd: cannot allocate ", bytes, " bytes of transformed tiles");
    n_ = n;
  }

 private:
  static constexpr size_t kPage = 4096;
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float[], Free> p_;
  size_t n_ = 0;
};

const WinogradKernels* kernels_for(int m, int r) {
  const WinogradKernels* k = winograd_kernels_fastest(m, r);
  DDPV_CHECK(k != nullptr, "winograd: no loops built for F(", m, "x", m, ",", r, "x", r, ")");
  return k;
}

class WinogradConv2d final : public FusableConv {
 public:
  WinogradConv2d(const CpuContext& ctx, const Conv2dConfig& cfg, int tile)
      : ctx_(ctx),
        cfg_(cfg),
        mat_(winograd_matrices(tile, cfg.kernel)),
        kernels_(kernels_for(tile, cfg.kernel)) {
    geo_ = winograd_geometry(cfg, tile);
    const WinogradGeometry& g = geo_;
    points_ = int64_t{g.alpha} * g.alpha;
    vs_ = winograd_tile_stride(g.alpha, g.cin);
    ms_ = winograd_tile_stride(g.alpha, g.cout);
    chunk_ = (kChunkRows + g.tiles() - 1) / g.tiles();
    DDPV_CHECK(winograd_known_entries(mat_), "winograd: the matrices of F(", tile, "x", tile, ",",
               cfg.kernel, "x", cfg.kernel,
               ") lack entries the transforms assume (Note [Known entries])");
  }

  bool fuse_relu() override {
    geo_.relu = true;
    return true;
  }

  // Note [Input gradient added]: input_adjoint adds its tiles into dx anyway (they overlap);
  // backward then leaves out the zeroing in front of it.
  bool add_input_grad() override {
    add_dx_ = true;
    return true;
  }

  // Note [Batch statistics from the convolution]: the output transform holds each tile in
  // registers; forward adds it to per-thread sums.
  bool write_batch_stats(double* sums) override {
    stats_ = sums;
    return true;
  }

  std::string algorithm() const override {
    const std::string m = std::to_string(geo_.m), r = std::to_string(geo_.r);
    return "winograd F(" + m + "x" + m + "," + r + "x" + r + ")";
  }

  void forward_f32(int n, const float* x, const float* w, const float* b, float* y) override {
    check_conv_forward(cfg_, n, b);
    run_forward(geo_, n, x, w, b, y, nullptr);
  }

  void backward_f32(int n, const float* x, const float* w, const float* dy, float* dx, float* dw,
                    float* db, bool accumulate) override {
    check_conv_backward(cfg_, n, dw, db);
    run_backward(geo_, n, x, w, dy, nullptr, dx, dw, db, accumulate);
  }

  // Note [Max pooling fused into the convolution]: the output transform pools each rectified
  // tile while it is in registers (2 x 2 windows never straddle tiles of even size), and
  // output_adjoint reads the pooled gradient (Note [Pooled weight gradient]).
  bool fuse_max_pool(int kernel) override {
    if (!geo_.relu || kernel != 2 || geo_.m % 2 != 0 || geo_.out_h < 2 || geo_.out_w < 2)
      return false;
    pooled_geo_ = geo_;
    pooled_geo_.pool = 2;
    return true;
  }

  void forward_pooled(int n, const float* x, const float* w, const float* b, float* pooled,
                      int32_t* positions) override {
    check_conv_forward(cfg_, n, b);
    DDPV_CHECK(pooled_geo_.pool > 0, "winograd conv: forward_pooled without fuse_max_pool");
    run_forward(pooled_geo_, n, x, w, b, pooled, positions);
  }

  void backward_pooled(int n, const float* x, const float* w, const float* dpooled,
                       const int32_t* positions, float* dx, float* dw, float* db,
                       bool accumulate) override {
    check_conv_backward(cfg_, n, dw, db);
    DDPV_CHECK(pooled_geo_.pool > 0, "winograd conv: backward_pooled without fuse_max_pool");
    run_backward(pooled_geo_, n, x, w, dpooled, positions, dx, dw, db, accumulate);
  }

 private:
  // g: geo_, or pooled_geo_ with y the pooling's output and dy its gradient.
  void run_forward(const WinogradGeometry& g, int n, const float* x, const float* w, const float* b,
                   float* y, int32_t* positions) {
    ctx_.bind_threads();
    const int team = team_for(n);
    reserve(n, team);
    transform_filter(w);
    const float* bias = cfg_.bias ? b : nullptr;
    // Note [Batch statistics from the convolution]: thread 0 sums into stats_, the others
    // into their own, added in thread order after the chunks.
    const size_t stats = positions == nullptr && stats_ != nullptr ? 2 * size_t(g.cout) : 0;
    if (stats > 0) std::fill(stats_, stats_ + stats, 0.0);
    auto stats_of = [&](int t) {
      return stats == 0 ? nullptr : t == 0 ? stats_ : st_t_[size_t(t)].data();
    };
    auto chunk = [&](int n0, int t, bool first) {
      const int n1 = std::min(n, n0 + chunk_);
      if (first && t > 0 && stats > 0) std::fill(stats_of(t), stats_of(t) + stats, 0.0);
      const int64_t rows = int64_t{n1 - n0} * g.tiles();
      float* v = v_[size_t(t)].data();
      float* m = m_[size_t(t)].data();
      kernels_->input(g, mat_.bt.data(), x, n0, n1, v);
      WinogradGemm mm;  // M_p = V_p U_p
      mm.points = points_, mm.m = rows, mm.n = g.cout, mm.k = g.cin;
      mm.a = v, mm.a_point = g.cin, mm.a_row = vs_, mm.a_col = 1;
      mm.b = u_.data(), mm.b_point = int64_t{g.cin} * g.cout, mm.ldb = g.cout;
      mm.c = m, mm.c_point = g.cout, mm.ldc = ms_;
      kernels_->gemm(mm);
      kernels_->output(g, mat_.at.data(), m, bias, n0, n1, y, positions, stats_of(t));
    };
    auto add_up = [&] {
#pragma omp single
      for (size_t i = 0; i < stats; ++i)
        for (int t = 1; t < team; ++t) stats_[i] += st_t_[size_t(t)][i];
    };
    for_chunks(n, team, chunk, add_up);
  }

  void run_backward(const WinogradGeometry& g, int n, const float* x, const float* w,
                    const float* dy, const int32_t* positions, float* dx, float* dw, float* db,
                    bool accumulate) {
    ctx_.bind_threads();
    const int team = team_for(n);
    reserve(n, team);
    if (dx != nullptr) {
      transform_filter(w);
      transpose_filter();
    }
    if (cfg_.bias && !accumulate) std::fill(db, db + g.cout, 0.0f);
    const int64_t filters = points_ * g.cin * g.cout;
    // Thread 0 sums into du_ and db; the others into their own, added after (Note [Chunks
    // between threads]).
    auto du_of = [&](int t) { return t == 0 ? du_.data() : du_t_[size_t(t)].data(); };
    auto db_of = [&](int t) {
      return !cfg_.bias ? nullptr : t == 0 ? db : db_t_[size_t(t)].data();
    };
    auto chunk = [&](int n0, int t, bool first) {
      const int n1 = std::min(n, n0 + chunk_);
      const int64_t rows = int64_t{n1 - n0} * g.tiles();
      float* v = v_[size_t(t)].data();
      float* m = m_[size_t(t)].data();
      if (first && t > 0 && cfg_.bias) std::fill(db_of(t), db_of(t) + g.cout, 0.0f);
      // Note [Bias gradient in output_adjoint]
      kernels_->output_adjoint(g, mat_.at.data(), dy, positions, n0, n1, m, db_of(t));
      kernels_->input(g, mat_.bt.data(), x, n0, n1, v);
      WinogradGemm wg;  // dU_p += V_p^T dM_p
      wg.points = points_, wg.m = g.cin, wg.n = g.cout, wg.k = rows;
      wg.a = v, wg.a_point = g.cin, wg.a_row = 1, wg.a_col = vs_;
      wg.b = m, wg.b_point = g.cout, wg.ldb = ms_;
      wg.c = du_of(t), wg.c_point = int64_t{g.cin} * g.cout, wg.ldc = g.cout;
      wg.accumulate = !first;
      kernels_->gemm(wg);
      if (dx == nullptr) return;
      const size_t image = size_t(g.in_h) * g.in_w * g.cin;
      if (add_dx_) {  // Note [Input gradient added]: dx is read, and from memory; start now
        const char* p = reinterpret_cast<const char*>(dx + size_t(n0) * image);
        for (size_t b = 0; b < sizeof(float) * size_t(n1 - n0) * image; b += 64)
          __builtin_prefetch(p + b, 1, 2);
      }
      WinogradGemm dg;  // dV_p = dM_p U_p^T, over V, which backward-weights has consumed
      dg.points = points_, dg.m = rows, dg.n = g.cin, dg.k = g.cout;
      dg.a = m, dg.a_point = g.cout, dg.a_row = ms_, dg.a_col = 1;
      dg.b = ut_.data(), dg.b_point = int64_t{g.cin} * g.cout, dg.ldb = g.cin;
      dg.c = v, dg.c_point = g.cin, dg.ldc = vs_;
      kernels_->gemm(dg);
      // input_adjoint adds each tile into dx (tiles overlap): zero this chunk's images first,
      // while they are about to be read, not the whole batch up front (out of cache by then).
      if (!add_dx_)
        std::memset(dx + size_t(n0) * image, 0, sizeof(float) * size_t(n1 - n0) * image);
      kernels_->input_adjoint(g, mat_.bt.data(), v, n0, n1, dx);
    };
    // The other threads' sums, added in thread order: the same result for the same team.
    auto add_up = [&] {
#pragma omp for schedule(static)
      for (int64_t i = 0; i < filters; ++i) {
        float sum = du_[size_t(i)];
        for (int t = 1; t < team; ++t) sum += du_t_[size_t(t)][size_t(i)];
        du_[size_t(i)] = sum;
      }
#pragma omp single
      for (int c = 0; cfg_.bias && c < g.cout; ++c)
        for (int t = 1; t < team; ++t) db[c] += db_t_[size_t(t)][size_t(c)];
    };
    for_chunks(n, team, chunk, add_up);
    filter_gradient(dw, accumulate);
  }

  // Note [Chunks between threads]: with a team, each thread takes whole chunks of images, in
  // transformed buffers of its own, and the kernels run each chunk alone on it (Note [Alone in a
  // chunk] in team.hpp). Splitting every stage of every chunk between the threads instead, as the
  // kernels do for a lone chunk, costs a fork, a join and barriers per stage of every few images
  // (resnet20: about 4 500 a step): 2 threads ran resnet20 barely faster than one, with much of the
  // time in libgomp's waits. With chunks between the threads both models' 2-thread steps are
  // markedly shorter and the one-thread path is unchanged (model_bench --sgd 1 against the commit
  // before, alternated; docs/performance.md, "CPU engine"). The schedule is static, and the weight
  // and bias gradients are summed per thread and added in thread order, so a run is the same bit
  // for bit for the same thread count (the forward and the input gradient are those of one thread,
  // bit for bit: each image goes through the same loops in the same order).
  int team_for(int n) const {
    const int chunks = (n + chunk_ - 1) / chunk_;
    return std::max(1, std::min(omp_get_max_threads(), chunks));
  }

  // chunk(n0, thread, first of this thread's chunks) for every chunk; then, with a team,
  // after() on every thread of it (worksharing loops inside divide the team's work).
  template <class Chunk, class After>
  void for_chunks(int n, int team, const Chunk& chunk, const After& after) {
    const int chunks = (n + chunk_ - 1) / chunk_;
    if (team <= 1) {
      for (int c = 0; c < chunks; ++c) chunk(c * chunk_, 0, c == 0);
      return;
    }
#pragma omp parallel num_threads(team)
    {
      const int t = omp_get_thread_num();
      bool first = true;
      t_alone = true;  // Note [Alone in a chunk]
#pragma omp for schedule(static)
      for (int c = 0; c < chunks; ++c) {
        chunk(c * chunk_, t, first);
        first = false;
      }
      t_alone = false;
      after();
    }
  }

  void reserve(int n, int team) {
    const auto& g = geo_;
    const int64_t rows = int64_t{std::min(n, chunk_)} * g.tiles();
    const auto v_size = size_t(rows * vs_), m_size = size_t(rows * ms_);
    if (v_.size() < size_t(team)) {
      v_.resize(size_t(team));
      m_.resize(size_t(team));
    }
    for (int t = 0; t < team; ++t) {
      v_[size_t(t)].grow(v_size);
      m_[size_t(t)].grow(m_size);
    }
    const size_t filters = size_t(points_) * g.cin * g.cout;
    if (u_.size() < filters) {
      u_.resize(filters);
      ut_.resize(filters);
      du_.resize(filters);
    }
    if (du_t_.size() < size_t(team)) {  // Note [Chunks between threads]
      du_t_.resize(size_t(team));
      db_t_.resize(size_t(team));
      st_t_.resize(size_t(team));
    }
    for (int t = 1; t < team; ++t) {
      du_t_[size_t(t)].resize(filters);
      db_t_[size_t(t)].resize(size_t(g.cout));
      st_t_[size_t(t)].resize(2 * size_t(g.cout));
    }
  }

  // u[p][ci][co] = (G w[co][ci] Gt)[p], with co innermost so that the loops vectorise: w is
  // first transposed to [ci][k][l][co]. Backward usually sees the weights forward transformed
  // (the optimizer steps after it): a comparison with the copy kept then skips the work.
  void transform_filter(const float* w) {
    const size_t count = size_t(geo_.cout) * geo_.cin * geo_.r * geo_.r;
    if (!weights_changed(u_of_, w, count)) return;
    kernels_->filter(geo_, mat_.g.data(), w, u_.data());  // Note [Filter transforms in registers]
  }

  // ut[p][co][ci] = u[p][ci][co]: by 8 x 8 register transposes where AVX2 runs (cin and cout
  // are multiples of 8 here; Note [Relayout by transposes]); one float at a time it was a
  // measurable share of lenet's step.
  void transpose_filter() {
    const int cin = geo_.cin, cout = geo_.cout;
    for (int64_t p = 0; p < points_; ++p) {
      const float* src = u_.data() + p * cin * cout;
      float* dst = ut_.data() + p * cin * cout;
      if (avx2_) {
        transpose_avx2(src, cout, cin, cout, dst, cin);
        continue;
      }
      for (int ci = 0; ci < cin; ++ci)
        for (int co = 0; co < cout; ++co) dst[size_t(co) * cin + ci] = src[size_t(ci) * cout + co];
    }
  }

  // dw[co][ci] = Gt du[.][ci][co] G (the adjoint of transform_filter), stored or added.
  void filter_gradient(float* dw, bool accumulate) {
    kernels_->filter_adjoint(geo_, mat_.g.data(), du_.data(), dw, accumulate);
  }

  CpuContext ctx_;
  Conv2dConfig cfg_;
  WinogradMatrices mat_;
  const WinogradKernels* kernels_;
  const bool avx2_ = __builtin_cpu_supports("avx2");
  WinogradGeometry geo_;
  WinogradGeometry pooled_geo_;  // geo_ with the fused pooling, once fuse_max_pool said yes
  int64_t points_ = 0;
  int64_t vs_ = 0, ms_ = 0;  // floats per tile in v_ and m_ (winograd_tile_stride)
  int chunk_ = 1;            // images per chunk
  bool add_dx_ = false;      // Note [Input gradient added]
  // Grow-only buffers: transformed input (and dV), transformed output (and dM), filters and
  // their transpose, filter gradients, the transposed filter, and the filter transforms'
  // partial products.
  // One v and m per thread of a team (Note [Chunks between threads]); [0] also without one.
  std::vector<PageBuffer> v_, m_;  // Note [Page-aligned transformed buffers]
  std::vector<float> u_, ut_, du_;
  std::vector<std::vector<float>> du_t_, db_t_;  // threads 1.. of a team: their gradient sums
  std::vector<std::vector<double>> st_t_;        // ... and their batch statistics' sums
  double* stats_ = nullptr;  // Note [Batch statistics from the convolution]: null, or 2 x cout
  std::vector<float> u_of_;  // the weights u_ was transformed from
};

}  // namespace

std::unique_ptr<FusableConv> make_winograd_conv2d(const CpuContext& ctx, const Conv2dConfig& cfg,
                                                  int tile) {
  return std::make_unique<WinogradConv2d>(ctx, cfg, tile);
}

}  // namespace ddpv::cpu
