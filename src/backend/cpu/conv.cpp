// Conv2dOp on oneDNN: convolution forward, backward-data and backward-weights side by side.
// Activations NHWC or channel-blocked as the caller keeps them (Note [Blocked activations]);
// weights OIHW in the caller's arena, reordered into the layout each primitive prefers (see
// Note [Conv weight layouts]).
#include <memory>
#include <optional>

#include "backend/cpu/cpu_ops.hpp"
#include "backend/cpu/kernels/winograd/winograd.hpp"

namespace ddpv::cpu {
namespace {

// Note [Conv weight layouts]: the weights live in the flat parameter arena in PyTorch's OIHW
// layout, while oneDNN's fast kernels want a blocked layout of their choosing (format_tag::any).
// Weights change every step, so the forward and backward-data primitives reorder the arena's
// weights into their layout on every call (cheap: weights are small next to activations), and
// backward-weights computes into a scratch of its layout that is reordered back into the arena,
// with a sum post-op when gradients accumulate.

// Note [Mixed activation layouts]: oneDNN's AVX2 kernels take NHWC -> NHWC or blocked ->
// blocked, but a convolution from NHWC to blocked (the RGB stem, whose 3 channels cannot be
// blocked, feeding 16 blocked ones) runs on the reference kernel, many times slower. Such a
// convolution computes NHWC -> NHWC and reorders its blocked side: one pass over one
// activation per direction, for the one or two layers of a network where it happens.
//
// Note [First convolution from NCHW]: oneDNN's jit kernels have one mixed pair of their own,
// the classic first layer: a planar NCHW source of few channels into blocked outputs, forward
// and backward-weights. The stem's images arrive NHWC; reordered to NCHW (3 channels: a sixth
// of the output's floats) they feed that pair, which writes the blocked output and reads the
// blocked gradient as they are, so neither 16-channel activation is reordered. oneDNN 2.6,
// resnet20's stem in a harness alternating the two: on AVX-512 the planar forward is faster
// than brgconv on NHWC plus the output's reorder, and backward-weights costs what the NHWC
// kernel does without dy's reorder; on AVX2 (ONEDNN_MAX_CPU_ISA) the pair is about even with
// NHWC before the reorders, ahead after them. In resnet20's step (ddpv-train --synthetic
// --profile-layers, alternated with the build before) the stem's forward took about half as
// long, its backward the same, and the two 4 MiB NHWC copies are gone (a smaller max RSS).
// The ImageNet stem (3 -> 64, 7x7 stride 2 on 224x224) gains too: the reorders it saves cost
// more than its slower forward (docs/performance.md, "CPU engine"). Where the pair is not
// there (a reference kernel would run) the convolution stays NHWC -> NHWC as above.
// Backward-data, which a first layer never runs and which has no planar kernel, stays NHWC ->
// NHWC with its own reorder of dy.

// Everything built for one batch size.
struct ConvPlan : WeightedPlan<dnnl::convolution_forward, dnnl::convolution_backward_data,
                               dnnl::convolution_backward_weights> {
  // Note [First convolution from NCHW]: backward-data's own dy where its layout is not dy's,
  // built on its first use (a first layer never has one).
  bool dy_data_own = false;
  Mem::desc dy_data_md;
  std::optional<Relayout> dy_data;
};

void check_config(const Conv2dConfig& c) {
  DDPV_CHECK(c.in_channels > 0 && c.out_channels > 0 && c.in_h > 0 && c.in_w > 0 && c.kernel > 0 &&
                 c.stride > 0 && c.padding >= 0,
             "conv2d: channels, input size, kernel and stride must be positive and padding "
             "non-negative; got in_channels=",
             c.in_channels, " out_channels=", c.out_channels, " input ", c.in_h, "x", c.in_w,
             " kernel=", c.kernel, " stride=", c.stride, " padding=", c.padding);
  DDPV_CHECK(c.in_h + 2 * c.padding >= c.kernel && c.in_w + 2 * c.padding >= c.kernel,
             "conv2d: kernel ", c.kernel, " does not fit the input ", c.in_h, "x", c.in_w,
             " with padding ", c.padding,
             " (output size would be <= 0); use a smaller kernel "
             "or more padding");
}

// On f32 activations, or (Note [bf16 on oneDNN]) on bf16 ones through Bf16Conv2dPrimitives.
class CpuConv2d final : public FusableConv {
 public:
  CpuConv2d(const CpuContext& ctx, const Conv2dConfig& cfg, Dt act = Dt::f32)
      : ctx_(ctx), cfg_(cfg), act_(act) {
    check_config(cfg);
  }

