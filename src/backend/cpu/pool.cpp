// Pool2dOp on oneDNN: max pooling (with a workspace for backward), average pooling counting the
// padding as PyTorch's default does, and global average pooling; forward and backward, NHWC or
// channel-blocked (Note [Blocked activations]).
#include <memory>
#include <unordered_map>

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
  return std::make_unique<CpuPool2d>(ctx, cfg);
}

}  // namespace ddpv::cpu
