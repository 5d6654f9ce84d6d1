// Pool2dOp: max pooling on our own loops (Note [Own max pooling]); average pooling counting the
// padding as PyTorch's default does, and global average pooling, on oneDNN; forward and
// backward, NHWC or channel-blocked (Note [Blocked activations]).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <unordered_map>
#include <vector>

#include "backend/cpu/cpu_ops.hpp"

namespace ddpv::cpu {
namespace {

const char* kind_name(PoolKind k) {
  switch (k) {
    case PoolKind::kMax:
      return "max_pool2d";
    case PoolKind::kAvg:
      return "avg_pool2d";
    case PoolKind::kGlobalAvg:
      return "global_avg_pool2d";
  }
  return "pool2d";
}

// Everything built for one batch size.
struct PoolPlan {
  dnnl::pooling_forward fwd;
  dnnl::pooling_backward bwd;
  Mem x, y, dy, dx;  // caller memory, bound per call
  Mem workspace;     // max pooling: where each maximum came from
  Scratchpad scratch;
  std::unordered_map<int, Mem> fwd_args, bwd_args;
};

void check_config(const Pool2dConfig& c) {
  const char* name = kind_name(c.kind);
  DDPV_CHECK(c.channels > 0 && c.in_h > 0 && c.in_w > 0, name,
             ": channels and input size must be positive, got channels=", c.channels, " input ",
             c.in_h, "x", c.in_w);
  if (c.kind == PoolKind::kGlobalAvg) return;
  DDPV_CHECK(c.kernel > 0 && c.stride > 0 && c.padding >= 0, name,
             ": kernel and stride must be positive and padding non-negative, got kernel=", c.kernel,
             " stride=", c.stride, " padding=", c.padding);
  DDPV_CHECK(2 * c.padding <= c.kernel, name, ": padding ", c.padding,
             " must be at most half the kernel ", c.kernel, " (as in PyTorch)");
  DDPV_CHECK(c.in_h + 2 * c.padding >= c.kernel && c.in_w + 2 * c.padding >= c.kernel, name,
             ": kernel ", c.kernel, " does not fit the input ", c.in_h, "x", c.in_w,
             " with padding ", c.padding, " (output size would be <= 0)");
}

// Note [Own max pooling]: oneDNN 2.6's max-pooling primitive took 6.7 ms (NHWC) and 5.6 ms
// (nChw8c) for lenet's first pooling (64x28x28x32, 2x2 stride 2) on an AVX2 machine: 24x a
// memcpy of its input, a fifth of the whole lenet step; a plain loop takes 0.22 ms. So max
// pooling is our own loops. Each output takes the first largest value of its window in
// row-major order, and a NaN wins, as in PyTorch; the window position is kept for
// backward, which adds dy there. Both layouts look alike to the loops: `outer` images of
// `inner` contiguous channels (NHWC: N of C; blocked: N * C / b of b).
class CpuMaxPool2d final : public Pool2dOp {
 public:
  static constexpr int64_t kParallelMin = 1 << 16;  // elements below which one thread runs

  CpuMaxPool2d(const CpuContext& ctx, const Pool2dConfig& cfg)
      : ctx_(ctx), cfg_(cfg), inner_(cfg.block > 0 ? cfg.block : cfg.channels) {
    check_config(cfg);
    DDPV_CHECK(cfg.block == 0 || cfg.channels % cfg.block == 0, "max_pool2d: ", cfg.channels,
               " channels do not fill blocks of ", cfg.block);
  }