  void forward_f32(int n, const float* x, const float* w, const float* b, float* y) override {
    DDPV_CHECK(act_ == Dt::f32, "conv2d: f32 activations handed to a bf16 op (internal)");
    run_forward(n, x, w, b, y);
  }
  void backward_f32(int n, const float* x, const float* w, const float* dy, float* dx, float* dw,
                    float* db, bool accumulate) override {
    DDPV_CHECK(act_ == Dt::f32, "conv2d: f32 activations handed to a bf16 op (internal)");
    run_backward(n, x, w, dy, dx, dw, db, accumulate);
  }

  // The two directions on activations of the op's dtype (f32 floats or bf16 bits); weights,
  // bias and their gradients f32 always.
  void run_forward(int n, const void* x, const float* w, const float* b, void* y) {
    check_conv_forward(cfg_, n, b);
    ctx_.bind_threads();
    ConvPlan& p = plans_.get(n, "conv2d", this, &CpuConv2d::build);
    last_n_ = n;
    DDPV_DNNL_CHECK("conv2d forward", p.forward(ctx_, x, w, cfg_.bias ? b : nullptr, y));
  }

  void run_backward(int n, const void* x, const float* w, const void* dy, void* dx, float* dw,
                    float* db, bool accumulate) {
    check_conv_backward(cfg_, n, dw, db);
    ctx_.bind_threads();
    ConvPlan& p = plans_.get(n, "conv2d", this, &CpuConv2d::build);
    DDPV_DNNL_CHECK("conv2d backward", {
      p.dy.load(ctx_, dy);
      if (dx != nullptr) {
        if (p.dy_data_own) {
          if (!p.dy_data) {
            p.dy_data.emplace(p.dy.user.get_desc(), p.dy_data_md, ctx_.engine);
            p.bwd_data_args[DNNL_ARG_DIFF_DST] = p.dy_data->prim;
          }
          p.dy_data->load(ctx_, dy);
        }
        p.backward_data(ctx_, w, dx);
      }
      p.backward_weights(ctx_, x, dw, cfg_.bias ? db : nullptr, cfg_.out_channels, accumulate);
    });
  }

  // Note [bf16 on oneDNN]: whether oneDNN builds the primitives for n images (on a kernel
  // other than its reference one unless any_kernel). Not called on the hot path.
  bool try_plan(int n, bool any_kernel) {
    const ConvPlan* p = plans_.try_get(n, this, &CpuConv2d::build);
    if (p == nullptr) return false;
    last_n_ = n;
    return any_kernel || !p->on_reference();
  }
  // The kernels of the last forward's batch size (WeightedPlan::kernels).
  std::string kernels() const {
    const ConvPlan* p = plans_.find(last_n_);
    return p == nullptr ? std::string() : p->kernels();
  }

