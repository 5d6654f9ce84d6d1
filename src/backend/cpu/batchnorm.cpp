// BatchNormOp on oneDNN: batch normalisation forward (training, inference) and backward, NHWC
// or channel-blocked (Note [Blocked activations]),
// with separate scale (gamma) and shift (beta) and PyTorch's running-statistics rule.
//
// Note [BatchNorm + ReLU]: when a ReLU follows, oneDNN's fuse_norm_relu flag applies it inside
// the normalisation's own pass (forward keeps a bit per element in a workspace, backward masks
// dy with it before the normalisation's backward), which saves the ReLU's forward and backward
// passes over the activation: 10 of resnet20's 19 ReLUs follow a BatchNorm. The one
// difference from separate layers: oneDNN's ReLU gives 0 for NaN where ours keeps NaN, and a
// model whose activations turned NaN must not look healthy (the trainer stops on a non-finite
// loss). A NaN or infinity anywhere in a channel's input makes that channel's batch mean or
// variance non-finite, so forward_train checks the C statistics and writes NaN over the
// channels whose statistics are not finite; unfused, they would have been NaN throughout.
//
// Note [Batch statistics from the convolution]: in training, oneDNN's BatchNorm reads its input
// three times (the mean, the variance, then the normalisation), and its input is a tensor the
// convolution before it has just written tile by tile from registers (resnet20: 16 of its 19
// BatchNorms follow a Winograd convolution). That convolution can add up each tile's outputs
// and their squares as it stores them (FusableConv::write_batch_stats; a tile's at most 16
// values a channel summed in floats, the tiles in doubles per thread, the threads added in
// thread order); forward_train then turns the sums into the mean and the biased variance (in
// double: E[x^2] - E[x]^2 loses nothing that matters there) and normalises in one pass with
// oneDNN's use_global_stats. Backward is built without that flag, so it still
// differentiates through the batch statistics. conv_bn_bench (resnet20's stage shapes,
// alternated in one run): the BatchNorm about half as long in every stage, the convolution a
// little dearer, the two together faster (docs/performance.md, "CPU engine").
//
// Note [BatchNorm + residual]: a residual block ends in relu(bn2(conv2(...)) + shortcut):
// oneDNN's normalisation writes bn2's output, and the add_relu pass reads it back with the
// shortcut. With the statistics given (above), the normalisation is an affine map per channel
// that needs no pass of oneDNN's, so forward_add_relu applies it, adds the shortcut and
// rectifies in one pass (x and the shortcut read, y written: two streams of five saved).
// Backward is oneDNN's, which takes the statistics and x, never bn2's output, so that output
// need not exist; the block's ReLU backward still masks dy with y. Every block of resnet20
// (the projection blocks run their shortcut first). With Notes [Input gradient added] and
// [Batch statistics from the convolution], alternated with the build before the three
// fusions (model_bench --sgd 1 resnet20): a shorter step on one thread and on two.
#include <cmath>
#include <limits>
#include <memory>
#include <unordered_map>
#include <vector>

#include "backend/cpu/cpu_ops.hpp"
#include "backend/cpu/team.hpp"

