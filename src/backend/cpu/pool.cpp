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
#include "backend/cpu/team.hpp"

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
  dnnl::pooling_forward::primitive_desc fwd_pd;
  dnnl::pooling_backward::primitive_desc bwd_pd;
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

// Note [Own max pooling]: oneDNN 2.6's max-pooling primitive, in NHWC and in nChw8c, took
// over twenty times a memcpy of its input for lenet's first pooling (64x28x28x32, 2x2 stride
// 2), a large share of the whole lenet step, where a plain loop costs about a memcpy. So max
// pooling is our own loops. Each output takes the first largest value of its window in
// row-major order, and a NaN wins (the last NaN), as in PyTorch; the window position is kept
// for backward, which adds dy there. Both layouts look alike to the loops: `outer` images of
// `inner` contiguous channels (NHWC: N of C; blocked: N * C / b of b).
//
// Windows that tile the input (kernel = stride 2 or 3, no padding: every pooling of lenet,
// VGG and AlexNet-style models) have loops of their own: forward reads each window once and
// stores each output once, and backward writes every dx element exactly once (dy or 0), so it
// needs neither a zeroing pass nor a division per element to find the position. They are
// compiled for AVX2 and for the baseline, picked at run time.
//
// Note [ReLU folded into max pooling]: when the pooling's input is a ReLU's output, the
// ReLU's backward (dx = dy where its output is positive, else 0) can be applied by the
// pooling's backward: a window whose maximum is positive sends dy to that maximum, which is a
// positive ReLU output, so the ReLU passes it; a window whose maximum is not positive holds
// only zeros (or NaN), where the ReLU passes nothing. So forward records position -1 for such
// a window and backward sends nothing from it. In lenet this removes a read-modify-write pass
// over each convolution's output from every step.
struct PoolRow {
  int64_t w, c;  // input row width, contiguous channels
  int ow;        // outputs in the row
  bool relu;     // record -1 where the maximum is not positive
};

template <int K>
[[gnu::always_inline]] inline void tiled_forward_row(const PoolRow& r, const float* in, float* out,
                                                     int32_t* where) {
  for (int xo = 0; xo < r.ow; ++xo) {
    const float* win = in + int64_t{xo} * K * r.c;
    float* o = out + xo * r.c;
    int32_t* wh = where + xo * r.c;
#pragma omp simd
    for (int64_t j = 0; j < r.c; ++j) {
      float m = win[j];
      int32_t at = 0;
#pragma GCC unroll 9
      for (int q = 1; q < K * K; ++q) {
        const float v = win[(q / K * r.w + q % K) * r.c + j];
        const bool take = v > m || v != v;  // NaN wins, as in PyTorch
        m = take ? v : m;
        at = take ? q : at;
      }
      o[j] = m;
      wh[j] = r.relu && !(m > 0.0f) ? -1 : at;
    }
  }
}

// Rows yo * K .. yo * K + K - 1 of dx, columns [0, ow * K); the caller zeroes the rest.
template <int K>
[[gnu::always_inline]] inline void tiled_backward_row(const PoolRow& r, const float* dy,
                                                      const int32_t* where, float* dx) {
  for (int xo = 0; xo < r.ow; ++xo) {
    const float* g = dy + xo * r.c;
    const int32_t* wh = where + xo * r.c;
    float* win = dx + int64_t{xo} * K * r.c;
#pragma omp simd
    for (int64_t j = 0; j < r.c; ++j) {
      const float v = g[j];
      const int32_t at = wh[j];
#pragma GCC unroll 9
      for (int q = 0; q < K * K; ++q) win[(q / K * r.w + q % K) * r.c + j] = at == q ? v : 0.0f;
    }
  }
}

// clang-format off
#define DDPV_TILED_POOL_LOOPS(suffix, attributes)                                                \
  attributes void tiled_forward_##suffix(const PoolRow& r, int k, const float* in, float* out, \
                                         int32_t* where) {                                     \
    if (k == 2) tiled_forward_row<2>(r, in, out, where);                                       \
    else tiled_forward_row<3>(r, in, out, where);                                              \
  }                                                                                            \
  attributes void tiled_backward_##suffix(const PoolRow& r, int k, const float* dy,            \
                                          const int32_t* where, float* dx) {                   \
    if (k == 2) tiled_backward_row<2>(r, dy, where, dx);                                       \
    else tiled_backward_row<3>(r, dy, where, dx);                                              \
  }

DDPV_TILED_POOL_LOOPS(avx2, __attribute__((target("avx2"))))
DDPV_TILED_POOL_LOOPS(baseline, )
// clang-format on

const bool kAvx2 = __builtin_cpu_supports("avx2");