 private:
  void build(int n, ConvPlan& p) const {
    const auto& c = cfg_;
    const dnnl::engine& eng = ctx_.engine;
    const Mem::dims x_dims{n, c.in_channels, c.in_h, c.in_w};  // logical NCHW
    const Mem::dims y_dims{n, c.out_channels, c.out_h(), c.out_w()};
    const Mem::dims w_dims{c.out_channels, c.in_channels, c.kernel, c.kernel};
    const Mem::dims b_dims{c.out_channels};
    const Mem::dims strides{c.stride, c.stride}, pad{c.padding, c.padding};
    // The caller's layouts, and the primitives' (Notes [Mixed activation layouts] and [First
    // convolution from NCHW]).
    const auto x_user = activation_desc(x_dims, c.in_block, act_);
    const auto y_user = activation_desc(y_dims, c.out_block, act_);
    const bool mixed = c.in_block != c.out_block;
    const auto w_user_md = f32_desc(w_dims, Tag::oihw), b_md = f32_desc(b_dims, Tag::x);
    // Note [bf16 on oneDNN]: bf16 weights (the arena's reordered and rounded on every call)
    // where the activations are bf16; weight gradients f32 either way.
    const auto w_any = Mem::desc(w_dims, act_, Tag::any), dw_any = f32_desc(w_dims, Tag::any);
    const auto alg = dnnl::algorithm::convolution_direct;
    const auto attr = user_scratchpad_attr();

    using Fwd = dnnl::convolution_forward;
    using BwdData = dnnl::convolution_backward_data;
    using BwdWeights = dnnl::convolution_backward_weights;
    const auto fwd_pd_of = [&](const Mem::desc& x_md, const Mem::desc& y_md) {
      return Fwd::primitive_desc(c.bias ? Fwd::desc(dnnl::prop_kind::forward_training, alg, x_md,
                                                    w_any, b_md, y_md, strides, pad, pad)
                                        : Fwd::desc(dnnl::prop_kind::forward_training, alg, x_md,
                                                    w_any, y_md, strides, pad, pad),
                                 attr, eng);
    };
    const auto bwd_w_pd_of = [&](const Mem::desc& x_md, const Mem::desc& y_md,
                                 const Fwd::primitive_desc& hint) {
      return BwdWeights::primitive_desc(
          c.bias ? BwdWeights::desc(alg, x_md, dw_any, b_md, y_md, strides, pad, pad)
                 : BwdWeights::desc(alg, x_md, dw_any, y_md, strides, pad, pad),
          attr, eng, hint);
    };
    Mem::desc x_md = x_user, y_md = y_user;
    Fwd::primitive_desc fwd_pd;
    BwdWeights::primitive_desc bwd_w_pd;
    bool planar = mixed && c.in_block == 0;  // Note [First convolution from NCHW]
    if (planar) {
      x_md = Mem::desc(x_dims, act_, Tag::nchw);
      try {
        fwd_pd = fwd_pd_of(x_md, y_md);
        bwd_w_pd = bwd_w_pd_of(x_md, y_md, fwd_pd);
        planar = !is_reference(fwd_pd) && !is_reference(bwd_w_pd);
      } catch (const dnnl::error&) {
        planar = false;  // no implementation at all: NHWC -> NHWC below
      }
    }
    if (!planar) {
      if (mixed) {  // Note [Mixed activation layouts]
        x_md = activation_desc(x_dims, 0, act_);
        y_md = activation_desc(y_dims, 0, act_);
      }
      fwd_pd = fwd_pd_of(x_md, y_md);
      bwd_w_pd = bwd_w_pd_of(x_md, y_md, fwd_pd);
    }
    // Backward-data has no planar kernel of its own: where forward is planar, it runs NHWC ->
    // NHWC (Note [First convolution from NCHW]).
    const auto data_x_md = planar ? activation_desc(x_dims, 0, act_) : x_md;
    const auto data_y_md = planar ? activation_desc(y_dims, 0, act_) : y_md;
    const BwdData::primitive_desc bwd_data_pd(
        BwdData::desc(alg, data_x_md, w_any, data_y_md, strides, pad, pad), attr, eng,
        planar ? fwd_pd_of(data_x_md, data_y_md) : fwd_pd);

    p.x = Relayout(x_user, x_md, eng);
    p.y = Relayout(y_user, y_md, eng);
    p.dy = Relayout(y_user, y_md, eng);
    p.dx = Relayout(x_user, data_x_md, eng);
    p.dy_data_own = planar;  // bwd_data_args' dy is then p.dy_data's, set on its first use
    p.dy_data_md = data_y_md;
    p.build(fwd_pd, bwd_data_pd, bwd_w_pd, w_user_md, b_md, c.bias, eng);
  }

  CpuContext ctx_;
  Conv2dConfig cfg_;
  Dt act_;          // the activations' dtype
  int last_n_ = 0;  // the batch size of the last forward (or probe)
  PlansByBatch<ConvPlan> plans_;
};

// Note [bf16 on oneDNN]: the convolution on bf16 activations.
class OneDnnBf16Conv2d final : public Conv2dOp {
 public:
  OneDnnBf16Conv2d(std::unique_ptr<CpuConv2d> op, const Conv2dConfig& c, Bf16Staging& s)
      : op_(std::move(op)), in_(int64_t{c.in_h} * c.in_w * c.in_channels), st_(s) {}
  void forward(int n, ConstAct x, const float* w, const float* b, MutAct y) override {
    op_->run_forward(n, st_.as_bf16(x, n * in_), w, b, y.bf16());
  }
  void backward(int n, ConstAct x, const float* w, ConstAct dy, MutAct dx, float* dw, float* db,
                bool accumulate) override {
    op_->run_backward(n, st_.as_bf16(x, n * in_), w, dy.bf16(), dx.bf16(), dw, db, accumulate);
  }
  std::string algorithm() const override { return "direct, bf16 on oneDNN " + op_->kernels(); }

 private:
  std::unique_ptr<CpuConv2d> op_;
  int64_t in_;  // input elements per image
  Bf16Staging& st_;
};

}  // namespace

std::unique_ptr<Conv2dOp> make_onednn_bf16_conv2d(const CpuContext& ctx, const Conv2dConfig& cfg,
                                                  bool any_kernel, Bf16Staging& staging) {
  auto op = std::make_unique<CpuConv2d>(ctx, cfg, Dt::bf16);
  if (!op->try_plan(2, any_kernel)) return nullptr;  // the kernels rarely depend on n
  return std::make_unique<OneDnnBf16Conv2d>(std::move(op), cfg, staging);
}

std::unique_ptr<FusableConv> make_conv2d(const CpuContext& ctx, const Conv2dConfig& cfg) {
  check_config(cfg);
  if (const int tile = winograd_tile(ctx.conv, cfg)) return make_winograd_conv2d(ctx, cfg, tile);
  if (single_channel_conv_applies(ctx.conv, cfg)) return make_single_channel_conv2d(ctx, cfg);
  return std::make_unique<CpuConv2d>(ctx, cfg);
}

}  // namespace ddpv::cpu