namespace ddpv::cpu {
namespace {

using Flags = dnnl::normalization_flags;

// Everything built for one batch size.
struct BatchNormPlan {
  dnnl::batch_normalization_forward train, infer;
  dnnl::batch_normalization_backward bwd;
  dnnl::batch_normalization_forward::primitive_desc train_pd;
  dnnl::batch_normalization_backward::primitive_desc bwd_pd;
  Mem x, y, dy, dx, gamma, beta, run_mean, run_var;  // caller memory, bound per call
  Mem workspace;  // the ReLU's mask under fuse_norm_relu (Note [BatchNorm + ReLU])
  Scratchpad scratch;
  std::unordered_map<int, Mem> train_args, infer_args, bwd_args;
};

class CpuBatchNorm final : public FusableBatchNorm {
 public:
  CpuBatchNorm(const CpuContext& ctx, const BatchNormConfig& cfg, Dt act = Dt::f32)
      : ctx_(ctx), cfg_(cfg), act_(act) {
    DDPV_CHECK(cfg.channels > 0 && cfg.h > 0 && cfg.w > 0,
               "batchnorm2d: channels and spatial size must be positive, got channels=",
               cfg.channels, " size ", cfg.h, "x", cfg.w);
    DDPV_CHECK(cfg.eps > 0, "batchnorm2d: eps must be positive, got ", cfg.eps);
    DDPV_CHECK(cfg.momentum >= 0 && cfg.momentum <= 1,
               "batchnorm2d: momentum must lie in [0, 1], got ", cfg.momentum);
    DDPV_DNNL_CHECK("batchnorm2d: allocating the statistics", {
      const auto c_md = f32_desc({cfg.channels}, Tag::x);
      mean_ = Mem(c_md, ctx.engine);
      var_ = Mem(c_md, ctx.engine);
      dgamma_ = Mem(c_md, ctx.engine);
      dbeta_ = Mem(c_md, ctx.engine);
      unused_shift_ = Mem(c_md, ctx.engine);
    });
  }

  bool fuse_relu() override {  // f32 and bf16 alike (Note [bf16 blocks on oneDNN])
    relu_ = true;
    plans_.clear();  // built without the flag
    return true;
  }

  double* given_stats() override {
    if (act_ != Dt::f32) return nullptr;
    given_.resize(2 * size_t(cfg_.channels));
    return given_.data();
  }

  void take_given_stats() override {
    use_given_ = true;
    plans_.clear();  // built without the flag
  }

  bool takes_given_stats() const override { return use_given_; }

  // Note [BatchNorm + residual]: with the statistics given, training needs no pass of oneDNN's
  // either; the normalisation is an affine map per channel, applied here with the residual
  // and the ReLU. (Not with fuse_relu: backward would want oneDNN's ReLU mask.)
  bool fuse_add_relu() override { return use_given_ && !relu_; }

  void forward_add_relu(int n, bool training, const float* x, const float* gamma, const float* beta,
                        const float* other, float* y, float* running_mean,
                        float* running_var) override {
    check_batch("batchnorm2d forward", n);
    DDPV_CHECK(use_given_ && !relu_, "batchnorm2d: forward_add_relu without fuse_add_relu");
    const int ch = cfg_.channels;
    const float* mean = running_mean;
    const float* var = running_var;
    if (training) {
      const int64_t m = static_cast<int64_t>(n) * cfg_.h * cfg_.w;
      DDPV_CHECK(m > 1, "batchnorm2d: training needs more than one value per channel, got batch ",
                 n, " of ", cfg_.h, "x", cfg_.w, "; use a larger batch");
      set_given_stats(m);
      mean = static_cast<const float*>(mean_.get_data_handle());
      var = static_cast<const float*>(var_.get_data_handle());
      update_running(m, mean, var, running_mean, running_var);
      last_train_n_ = n;
    }
    scale_.resize(2 * size_t(ch));
    for (int c = 0; c < ch; ++c) {  // y = x a + b, as oneDNN: gamma / sqrt(var + eps)
      const float a = gamma[c] / std::sqrt(var[c] + cfg_.eps);
      scale_[size_t(c)] = a;
      scale_[size_t(ch + c)] = beta[c] - mean[c] * a;
    }
    // NHWC: runs of C per position; blocked: runs of b per position, C / b blocks per image.
    // Note [Planes of one block]: the loop goes over (image, block) planes of hw runs that
    // share their channels, which it finds once per plane. Finding them per run of b floats
    // (a 64-bit division and a remainder per 64 bytes) made this pass several times slower
    // than oneDNN's normalisation over two thirds of the bytes in resnet20's stage-1 blocks;
    // per plane it is about a third faster than that was (ddpv-train --profile-layers,
    // alternated with the build before). AVX-512 clones of the loop gained nothing: it waits
    // on memory.
    const int64_t b = cfg_.block > 0 ? cfg_.block : ch, hw = int64_t{cfg_.h} * cfg_.w;
    const int64_t blocks = ch / b, planes = int64_t{n} * blocks;
    ctx_.bind_threads();
    in_team(planes * hw * b >= (1 << 16), [&] {  // Note [No team of one]
      team_for(int64_t{0}, planes, [&](int64_t q) {
        const float* sa = scale_.data() + q % blocks * b;
        const float* sb = sa + ch;
        const int64_t o = q * hw * b;
        if (b == 16) return add_relu_plane<16>(hw, 16, x + o, sa, sb, other + o, y + o);
        add_relu_plane<0>(hw, b, x + o, sa, sb, other + o, y + o);
      });
    });
  }