class CpuMaxPool2d final : public FusablePool {
 public:
  CpuMaxPool2d(const CpuContext& ctx, const Pool2dConfig& cfg)
      : ctx_(ctx),
        cfg_(cfg),
        inner_(cfg.block > 0 ? cfg.block : cfg.channels),
        tiled_(cfg.kernel == cfg.stride && cfg.padding == 0 &&
               (cfg.kernel == 2 || cfg.kernel == 3)) {
    check_config(cfg);
    DDPV_CHECK(cfg.block == 0 || cfg.channels % cfg.block == 0, "max_pool2d: ", cfg.channels,
               " channels do not fill blocks of ", cfg.block);
  }

  bool fold_relu_backward() override { return relu_ = true; }

  int32_t* positions_for(int n) override {
    if (!tiled_ || !relu_) return nullptr;
    return record(n);
  }

  void forward_f32(int n, const float* x, float* y) override {
    record(n);
    ctx_.bind_threads();
    const int64_t outer = int64_t{n} * cfg_.channels / inner_;
    if (tiled_) {
      forward_tiled(outer, x, y);
    } else {
      forward_any(outer, x, y);
    }
  }

  void backward_f32(int n, const float* dy, float* dx) override {
    check_batch("max_pool2d", n);
    DDPV_CHECK(n == last_n_, "max_pool2d backward: batch size ", n,
               " differs from the last forward (", last_n_,
               "); backward needs where that forward's maxima came from");
    ctx_.bind_threads();
    const int64_t outer = int64_t{n} * cfg_.channels / inner_;
    if (tiled_) {
      backward_tiled(outer, dy, dx);
    } else {
      backward_any(outer, dy, dx);
    }
  }

 private:
  // The window-position record of a forward of n images, which backward then reads.
  int32_t* record(int n) {
    check_batch("max_pool2d", n);
    arg_.resize(static_cast<size_t>(int64_t{n} * cfg_.channels * cfg_.out_h() * cfg_.out_w()));
    last_n_ = n;
    return arg_.data();
  }

  void forward_tiled(int64_t outer, const float* x, float* y) {
    const int h = cfg_.in_h, w = cfg_.in_w, oh = cfg_.out_h(), ow = cfg_.out_w(), k = cfg_.kernel;
    const int64_t c = inner_;
    const PoolRow r{w, c, ow, relu_};
    int32_t* arg = arg_.data();
    const auto row = kAvx2 ? tiled_forward_avx2 : tiled_forward_baseline;
    in_team(outer * oh * ow * c >= kParallelMin, [&] {  // Note [No team of one]
#pragma omp for collapse(2)
      for (int64_t b = 0; b < outer; ++b) {
        for (int yo = 0; yo < oh; ++yo) {
          const int64_t o = (b * oh + yo) * ow * c;
          row(r, k, x + (b * h + int64_t{yo} * k) * w * c, y + o, arg + o);
        }
      }
    });
  }

  void backward_tiled(int64_t outer, const float* dy, float* dx) const {
    const int h = cfg_.in_h, w = cfg_.in_w, oh = cfg_.out_h(), ow = cfg_.out_w(), k = cfg_.kernel;
    const int64_t c = inner_;
    const PoolRow r{w, c, ow, relu_};
    const int32_t* arg = arg_.data();
    const auto row = kAvx2 ? tiled_backward_avx2 : tiled_backward_baseline;
    in_team(outer * h * w * c >= kParallelMin, [&] {  // Note [No team of one]
#pragma omp for
      for (int64_t b = 0; b < outer; ++b) {
        float* img = dx + b * h * w * c;
        for (int yo = 0; yo < oh; ++yo) {
          const int64_t o = (b * oh + yo) * ow * c;
          float* rows = img + int64_t{yo} * k * w * c;
          row(r, k, dy + o, arg + o, rows);
          if (ow * k < w) {  // columns no window covers
            for (int kh = 0; kh < k; ++kh)
              std::fill(rows + (kh * w + int64_t{ow} * k) * c, rows + (kh + 1) * w * c, 0.0f);
          }
        }
        std::fill(img + int64_t{oh} * k * w * c, img + h * w * c, 0.0f);  // rows none covers
      }
    });
  }