  void forward(int n, const float* x, float* y) override {
    check_batch("max_pool2d", n);
    ctx_.bind_threads();
    const int h = cfg_.in_h, w = cfg_.in_w, oh = cfg_.out_h(), ow = cfg_.out_w();
    const int k = cfg_.kernel, s = cfg_.stride, p = cfg_.padding;
    const int64_t c = inner_, outer = int64_t{n} * cfg_.channels / inner_;
    arg_.resize(static_cast<size_t>(outer * oh * ow * c));
    int32_t* arg = arg_.data();
    constexpr float kLowest = -std::numeric_limits<float>::infinity();
    // Row by row: start every output of the row at -inf with the window's first valid
    // position, then sweep the window positions over the whole row (vectorisable runs).
#pragma omp parallel for collapse(2) if (outer * oh * ow * c >= kParallelMin)
    for (int64_t b = 0; b < outer; ++b) {
      for (int yo = 0; yo < oh; ++yo) {
        float* out = y + (b * oh + yo) * ow * c;
        int32_t* where = arg + (b * oh + yo) * ow * c;
        const int kh0 = std::max(0, p - yo * s);
        for (int xo = 0; xo < ow; ++xo) {
          const int32_t first = kh0 * k + std::max(0, p - xo * s);
          std::fill(out + xo * c, out + (xo + 1) * c, kLowest);
          std::fill(where + xo * c, where + (xo + 1) * c, first);
        }
        for (int kh = 0; kh < k; ++kh) {
          const int yi = yo * s - p + kh;
          if (yi < 0 || yi >= h) continue;
          const float* in_row = x + (b * h + yi) * w * c;
          for (int kw = 0; kw < k; ++kw) {
            const int32_t pos = kh * k + kw;
            // Outputs whose window column kw lies inside the image: xo * s - p + kw in [0, w).
            // (C++ division truncates toward zero: the clamp at 0 makes lo right, and hi needs
            // its numerator checked first.)
            const int lo = std::max(0, (p - kw + s - 1) / s);
            const int last = w - 1 + p - kw;  // the largest xo * s
            const int hi = last < 0 ? 0 : std::min(ow, last / s + 1);
            for (int xo = lo; xo < hi; ++xo) {
              const float* in = in_row + int64_t{xo * s - p + kw} * c;
              float* o = out + xo * c;
              int32_t* wh = where + xo * c;
#pragma omp simd
              for (int64_t j = 0; j < c; ++j) {
                const float v = in[j];
                const bool take = v > o[j] || v != v;  // NaN wins, as in PyTorch
                o[j] = take ? v : o[j];
                wh[j] = take ? pos : wh[j];
              }
            }
          }
        }
      }
    }
    last_n_ = n;
  }

  void backward(int n, const float* dy, float* dx) override {
    check_batch("max_pool2d", n);
    DDPV_CHECK(n == last_n_, "max_pool2d backward: batch size ", n,
               " differs from the last forward (", last_n_,
               "); backward needs where that forward's maxima came from");
    ctx_.bind_threads();
    const int h = cfg_.in_h, w = cfg_.in_w, oh = cfg_.out_h(), ow = cfg_.out_w();
    const int k = cfg_.kernel, s = cfg_.stride, p = cfg_.padding;
    const int64_t c = inner_, outer = int64_t{n} * cfg_.channels / inner_;
    const int32_t* arg = arg_.data();
    // One image per thread: windows may overlap (stride < kernel), images never do.
#pragma omp parallel for if (outer * h * w * c >= kParallelMin)
    for (int64_t b = 0; b < outer; ++b) {
      float* img = dx + b * h * w * c;
      std::fill(img, img + h * w * c, 0.0f);
      for (int yo = 0; yo < oh; ++yo) {
        for (int xo = 0; xo < ow; ++xo) {
          const int64_t o = ((b * oh + yo) * ow + xo) * c;
          for (int64_t j = 0; j < c; ++j) {
            const int yi = yo * s - p + arg[o + j] / k, xi = xo * s - p + arg[o + j] % k;
            img[(int64_t{yi} * w + xi) * c + j] += dy[o + j];
          }
        }
      }
    }
  }

 private:
  CpuContext ctx_;
  Pool2dConfig cfg_;
  int64_t inner_;               // contiguous channels per spatial position
  int last_n_ = 0;
  std::vector<int32_t> arg_;    // the last forward's window positions
};

class CpuPool2d final : public Pool2dOp {
 public:
  CpuPool2d(const CpuContext& ctx, const Pool2dConfig& cfg) : ctx_(ctx), cfg_(cfg) {
    check_config(cfg);
  }

  void forward(int n, const float* x, float* y) override {
    check_batch(kind_name(cfg_.kind), n);
    ctx_.bind_threads();
    PoolPlan& p = plan(n);
    DDPV_DNNL_CHECK(kind_name(cfg_.kind), {
      bind(p.x, x);
      bind(p.y, y);
      p.fwd.execute(ctx_.stream, p.fwd_args);
    });
    last_n_ = n;
  }