  // y = max(0, x a + s + other) over hw runs of b floats (B: b known when compiled, or 0),
  // a and s per float of a run. The add_relu op's rule: NaN kept, -0 becomes +0.
  template <int B>
  static void add_relu_plane(int64_t hw, int64_t b, const float* x, const float* a, const float* s,
                             const float* other, float* y) {
    if constexpr (B > 0) b = B;
    for (int64_t p = 0; p < hw; ++p, x += b, other += b, y += b) {
#pragma omp simd
      for (int64_t j = 0; j < b; ++j) {
        const float v = x[j] * a[j] + s[j] + other[j];
        y[j] = v <= 0.0f ? 0.0f : v;
      }
    }
  }

  void forward_train_f32(int n, const float* x, const float* gamma, const float* beta, float* y,
                         float* running_mean, float* running_var) override {
    check_f32();
    run_train(n, x, gamma, beta, y, running_mean, running_var);
  }
  void forward_infer_f32(int n, const float* x, const float* gamma, const float* beta,
                         const float* running_mean, const float* running_var, float* y) override {
    check_f32();
    run_infer(n, x, gamma, beta, running_mean, running_var, y);
  }
  void backward_f32(int n, const float* x, const float* gamma, const float* dy, float* dx,
                    float* dgamma, float* dbeta, bool accumulate) override {
    check_f32();
    run_backward(n, x, gamma, dy, dx, dgamma, dbeta, accumulate);
  }

  // The three entry points on activations of the op's dtype (f32 floats or bf16 bits);
  // parameters, statistics and their gradients f32 always.
  void run_train(int n, const void* x, const float* gamma, const float* beta, void* y,
                 float* running_mean, float* running_var) {
    check_batch("batchnorm2d forward", n);
    const int64_t m = static_cast<int64_t>(n) * cfg_.h * cfg_.w;
    DDPV_CHECK(m > 1, "batchnorm2d: training needs more than one value per channel, got batch ", n,
               " of ", cfg_.h, "x", cfg_.w, "; use a larger batch");
    ctx_.bind_threads();
    BatchNormPlan& p = plans_.get(n, "batchnorm2d", this, &CpuBatchNorm::build);
    if (use_given_) set_given_stats(m);
    DDPV_DNNL_CHECK("batchnorm2d forward (training)", {
      bind(p.x, x);
      bind(p.y, y);
      bind(p.gamma, gamma);
      bind(p.beta, beta);
      p.train.execute(ctx_.stream, p.train_args);
    });
    last_train_n_ = n;
    const float* mean = static_cast<const float*>(mean_.get_data_handle());
    const float* var = static_cast<const float*>(var_.get_data_handle());
    update_running(m, mean, var, running_mean, running_var);
    if (relu_) keep_non_finite(n, mean, var, y);
  }

  void run_infer(int n, const void* x, const float* gamma, const float* beta,
                 const float* running_mean, const float* running_var, void* y) {
    check_batch("batchnorm2d forward", n);
    ctx_.bind_threads();
    BatchNormPlan& p = plans_.get(n, "batchnorm2d", this, &CpuBatchNorm::build);
    DDPV_DNNL_CHECK("batchnorm2d forward (inference)", {
      bind(p.x, x);
      bind(p.y, y);
      bind(p.gamma, gamma);
      bind(p.beta, beta);
      bind(p.run_mean, running_mean);
      bind(p.run_var, running_var);
      p.infer.execute(ctx_.stream, p.infer_args);
    });
  }