  void forward_any(int64_t outer, const float* x, float* y) {
    const int h = cfg_.in_h, w = cfg_.in_w, oh = cfg_.out_h(), ow = cfg_.out_w();
    const int k = cfg_.kernel, s = cfg_.stride, p = cfg_.padding;
    const int64_t c = inner_;
    int32_t* arg = arg_.data();
    const bool relu = relu_;
    constexpr float kLowest = -std::numeric_limits<float>::infinity();
    // Row by row: start every output of the row at -inf with the window's first valid
    // position, then sweep the window positions over the whole row (vectorisable runs).
    in_team(outer * oh * ow * c >= kParallelMin, [&] {  // Note [No team of one]
#pragma omp for collapse(2)
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
          if (relu) {
#pragma omp simd
            for (int64_t j = 0; j < ow * c; ++j) where[j] = out[j] > 0.0f ? where[j] : -1;
          }
        }
      }
    });
  }

  void backward_any(int64_t outer, const float* dy, float* dx) const {
    const int h = cfg_.in_h, w = cfg_.in_w, oh = cfg_.out_h(), ow = cfg_.out_w();
    const int k = cfg_.kernel, s = cfg_.stride, p = cfg_.padding;
    const int64_t c = inner_;
    const int32_t* arg = arg_.data();
    // One image per thread: windows may overlap (stride < kernel), images never do.
    in_team(outer * h * w * c >= kParallelMin, [&] {  // Note [No team of one]
#pragma omp for
      for (int64_t b = 0; b < outer; ++b) {
        float* img = dx + b * h * w * c;
        std::fill(img, img + h * w * c, 0.0f);
        for (int yo = 0; yo < oh; ++yo) {
          for (int xo = 0; xo < ow; ++xo) {
            const int64_t o = ((b * oh + yo) * ow + xo) * c;
            for (int64_t j = 0; j < c; ++j) {
              const int32_t at = arg[o + j];
              if (at < 0) continue;  // Note [ReLU folded into max pooling]
              const int yi = yo * s - p + at / k, xi = xo * s - p + at % k;
              img[(int64_t{yi} * w + xi) * c + j] += dy[o + j];
            }
          }
        }
      }
    });
  }

  CpuContext ctx_;
  Pool2dConfig cfg_;
  int64_t inner_;      // contiguous channels per spatial position
  bool tiled_;         // windows tile the input: kernel = stride in {2, 3}, no padding
  bool relu_ = false;  // Note [ReLU folded into max pooling]
  int last_n_ = 0;
  std::vector<int32_t> arg_;  // the last forward's window positions (-1: no gradient)
};

class CpuPool2d final : public FusablePool {
 public:
  CpuPool2d(const CpuContext& ctx, const Pool2dConfig& cfg, Dt act = Dt::f32)
      : ctx_(ctx),
        cfg_(cfg),
        act_(act),
        f32_backward_(act == Dt::bf16 && cfg.kind != PoolKind::kGlobalAvg &&
                      cfg.kernel > cfg.stride) {
    check_config(cfg);
  }

  void forward_f32(int n, const float* x, float* y) override {
    check_f32();
    run_forward(n, x, y);
  }
  void backward_f32(int n, const float* dy, float* dx) override {
    check_f32();
    run_backward(n, dy, dx);
  }

  // The two directions on activations of the op's dtype (f32 floats or bf16 bits).
  void run_forward(int n, const void* x, void* y) {
    check_batch(kind_name(cfg_.kind), n);
    ctx_.bind_threads();
    PoolPlan& p = plans_.get(n, kind_name(cfg_.kind), this, &CpuPool2d::build);
    DDPV_DNNL_CHECK(kind_name(cfg_.kind), {
      bind(p.x, x);
      bind(p.y, y);
      p.fwd.execute(ctx_.stream, p.fwd_args);
    });
    last_n_ = n;
  }

  void run_backward(int n, const void* dy, void* dx) {
    check_batch(kind_name(cfg_.kind), n);
    DDPV_CHECK(cfg_.kind != PoolKind::kMax || n == last_n_, kind_name(cfg_.kind),
               " backward: batch size ", n, " differs from the last forward (", last_n_,
               "); backward needs where that forward's maxima came from");
    ctx_.bind_threads();
    PoolPlan& p = plans_.get(n, kind_name(cfg_.kind), this, &CpuPool2d::build);
    DDPV_DNNL_CHECK(kind_name(cfg_.kind), {
      bind(p.dy, dy);
      bind(p.dx, dx);
      p.bwd.execute(ctx_.stream, p.bwd_args);
    });
  }

  // Note [Overlapping windows in bf16]: whether backward takes and gives f32.
  bool f32_backward() const { return f32_backward_; }

  // Note [bf16 on oneDNN]: whether oneDNN builds the primitives for n images (on a kernel
  // other than its reference one unless any_kernel). Not called on the hot path.
  bool try_plan(int n, bool any_kernel) {
    const PoolPlan* p = plans_.try_get(n, this, &CpuPool2d::build);
    return p != nullptr && (any_kernel || !(is_reference(p->fwd_pd) || is_reference(p->bwd_pd)));
  }