  void backward(int n, const float* dy, float* dx) override {
    check_batch(kind_name(cfg_.kind), n);
    DDPV_CHECK(cfg_.kind != PoolKind::kMax || n == last_n_, kind_name(cfg_.kind),
               " backward: batch size ", n, " differs from the last forward (", last_n_,
               "); backward needs where that forward's maxima came from");
    ctx_.bind_threads();
    PoolPlan& p = plan(n);
    DDPV_DNNL_CHECK(kind_name(cfg_.kind), {
      bind(p.dy, dy);
      bind(p.dx, dx);
      p.bwd.execute(ctx_.stream, p.bwd_args);
    });
  }

 private:
  PoolPlan& plan(int n) {
    auto it = plans_.find(n);
    if (it != plans_.end()) return *it->second;
    auto p = std::make_unique<PoolPlan>();
    DDPV_DNNL_CHECK(std::string(kind_name(cfg_.kind)) +
                        ": building the primitives for batch size " + std::to_string(n),
                    build(n, *p));
    return *plans_.emplace(n, std::move(p)).first->second;
  }

  void build(int n, PoolPlan& p) const {
    const auto& c = cfg_;
    const dnnl::engine& eng = ctx_.engine;
    const bool global = c.kind == PoolKind::kGlobalAvg;
    const Mem::dims kernel = global ? Mem::dims{c.in_h, c.in_w} : Mem::dims{c.kernel, c.kernel};
    const Mem::dims strides = global ? Mem::dims{1, 1} : Mem::dims{c.stride, c.stride};
    const Mem::dims pad = global ? Mem::dims{0, 0} : Mem::dims{c.padding, c.padding};
    const dnnl::algorithm alg = c.kind == PoolKind::kMax ? dnnl::algorithm::pooling_max
                                : global ? dnnl::algorithm::pooling_avg_exclude_padding
                                         : dnnl::algorithm::pooling_avg_include_padding;
    const auto x_md = activation_desc({n, c.channels, c.in_h, c.in_w}, c.block);
    const auto y_md = activation_desc({n, c.channels, c.out_h(), c.out_w()}, c.block);
    const auto attr = user_scratchpad_attr();
    using Fwd = dnnl::pooling_forward;
    using Bwd = dnnl::pooling_backward;
    const Fwd::primitive_desc fwd_pd(
        Fwd::desc(dnnl::prop_kind::forward_training, alg, x_md, y_md, strides, kernel, pad, pad),
        attr, eng);
    const Bwd::primitive_desc bwd_pd(Bwd::desc(alg, x_md, y_md, strides, kernel, pad, pad), attr,
                                     eng, fwd_pd);
    p.fwd = Fwd(fwd_pd);
    p.bwd = Bwd(bwd_pd);
    p.scratch.require(fwd_pd);
    p.scratch.require(bwd_pd);
    p.scratch.allocate(eng);
    p.x = user_memory(x_md, eng);
    p.y = user_memory(y_md, eng);
    p.dy = user_memory(y_md, eng);
    p.dx = user_memory(x_md, eng);
    p.fwd_args = {{DNNL_ARG_SRC, p.x},
                  {DNNL_ARG_DST, p.y},
                  {DNNL_ARG_SCRATCHPAD, p.scratch.view(fwd_pd, eng)}};
    p.bwd_args = {{DNNL_ARG_DIFF_DST, p.dy},
                  {DNNL_ARG_DIFF_SRC, p.dx},
                  {DNNL_ARG_SCRATCHPAD, p.scratch.view(bwd_pd, eng)}};
    if (fwd_pd.workspace_desc().get_size() > 0) {
      p.workspace = Mem(fwd_pd.workspace_desc(), eng);
      p.fwd_args.emplace(DNNL_ARG_WORKSPACE, p.workspace);
      p.bwd_args.emplace(DNNL_ARG_WORKSPACE, p.workspace);
    }
  }

  CpuContext ctx_;
  Pool2dConfig cfg_;
  int last_n_ = 0;
  std::unordered_map<int, std::unique_ptr<PoolPlan>> plans_;  // by batch size
};

}  // namespace

std::unique_ptr<Pool2dOp> make_pool2d(const CpuContext& ctx, const Pool2dConfig& cfg) {
  if (cfg.kind == PoolKind::kMax) return std::make_unique<CpuMaxPool2d>(ctx, cfg);
  return std::make_unique<CpuPool2d>(ctx, cfg);
}

}  // namespace ddpv::cpu