  void run_backward(int n, const void* x, const float* gamma, const void* dy, void* dx,
                    float* dgamma, float* dbeta, bool accumulate) {
    check_batch("batchnorm2d backward", n);
    DDPV_CHECK(n == last_train_n_, "batchnorm2d backward: batch size ", n,
               " differs from the last forward_train (", last_train_n_,
               "); backward needs that forward's batch statistics");
    ctx_.bind_threads();
    BatchNormPlan& p = plans_.get(n, "batchnorm2d", this, &CpuBatchNorm::build);
    DDPV_DNNL_CHECK("batchnorm2d backward", {
      bind(p.x, x);
      bind(p.gamma, gamma);
      bind(p.dy, dy);
      bind(p.dx, dx);
      p.bwd.execute(ctx_.stream, p.bwd_args);
    });
    const float* dg = static_cast<const float*>(dgamma_.get_data_handle());
    const float* db = static_cast<const float*>(dbeta_.get_data_handle());
    for (int c = 0; c < cfg_.channels; ++c) {
      dgamma[c] = accumulate ? dgamma[c] + dg[c] : dg[c];
      dbeta[c] = accumulate ? dbeta[c] + db[c] : db[c];
    }
  }

 private:
  void check_f32() const {
    DDPV_CHECK(act_ == Dt::f32, "batchnorm2d: f32 activations handed to a bf16 op (internal)");
  }

  // PyTorch's rule: the running variance takes the unbiased batch variance (oneDNN's variance
  // is the biased one, which normalisation uses).
  void update_running(int64_t m, const float* mean, const float* var, float* running_mean,
                      float* running_var) const {
    const float mom = cfg_.momentum;
    const double unbias = static_cast<double>(m) / static_cast<double>(m - 1);
    for (int c = 0; c < cfg_.channels; ++c) {
      running_mean[c] = (1 - mom) * running_mean[c] + mom * mean[c];
      running_var[c] = static_cast<float>((1 - mom) * running_var[c] + mom * var[c] * unbias);
    }
  }

  // Note [Batch statistics from the convolution]: the mean and the biased variance of the m
  // values of each channel, from the sums the convolution wrote, for forward (which then
  // normalises in one pass over x, with oneDNN's use_global_stats) and for backward.
  void set_given_stats(int64_t m) {
    float* mean = static_cast<float*>(mean_.get_data_handle());
    float* var = static_cast<float*>(var_.get_data_handle());
    const int ch = cfg_.channels;
    for (int c = 0; c < ch; ++c) {
      const double mu = given_[size_t(c)] / double(m);
      const double v = given_[size_t(ch + c)] / double(m) - mu * mu;
      mean[c] = static_cast<float>(mu);
      var[c] = static_cast<float>(v > 0 || !std::isfinite(v) ? v : 0.0);  // rounding below 0
    }
  }

  // Note [BatchNorm + ReLU]: channels whose batch statistics are not finite become NaN.
  void keep_non_finite(int n, const float* mean, const float* var, void* y) const {
    const int ch = cfg_.channels;
    bool all_finite = true;
    for (int c = 0; c < ch; ++c) all_finite = all_finite && std::isfinite(mean[c] + var[c]);
    if (all_finite) return;
    if (act_ == Dt::bf16) {
      fill_non_finite(n, mean, var, static_cast<uint16_t*>(y), uint16_t{0x7fc0});  // quiet NaN
    } else {
      fill_non_finite(n, mean, var, static_cast<float*>(y),
                      std::numeric_limits<float>::quiet_NaN());
    }
  }
  template <class T>
  void fill_non_finite(int n, const float* mean, const float* var, T* y, T nan) const {
    const int ch = cfg_.channels;
    // NHWC: runs of C per position; blocked: runs of b per position, C / b blocks per image.
    const int64_t b = cfg_.block > 0 ? cfg_.block : ch, hw = int64_t{cfg_.h} * cfg_.w;
    const int64_t runs = int64_t{n} * (ch / b) * hw;
    for (int64_t r = 0; r < runs; ++r) {
      const int64_t c0 = cfg_.block > 0 ? (r / hw) % (ch / b) * b : 0;
      for (int64_t j = 0; j < b; ++j) {
        if (!std::isfinite(mean[c0 + j] + var[c0 + j])) y[r * b + j] = nan;
      }
    }
  }