 private:
  void check_f32() const {
    DDPV_CHECK(act_ == Dt::f32, kind_name(cfg_.kind),
               ": f32 activations handed to a bf16 op (internal)");
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
    const auto x_md = activation_desc({n, c.channels, c.in_h, c.in_w}, c.block, act_);
    const auto y_md = activation_desc({n, c.channels, c.out_h(), c.out_w()}, c.block, act_);
    const auto attr = user_scratchpad_attr();
    using Fwd = dnnl::pooling_forward;
    using Bwd = dnnl::pooling_backward;
    const Fwd::primitive_desc fwd_pd(
        Fwd::desc(dnnl::prop_kind::forward_training, alg, x_md, y_md, strides, kernel, pad, pad),
        attr, eng);
    // Note [Overlapping windows in bf16]
    const auto dx_md = f32_backward_ ? activation_desc(x_md.dims(), c.block, Dt::f32) : x_md;
    const auto dy_md = f32_backward_ ? activation_desc(y_md.dims(), c.block, Dt::f32) : y_md;
    const Bwd::primitive_desc bwd_pd(Bwd::desc(alg, dx_md, dy_md, strides, kernel, pad, pad), attr,
                                     eng, fwd_pd);
    p.fwd = Fwd(fwd_pd);
    p.bwd = Bwd(bwd_pd);
    p.fwd_pd = fwd_pd;
    p.bwd_pd = bwd_pd;
    p.scratch.require(fwd_pd);
    p.scratch.require(bwd_pd);
    p.scratch.allocate(eng);
    p.x = user_memory(x_md, eng);
    p.y = user_memory(y_md, eng);
    p.dy = user_memory(dy_md, eng);
    p.dx = user_memory(dx_md, eng);
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
  Dt act_;  // the activations' dtype
  bool f32_backward_;  // Note [Overlapping windows in bf16]: dy and dx are f32
  int last_n_ = 0;
  PlansByBatch<PoolPlan> plans_;
};

// Note [bf16 on oneDNN]: every pooling of bf16 activations on oneDNN, max pooling too (our
// own max loops are f32).
//
// Note [Overlapping windows in bf16]: where windows overlap (kernel > stride: resnet50's 3x3
// stride 2 stem pooling), an input's gradient is the sum of several windows' shares. oneDNN's
// bf16 backward adds them in bf16, rounding after every addition, which is up to one bf16 step
// off the once-rounded sum. Its f32 backward takes the bf16 forward's workspace, so there dy is
// widened into staging, the f32 backward sums, and dx is rounded once: the price is one f32 pass
// over dx on the few layers that have it. Windows that do not overlap give each input one share
// and keep the bf16 backward.
class OneDnnBf16Pool2d final : public Pool2dOp {
 public:
  OneDnnBf16Pool2d(std::unique_ptr<CpuPool2d> op, const Pool2dConfig& c, Bf16Staging& s)
      : op_(std::move(op)),
        in_(int64_t{c.in_h} * c.in_w * c.channels),
        out_(int64_t{c.out_h()} * c.out_w() * c.channels),
        st_(s) {}
  void forward(int n, ConstAct x, MutAct y) override { op_->run_forward(n, x.bf16(), y.bf16()); }
  void backward(int n, ConstAct dy, MutAct dx) override {
    if (!op_->f32_backward()) return op_->run_backward(n, dy.bf16(), dx.bf16());
    st_.bind_threads();
    const float* dy32 = st_.in(0, dy, n * out_);
    op_->run_backward(n, dy32, st_.out(1, dx, n * in_));
    st_.finish(1, dx, n * in_);
  }

 private:
  std::unique_ptr<CpuPool2d> op_;
  int64_t in_, out_;  // input and output elements per image
  Bf16Staging& st_;
};

}  // namespace

std::unique_ptr<FusablePool> make_pool2d(const CpuContext& ctx, const Pool2dConfig& cfg) {
  if (cfg.kind == PoolKind::kMax) return std::make_unique<CpuMaxPool2d>(ctx, cfg);
  return std::make_unique<CpuPool2d>(ctx, cfg);
}

std::unique_ptr<Pool2dOp> make_onednn_bf16_pool2d(const CpuContext& ctx, const Pool2dConfig& cfg,
                                                  bool any_kernel, Bf16Staging& staging) {
  auto op = std::make_unique<CpuPool2d>(ctx, cfg, Dt::bf16);
  if (!op->try_plan(2, any_kernel)) return nullptr;
  return std::make_unique<OneDnnBf16Pool2d>(std::move(op), cfg, staging);
}

}  // namespace ddpv::cpu