  // Note [bf16 on oneDNN]: whether oneDNN builds the primitives for n images (on a kernel
  // other than its reference one unless any_kernel). Not called on the hot path.
 public:
  bool try_plan(int n, bool any_kernel) {
    const BatchNormPlan* p = plans_.try_get(n, this, &CpuBatchNorm::build);
    return p != nullptr && (any_kernel || !(is_reference(p->train_pd) || is_reference(p->bwd_pd)));
  }

 private:
  void build(int n, BatchNormPlan& p) const {
    const dnnl::engine& eng = ctx_.engine;
    const auto x_md = activation_desc({n, cfg_.channels, cfg_.h, cfg_.w}, cfg_.block, act_);
    const auto c_md = f32_desc({cfg_.channels}, Tag::x);
    const auto attr = user_scratchpad_attr();
    const Flags affine =
        Flags::use_scale | Flags::use_shift | (relu_ ? Flags::fuse_norm_relu : Flags::none);
    using Fwd = dnnl::batch_normalization_forward;
    using Bwd = dnnl::batch_normalization_backward;
    // Note [Batch statistics from the convolution]: forward takes the statistics as inputs;
    // backward still differentiates through them (it is built without the flag).
    const Fwd::primitive_desc train_pd(
        Fwd::desc(dnnl::prop_kind::forward_training, x_md, cfg_.eps,
                  use_given_ ? affine | Flags::use_global_stats : affine),
        attr, eng);
    const Fwd::primitive_desc infer_pd(Fwd::desc(dnnl::prop_kind::forward_inference, x_md, cfg_.eps,
                                                 affine | Flags::use_global_stats),
                                       attr, eng);
    const Bwd::primitive_desc bwd_pd(
        Bwd::desc(dnnl::prop_kind::backward, x_md, x_md, cfg_.eps, affine), attr, eng, train_pd);
    p.train = Fwd(train_pd);
    p.infer = Fwd(infer_pd);
    p.bwd = Bwd(bwd_pd);
    p.train_pd = train_pd;
    p.bwd_pd = bwd_pd;
    p.scratch.require(train_pd);
    p.scratch.require(infer_pd);
    p.scratch.require(bwd_pd);
    p.scratch.allocate(eng);

    p.x = user_memory(x_md, eng);
    p.y = user_memory(x_md, eng);
    p.dy = user_memory(x_md, eng);
    p.dx = user_memory(x_md, eng);
    p.gamma = user_memory(c_md, eng);
    p.beta = user_memory(c_md, eng);
    p.run_mean = user_memory(c_md, eng);
    p.run_var = user_memory(c_md, eng);
    p.train_args = {{DNNL_ARG_SRC, p.x},
                    {DNNL_ARG_DST, p.y},
                    {DNNL_ARG_SCALE, p.gamma},
                    {DNNL_ARG_SHIFT, p.beta},
                    {DNNL_ARG_MEAN, mean_},
                    {DNNL_ARG_VARIANCE, var_},
                    {DNNL_ARG_SCRATCHPAD, p.scratch.view(train_pd, eng)}};
    p.infer_args = {{DNNL_ARG_SRC, p.x},
                    {DNNL_ARG_DST, p.y},
                    {DNNL_ARG_SCALE, p.gamma},
                    {DNNL_ARG_SHIFT, p.beta},
                    {DNNL_ARG_MEAN, p.run_mean},
                    {DNNL_ARG_VARIANCE, p.run_var},
                    {DNNL_ARG_SCRATCHPAD, p.scratch.view(infer_pd, eng)}};
    p.bwd_args = {
        {DNNL_ARG_SRC, p.x},           {DNNL_ARG_MEAN, mean_},
        {DNNL_ARG_VARIANCE, var_},     {DNNL_ARG_DIFF_DST, p.dy},
        {DNNL_ARG_SCALE, p.gamma},     {DNNL_ARG_SHIFT, unused_shift_},
        {DNNL_ARG_DIFF_SRC, p.dx},     {DNNL_ARG_DIFF_SCALE, dgamma_},
        {DNNL_ARG_DIFF_SHIFT, dbeta_}, {DNNL_ARG_SCRATCHPAD, p.scratch.view(bwd_pd, eng)}};
    if (train_pd.workspace_desc().get_size() > 0) {
      p.workspace = Mem(train_pd.workspace_desc(), eng);
      p.train_args.emplace(DNNL_ARG_WORKSPACE, p.workspace);
      p.bwd_args.emplace(DNNL_ARG_WORKSPACE, p.workspace);
    }
  }

  CpuContext ctx_;
  BatchNormConfig cfg_;
  Dt act_;              // the activations' dtype
  Mem mean_, var_;      // (C) batch statistics of the last forward_train, for backward
  Mem dgamma_, dbeta_;  // (C) backward's output, before overwriting or adding
  // (C) oneDNN 2.6 asks backward for the shift although the gradient does not depend on it,
  // and BatchNormOp::backward is not given beta.
  Mem unused_shift_;
  int last_train_n_ = 0;
  bool relu_ = false;  // Note [BatchNorm + ReLU]
  // Note [Batch statistics from the convolution]: the sums the convolution writes, and
  // whether forward_train uses them
  std::vector<double> given_;
  bool use_given_ = false;
  std::vector<float> scale_;  // Note [BatchNorm + residual]: a, then b, per channel
  PlansByBatch<BatchNormPlan> plans_;
};

// Note [bf16 on oneDNN]: the normalisation of bf16 activations, with f32 statistics, scale
// and shift; with the ReLU after it fused in for a bf16 block (Note [bf16 blocks on oneDNN]).
class OneDnnBf16BatchNorm final : public BatchNormOp {
 public:
  explicit OneDnnBf16BatchNorm(std::unique_ptr<CpuBatchNorm> op) : op_(std::move(op)) {}
  void forward_train(int n, ConstAct x, const float* gamma, const float* beta, MutAct y,
                     float* running_mean, float* running_var) override {
    op_->run_train(n, x.bf16(), gamma, beta, y.bf16(), running_mean, running_var);
  }
  void forward_infer(int n, ConstAct x, const float* gamma, const float* beta,
                     const float* running_mean, const float* running_var, MutAct y) override {
    op_->run_infer(n, x.bf16(), gamma, beta, running_mean, running_var, y.bf16());
  }
  void backward(int n, ConstAct x, const float* gamma, ConstAct dy, MutAct dx, float* dgamma,
                float* dbeta, bool accumulate) override {
    op_->run_backward(n, x.bf16(), gamma, dy.bf16(), dx.bf16(), dgamma, dbeta, accumulate);
  }

 private:
  std::unique_ptr<CpuBatchNorm> op_;
};

}  // namespace

std::unique_ptr<FusableBatchNorm> make_batchnorm2d(const CpuContext& ctx,
                                                   const BatchNormConfig& cfg) {
  return std::make_unique<CpuBatchNorm>(ctx, cfg);
}

std::unique_ptr<BatchNormOp> make_onednn_bf16_batchnorm2d(const CpuContext& ctx,
                                                          const BatchNormConfig& cfg,
                                                          bool any_kernel, bool relu) {
  auto op = std::make_unique<CpuBatchNorm>(ctx, cfg, Dt::bf16);
  if (relu) op->fuse_relu();
  if (!op->try_plan(2, any_kernel)) return nullptr;
  return std::make_unique<OneDnnBf16BatchNorm>(std::move(op));
}

}  // namespace ddpv::cpu
