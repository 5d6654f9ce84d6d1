// The CPU backend: host memory, the oneDNN engine and stream, the elementwise ops and the fused
// SGD update; the op families live in conv.cpp, batchnorm.cpp, pool.cpp, linear.cpp and
// softmax_xent.cpp.
#include "backend/cpu/cpu_backend.hpp"

#include <omp.h>

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cpu/cpu_ops.hpp"
#include "backend/cpu/kernels/simd/transpose8.hpp"
#include "backend/cpu/kernels/winograd/winograd.hpp"
#include "backend/cpu/team.hpp"
#include "ddpv/core/dtype.hpp"

namespace ddpv {
namespace cpu {

void CpuContext::bind_threads() const {
  if (threads > 0) omp_set_num_threads(threads);
}

namespace {

// Note [Relayout by transposes]: between NCHW and blocks of b channels, block by block, a
// block is a transpose of hw x b floats. Loop by loop (one float a time: a gather on one side)
// is more than twice as slow as 8 x 8 tiles of registers transposed by shuffles, in a hot
// cache; in the step, where the source comes from L3, the gain is smaller but measurable
// (model_bench --sgd 1 lenet under perf).
const bool kAvx2 = __builtin_cpu_supports("avx2");

// Element access of a typed activation view in the elementwise loops (Note [Activation dtype]):
// f32 as it is, bf16 widened on reading and rounded to nearest even on writing.
struct F32Read {
  const float* p;
  float operator()(int64_t i) const { return p[i]; }
};
struct Bf16Read {
  const uint16_t* p;
  float operator()(int64_t i) const { return bf16_to_f32(p[i]); }
};
struct F32Write {
  float* p;
  void operator()(int64_t i, float v) const { p[i] = v; }
};
struct Bf16Write {
  uint16_t* p;
  void operator()(int64_t i, float v) const { p[i] = f32_to_bf16(v); }
};
template <class F>
void reading(ConstAct a, const F& f) {
  if (a.is_bf16()) {
    f(Bf16Read{a.bf16()});
  } else {
    f(F32Read{a.f32()});
  }
}
template <class F>
void writing(MutAct a, const F& f) {
  if (a.is_bf16()) {
    f(Bf16Write{a.bf16()});
  } else {
    f(F32Write{a.f32()});
  }
}
bool all_f32(std::initializer_list<ConstAct> views) {
  for (const ConstAct& v : views)
    if (v.is_bf16()) return false;
  return true;
}
// body(i) for every element, on the team where the count is worth it.
template <class Body>
void each_element(int64_t count, const Body& body) {
  in_team(count >= kParallelMin, [&] {  // Note [No team of one]
#pragma omp for simd
    for (int64_t i = 0; i < count; ++i) body(i);
  });
}

// The instruction set oneDNN runs on, as its documentation names it.
const char* isa_name() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_amx:
      return "AMX";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "AVX512-BF16";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "AVX-512 VNNI";
    case dnnl::cpu_isa::avx512_core:
      return "AVX-512";
    case dnnl::cpu_isa::avx2_vnni:
      return "AVX2 VNNI";
    case dnnl::cpu_isa::avx2:
      return "AVX2";
    default:
      return "below AVX2";
  }
}

// Whether the ISA oneDNN runs on includes `want` (each cpu_isa's mask holds its subsets': AMX's
// holds AVX512-BF16's, which holds AVX-512's).
bool isa_includes(dnnl::cpu_isa want) {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto mask = static_cast<unsigned>(want);
  return (isa & mask) == mask;
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options) {
    DDPV_CHECK(options.device == Device::kCpu, "the CPU backend was asked for device ",
               device_name(options.device));
    DDPV_CHECK(options.threads >= 0, "--threads must be >= 0 (0: the runtime's default), got ",
               options.threads);
    DDPV_CHECK(options.precision != Precision::kF16,
               "--precision fp16 is not supported by the CPU backend: use bf16 or fp32");
    // Notes [bf16 on oneDNN] and [bf16 fallback on the CPU].
    bf16_ = options.precision == Precision::kBF16;
    bf16_mode_ = options.cpu_bf16;
    ctx_.threads = options.threads;
    ctx_.block = options.activation_block >= 0
                     ? options.activation_block
                     : preferred_activation_block(isa_includes(dnnl::cpu_isa::avx512_core),
                                                  bf16_ && onednn_bf16() && cpu_has_amx());
    ctx_.conv = options.conv_algorithm;
    fuse_ = options.fuse_layers;
    // Note [Tuning options]: a switch that is not the default shows in name().
    if (ctx_.block == 0) tuning_ += ", nhwc activations";
    if (ctx_.conv != ConvAlgorithm::kAuto)
      tuning_ += std::string(", conv ") + choice_name(ctx_.conv);
    if (!fuse_) tuning_ += ", no fusion";
    if (bf16_) tuning_ += onednn_bf16() ? ", bf16 on oneDNN" : ", bf16 activations, f32 math";
    if (bf16_ && bf16_mode_ != CpuBf16::kAuto)
      tuning_ += std::string(" (--cpu-bf16 ") + choice_name(bf16_mode_) + ")";
    DDPV_CHECK(ctx_.block == 0 || ctx_.block == 8 || ctx_.block == 16,
               "the CPU backend keeps activations in NHWC (block 0) or in blocks of 8 or 16 "
               "channels, not ",
               ctx_.block);
    ctx_.bind_threads();
    DDPV_DNNL_CHECK("creating the CPU engine and stream", {
      ctx_.engine = dnnl::engine(dnnl::engine::kind::cpu, 0);
      ctx_.stream = dnnl::stream(ctx_.engine);
    });
  }

  Device device() const override { return Device::kCpu; }

  std::string name() const override {
    const dnnl_version_t* v = dnnl_version();
    const int threads = ctx_.threads > 0 ? ctx_.threads : omp_get_max_threads();
    return "cpu (oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
           std::to_string(v->patch) + ", " + std::to_string(threads) +
           (threads == 1 ? " thread" : " threads") + tuning_ + ")";
  }

  Allocator* allocator() override { return host_allocator(); }
  Allocator* staging_allocator() override { return host_allocator(); }

  void copy(void* dst, Device dst_device, const void* src, Device src_device,
            size_t bytes) override {
    DDPV_CHECK(dst_device == Device::kCpu && src_device == Device::kCpu,
               "cpu backend: copy between ", device_name(src_device), " and ",
               device_name(dst_device), " memory; this backend only knows host memory");
    if (bytes > 0) std::memmove(dst, src, bytes);
  }

  void synchronize() override {}

  // Under bf16 each op is oneDNN's bf16 one (Note [bf16 on oneDNN]) or the f32 one inside its
  // fallback adapter (Note [bf16 fallback on the CPU]).
  std::unique_ptr<Conv2dOp> conv2d(const Conv2dConfig& cfg) override {
    if (bf16_) {
      return bf16_op([&](bool any) { return make_onednn_bf16_conv2d(ctx_, cfg, any, staging_); },
                     "convolution",
                     [&] { return bf16_fallback(make_conv2d(ctx_, cfg), cfg, staging_); });
    }
    return make_conv2d(ctx_, cfg);
  }
  std::unique_ptr<BatchNormOp> batchnorm2d(const BatchNormConfig& cfg) override {
    if (bf16_) {
      return bf16_op([&](bool any) { return make_onednn_bf16_batchnorm2d(ctx_, cfg, any); },
                     "batch normalization",
                     [&] { return bf16_fallback(make_batchnorm2d(ctx_, cfg), cfg, staging_); });
    }
    return make_batchnorm2d(ctx_, cfg);
  }
  std::unique_ptr<Pool2dOp> pool2d(const Pool2dConfig& cfg) override {
    if (bf16_) {
      return bf16_op([&](bool any) { return make_onednn_bf16_pool2d(ctx_, cfg, any, staging_); },
                     "pooling",
                     [&] { return bf16_fallback(make_pool2d(ctx_, cfg), cfg, staging_); });
    }
    return make_pool2d(ctx_, cfg);
  }
  std::unique_ptr<LinearOp> linear(const LinearConfig& cfg) override {
    if (bf16_) {
      return bf16_op([&](bool any) { return make_onednn_bf16_linear(ctx_, cfg, any, staging_); },
                     "inner product",
                     [&] { return bf16_fallback(make_linear(ctx_, cfg), cfg, staging_); });
    }
    return make_linear(ctx_, cfg);
  }
  // Note [Fused blocks]: every chain is one op on the CPU (the op composes what its kernels
  // cannot take in), unless fusion is off. Under bf16 on the fallback the f32 block runs
  // inside one adapter (Note [bf16 fallback on the CPU]); on oneDNN's bf16 primitives the
  // blocks are declined and every layer runs on its own (its ops are not the f32 ones), except
  // where, under --cpu-bf16 auto, the f32 block is the faster one (Note [Fewer multiplications
  // or faster ones]).
  std::unique_ptr<FusedBlockOp> fused_block(const FusedBlockConfig& cfg) override {
    if (!fuse_) return nullptr;
    if (bf16_ && onednn_bf16() &&
        !(bf16_mode_ == CpuBf16::kAuto && f32_block_is_faster(cpu_has_amx(), ctx_.conv, cfg.conv)))
      return onednn_bf16_block(cfg);
    if (!bf16_) return make_fused_block(ctx_, *this, cfg);
    FusedBlockConfig f32 = cfg;
    f32.add_input_grad = false;  // dx goes through staging, which holds no earlier gradient
    return bf16_fallback(make_fused_block(ctx_, *this, f32), cfg, staging_);
  }
  std::unique_ptr<SoftmaxCrossEntropyOp> softmax_cross_entropy(int classes) override {
    if (bf16_) return bf16_fallback(make_softmax_cross_entropy(ctx_, classes), classes, staging_);
    return make_softmax_cross_entropy(ctx_, classes);
  }

  DType activation_dtype() const override { return bf16_ ? DType::kBF16 : DType::kF32; }

  std::string caveat() const override {
    if (!bf16_) return {};
    if (!onednn_bf16()) {
      return std::string("--precision bf16 on this CPU (") + isa_name() +
             (bf16_mode_ == CpuBf16::kFallback ? ", --cpu-bf16 fallback"
                                               : ", no bf16 instructions") +
             ") stores activations in bf16 but computes in f32, converting at every layer's or "
             "fused block's edges: "
             "it saves memory between layers and runs slower than fp32 (use --precision fp32 for "
             "speed)";
    }
    if (bf16_fallbacks_ > 0) {
      return "--precision bf16: oneDNN has no bf16 kernel (other than its reference one) for " +
             std::to_string(bf16_fallbacks_) +
             " of the model's layers, which compute in f32 between bf16 activations "
             "(--profile-layers names each layer's kernel)";
    }
    return {};
  }

  // The elementwise ops: the f32 loops below, the bf16 ones where every view is bf16 (Note
  // [bf16 elementwise loops]), or, where f32 and bf16 views mix, the same rules through
  // each_element with the views widened and rounded (Note [Activation dtype]).
  void relu_forward(int64_t count, ConstAct xa, MutAct ya) override {
    ctx_.bind_threads();
    if (xa.is_bf16() && ya.is_bf16()) return bf16_relu(count, xa.bf16(), ya.bf16());
    if (!all_f32({xa, ya})) {
      reading(xa, [&](auto x) {
        writing(ya, [&](auto y) {
          each_element(count, [&](int64_t i) {
            const float v = x(i);
            y(i, v <= 0.0f ? 0.0f : v);
          });
        });
      });
      return;
    }
    const float* x = xa.f32();
    float* y = ya.f32();
    // NaN propagates, as in PyTorch and the CUDA backend: a diverged activation stays visible.
    in_team(count >= kParallelMin, [&] {  // Note [No team of one]
#pragma omp for simd
      for (int64_t i = 0; i < count; ++i) y[i] = x[i] <= 0.0f ? 0.0f : x[i];  // -0 becomes +0
    });
  }

  void relu_backward(int64_t count, ConstAct ya, ConstAct dya, MutAct dxa) override {
    ctx_.bind_threads();
    if (ya.is_bf16() && dya.is_bf16() && dxa.is_bf16())
      return bf16_relu_backward(count, ya.bf16(), dya.bf16(), dxa.bf16());
    if (!all_f32({ya, dya, dxa})) {
      reading(ya, [&](auto y) {
        reading(dya, [&](auto dy) {
          writing(dxa, [&](auto dx) {
            each_element(count, [&](int64_t i) {
              const float g = dy(i);
              dx(i, y(i) > 0.0f ? g : 0.0f);
            });
          });
        });
      });
      return;
    }
    const float* y = ya.f32();
    const float* dy = dya.f32();
    float* dx = dxa.f32();
    in_team(count >= kParallelMin, [&] {  // Note [No team of one]
#pragma omp for simd
      for (int64_t i = 0; i < count; ++i) {
        // Load dy unconditionally: a load under the condition is control flow to GCC, which then
        // leaves the loop scalar and branchy (it was then a large share of a resnet20 step).
        const float g = dy[i];
        dx[i] = y[i] > 0.0f ? g : 0.0f;
      }
    });
  }

  void add(int64_t count, ConstAct aa, ConstAct ba, MutAct ya) override {
    ctx_.bind_threads();
    if (aa.is_bf16() && ba.is_bf16() && ya.is_bf16())
      return bf16_add(count, aa.bf16(), ba.bf16(), ya.bf16(), /*relu=*/false);
    if (!all_f32({aa, ba, ya})) {
      reading(aa, [&](auto a) {
        reading(ba, [&](auto b) {
          writing(ya, [&](auto y) { each_element(count, [&](int64_t i) { y(i, a(i) + b(i)); }); });
        });
      });
      return;
    }
    const float* a = aa.f32();
    const float* b = ba.f32();
    float* y = ya.f32();
    in_team(count >= kParallelMin, [&] {  // Note [No team of one]
#pragma omp for simd
      for (int64_t i = 0; i < count; ++i) y[i] = a[i] + b[i];
    });
  }

  void add_relu(int64_t count, ConstAct aa, ConstAct ba, MutAct ya) override {
    if (!fuse_) return Backend::add_relu(count, aa, ba, ya);  // two passes, as separate layers
    ctx_.bind_threads();
    if (aa.is_bf16() && ba.is_bf16() && ya.is_bf16())
      return bf16_add(count, aa.bf16(), ba.bf16(), ya.bf16(), /*relu=*/true);
    if (!all_f32({aa, ba, ya})) {  // one rounding, of the rectified sum
      reading(aa, [&](auto a) {
        reading(ba, [&](auto b) {
          writing(ya, [&](auto y) {
            each_element(count, [&](int64_t i) {
              const float v = a(i) + b(i);
              y(i, v <= 0.0f ? 0.0f : v);
            });
          });
        });
      });
      return;
    }
    const float* a = aa.f32();
    const float* b = ba.f32();
    float* y = ya.f32();
    in_team(count >= kParallelMin, [&] {  // Note [No team of one]
#pragma omp for simd
      for (int64_t i = 0; i < count; ++i) {
        const float v = a[i] + b[i];
        y[i] = v <= 0.0f ? 0.0f : v;  // relu_forward's rule: NaN kept, -0 becomes +0
      }
    });
  }

  void fill(int64_t count, float value, float* y) override {
    ctx_.bind_threads();
    in_team(count >= kParallelMin, [&] {  // Note [No team of one]
#pragma omp for simd
      for (int64_t i = 0; i < count; ++i) y[i] = value;
    });
  }

  void scale(int64_t count, float alpha, float* y) override {
    ctx_.bind_threads();
    in_team(count >= kParallelMin, [&] {  // Note [No team of one]
#pragma omp for simd
      for (int64_t i = 0; i < count; ++i) y[i] *= alpha;
    });
  }

  void cast_to_bf16(int64_t count, const float* x, uint16_t* y) override {
    ctx_.bind_threads();
    f32_to_bf16_array(count, x, y);
  }

  void cast_from_bf16(int64_t count, const uint16_t* x, float* y) override {
    ctx_.bind_threads();
    bf16_to_f32_array(count, x, y);
  }

  bool all_finite(int64_t count, const float* x) override {
    ctx_.bind_threads();
    int bad = 0;
    // |x| <= FLT_MAX is false for +-Inf and for NaN, and vectorises where isfinite may not.
    // Each thread ORs its share into its own flag, then into `bad`: an OpenMP reduction on
    // `bad` would need it shared in the enclosing parallel region, which clang cannot see
    // through the lambda's capture (and refuses to compile).
    in_team(count >= kParallelMin, [&] {  // Note [No team of one]
      int mine = 0;
#pragma omp for
      for (int64_t i = 0; i < count; ++i) mine |= !(std::fabs(x[i]) <= FLT_MAX);
#pragma omp atomic
      bad |= mine;
    });
    return bad == 0;
  }

  void relayout(int n, int h, int w, int c, int from, int to, ConstAct x, MutAct y) override {
    DDPV_CHECK(x.data != y.data, "relayout: cannot run in place");
    for (int layout : {from, to}) {
      DDPV_CHECK(layout == kNchw || layout == 0 || (layout > 0 && c % layout == 0), "relayout: ", c,
                 " channels have no layout with block ", layout);
    }
    ctx_.bind_threads();
    if (x.dtype == y.dtype) {
      if (x.is_bf16()) {
        relayout_as(n, h, w, c, from, to, x.bf16(), y.bf16());
      } else {
        relayout_as(n, h, w, c, from, to, x.f32(), y.f32());
      }
      return;
    }
    // f32 <-> bf16 (the model's f32 input into bf16 blocks): convert into the shared
    // grow-only staging (no op is running meanwhile), then move.
    const int64_t count = int64_t{n} * h * w * c;
    if (y.is_bf16()) {
      relayout_as(n, h, w, c, from, to, staging_.as_bf16(x, count), y.bf16());
    } else {
      relayout_as(n, h, w, c, from, to, staging_.in(0, x, count), y.f32());
    }
  }

  int activation_block() const override { return ctx_.block; }

  void sgd_update(const SgdConfig& cfg, const std::vector<ParamSpan>& spans, int64_t count,
                  float* param, const float* grad, float* momentum) override;
  void sgd_update_sum(const SgdConfig& cfg, const std::vector<ParamSpan>& spans, int64_t count,
                      float* param, const std::vector<const float*>& grads,
                      float* momentum) override;

 private:
  // The permutation of relayout over elements of type T (float or bf16 bits).
  template <class T>
  void relayout_as(int n, int h, int w, int c, int from, int to, const T* x, T* y) {
    // Every layout is blocked with some block b: NCHW b = 1, NHWC b = c. Element (i, ch, s)
    // (s: the spatial index) is at ((i * c / b + ch / b) * hw + s) * b + ch % b: the source
    // is read in order, and each channel's place in an image of the target is looked up.
    const int64_t hw = static_cast<int64_t>(h) * w;
    auto block_of = [c](int layout) { return layout == kNchw ? 1 : layout == 0 ? c : layout; };
    const int fb = block_of(from), tb = block_of(to);
    const int64_t image = hw * c;
    if (fb == 1 || tb == 1) {
      // NCHW <-> blocks of b channels (NHWC: b = c): block cb of image i holds the same hw x b
      // floats in both layouts, [b][hw] on the NCHW side and [hw][b] on the other, so each
      // block is one transpose, written in order (lenet's flatten was slow through the general
      // loop below, whose stores scattered one float at a time).
      const int b = fb == 1 ? tb : fb;
      in_team(static_cast<int64_t>(n) * image >= kParallelMin, [&] {  // Note [No team of one]
#pragma omp for collapse(2)
        for (int i = 0; i < n; ++i)
          for (int cb = 0; cb < c / b; ++cb) {
            const int64_t at = i * image + int64_t{cb} * hw * b;
            const T* __restrict src = x + at;
            T* __restrict dst = y + at;
            if constexpr (std::is_same_v<T, float>) {
              if (kAvx2 && b % 8 == 0) {  // Note [Relayout by transposes]
                for (int k = 0; k < b; k += 8) {
                  if (tb == 1) {
                    channels_to_planes_avx2(src + k, b, dst + k * hw, hw);
                  } else {
                    planes_to_channels_avx2(src + k * hw, hw, dst + k, b);
                  }
                }
                continue;
              }
            }
            if (tb == 1) {
              for (int k = 0; k < b; ++k)
                for (int64_t s = 0; s < hw; ++s) dst[k * hw + s] = src[s * b + k];
            } else {
              for (int64_t s = 0; s < hw; ++s)
                for (int k = 0; k < b; ++k) dst[s * b + k] = src[k * hw + s];
            }
          }
      });
      return;
    }
    std::vector<int64_t> place(static_cast<size_t>(c));
    for (int ch = 0; ch < c; ++ch) place[size_t(ch)] = ch / tb * hw * tb + ch % tb;
    in_team(static_cast<int64_t>(n) * image >= kParallelMin, [&] {  // Note [No team of one]
#pragma omp for
      for (int i = 0; i < n; ++i)
        for (int cb = 0; cb < c / fb; ++cb)
          for (int64_t s = 0; s < hw; ++s) {
            const T* src = x + i * image + (cb * hw + s) * fb;
            T* dst = y + i * image + s * tb;
            const int64_t* at = place.data() + int64_t{cb} * fb;
            for (int k = 0; k < fb; ++k) dst[at[k]] = src[k];
          }
    });
  }

  cpu::CpuContext ctx_;
  bool fuse_ = true;  // docs/architecture.md, "Layer fusion"
  // Note [bf16 on oneDNN]: oneDNN's bf16 primitives where used; the ops the fallback runs.
  bool onednn_bf16() const {
    return bf16_mode_ == CpuBf16::kOneDnn || (bf16_mode_ == CpuBf16::kAuto && cpu_computes_bf16());
  }
  // Note [bf16 blocks on oneDNN]: conv -> BatchNorm -> ReLU on oneDNN's bf16 ops, or null
  // (the layers then run one by one). The convolution is whatever conv2d() gives; the
  // BatchNorm must be oneDNN's, with the ReLU fused in.
  std::unique_ptr<FusedBlockOp> onednn_bf16_block(const FusedBlockConfig& cfg) {
    if (!onednn_bf16_block_applies(cfg)) return nullptr;
    auto bn = make_onednn_bf16_batchnorm2d(ctx_, cfg.bn, bf16_mode_ == CpuBf16::kOneDnn,
                                           /*relu=*/true);
    if (!bn) return nullptr;
    return make_onednn_bf16_block(cfg, conv2d(cfg.conv), std::move(bn));
  }
  // make(any_kernel): oneDNN's op, or null; fallback(): the f32 op in its adapter.
  template <class Make, class Fallback>
  auto bf16_op(Make make, const char* what, Fallback fallback) -> decltype(fallback()) {
    if (onednn_bf16()) {
      const bool forced = bf16_mode_ == CpuBf16::kOneDnn;
      if (auto op = make(/*any_kernel=*/forced)) return op;
      DDPV_CHECK(!forced, "--cpu-bf16 onednn: oneDNN ", dnnl_version()->major, ".",
                 dnnl_version()->minor, " has no bf16 ", what, " on this CPU (", isa_name(),
                 "); use --cpu-bf16 auto (f32 kernels where oneDNN has no bf16 ones)");
      ++bf16_fallbacks_;
    }
    return fallback();
  }

  bool bf16_ = false;  // Note [bf16 fallback on the CPU]
  CpuBf16 bf16_mode_ = CpuBf16::kAuto;
  int bf16_fallbacks_ = 0;  // ops on the fallback although oneDNN's bf16 ones were asked for
  Bf16Staging staging_{ctx_};
  std::string tuning_;  // the tuning options that are not the default, for name()
};

// Note [Fused SGD]: one pass over each span applies PyTorch's torch.optim.SGD (dampening 0):
//   g = grad_scale * grad + wd * p;  m = momentum * m + g;  d = nesterov ? g + momentum * m : m;
//   p -= lr * d.
// A zero-initialised momentum buffer makes the first step m = g, which is PyTorch's
// "buf = clone(g)" on its first step. With momentum 0 the buffer may be null: d = g.
// grad(i) is the element's gradient: one arena's, or the sum of several (sgd_update_sum).
template <class Grad>
void sgd_span(const SgdConfig& cfg, const ParamSpan& s, float* param, float* momentum, Grad grad) {
  const float lr = cfg.lr, mu = cfg.momentum, gs = cfg.grad_scale;
  const float wd = s.decay ? cfg.weight_decay : 0.0f;
  const bool nesterov = cfg.nesterov;
  const int64_t len = s.count, at = s.offset;
  float* __restrict p = param + at;
  if (momentum == nullptr) {
    in_team(len >= kParallelMin, [&] {  // Note [No team of one]
#pragma omp for simd
      for (int64_t i = 0; i < len; ++i) p[i] -= lr * (gs * grad(at + i) + wd * p[i]);
    });
    return;
  }
  float* __restrict m = momentum + at;
  in_team(len >= kParallelMin, [&] {  // Note [No team of one]
#pragma omp for simd
    for (int64_t i = 0; i < len; ++i) {
      const float g = gs * grad(at + i) + wd * p[i];
      const float mi = mu * m[i] + g;
      m[i] = mi;
      p[i] -= lr * (nesterov ? g + mu * mi : mi);
    }
  });
}

void check_sgd_config(const SgdConfig& cfg, const float* momentum) {
  DDPV_CHECK(cfg.momentum >= 0 && cfg.weight_decay >= 0 && cfg.lr >= 0,
             "sgd_update: lr, momentum and weight decay must be >= 0, got lr=", cfg.lr,
             " momentum=", cfg.momentum, " weight_decay=", cfg.weight_decay);
  DDPV_CHECK(momentum != nullptr || cfg.momentum == 0.0f, "sgd_update: momentum ", cfg.momentum,
             " needs a momentum buffer, got null");
}

// Returns how many parameters the spans cover; throws when one leaves [0, count).
int64_t check_spans(const std::vector<ParamSpan>& spans, int64_t count) {
  int64_t covered = 0;
  for (const ParamSpan& s : spans) {
    DDPV_CHECK(s.offset >= 0 && s.count >= 0 && s.offset + s.count <= count, "sgd_update: span [",
               s.offset, ", ", s.offset + s.count, ") lies outside the arena of ", count,
               " parameters");
    covered += s.count;
  }
  return covered;
}

void CpuBackend::sgd_update(const SgdConfig& cfg, const std::vector<ParamSpan>& spans,
                            int64_t count, float* param, const float* grad, float* momentum) {
  check_sgd_config(cfg, momentum);
  const int64_t covered = check_spans(spans, count);
  DDPV_CHECK(covered == count, "sgd_update: the spans cover ", covered, " of the ", count,
             " parameters; every parameter must lie in exactly one span");
  ctx_.bind_threads();
  for (const ParamSpan& s : spans)
    sgd_span(cfg, s, param, momentum, [grad](int64_t i) { return grad[i]; });
}

// Note [Shared update] (src/dist/shared_update.cpp) calls this with one arena per rank of the
// node. Two, the common case, and four get loops of their own; every count sums in the order
// of pairwise_sum.
void CpuBackend::sgd_update_sum(const SgdConfig& cfg, const std::vector<ParamSpan>& spans,
                                int64_t count, float* param, const std::vector<const float*>& grads,
                                float* momentum) {
  check_sgd_config(cfg, momentum);
  DDPV_CHECK(!grads.empty(), "sgd_update_sum: no gradient arenas to sum");
  check_spans(spans, count);
  ctx_.bind_threads();
  const float* g0 = grads[0];
  const size_t n = grads.size();
  for (const ParamSpan& s : spans) {
    if (n == 1) {
      sgd_span(cfg, s, param, momentum, [g0](int64_t i) { return g0[i]; });
    } else if (n == 2) {
      const float* g1 = grads[1];
      sgd_span(cfg, s, param, momentum, [g0, g1](int64_t i) { return g0[i] + g1[i]; });
    } else if (n == 4) {
      const float *g1 = grads[1], *g2 = grads[2], *g3 = grads[3];
      sgd_span(cfg, s, param, momentum,
               [g0, g1, g2, g3](int64_t i) { return (g0[i] + g1[i]) + (g2[i] + g3[i]); });
    } else {
      const float* const* g = grads.data();
      sgd_span(cfg, s, param, momentum, [g, n](int64_t i) { return pairwise_sum(g, n, i); });
    }
  }
}

}  // namespace

bool cpu_computes_bf16() { return isa_includes(dnnl::cpu_isa::avx512_core_bf16); }

// Note [Blocked activations] on oneDNN: 16-channel blocks where AVX-512 runs, 8 otherwise.
// Note [Channels last for AMX]: oneDNN 2.6's AMX convolutions (jit_avx512_core_amx_* forward,
// backward-data and backward-weights, and its brgemm ones) take NHWC activations only: each
// init_conf returns unimplemented unless the source is channels-last ("TODO: remove all
// support for nChw16c"). On blocks oneDNN then runs every bf16 convolution on its AVX512-BF16
// kernels and the tiles sit idle, so under bf16 on AMX the activations are NHWC. Where AVX512-
// BF16 is the widest, the blocks stay: there oneDNN's NHWC kernels, its brgemm forward
// included, are the slower ones (docs/performance.md, "bf16 on the CPU").
int preferred_activation_block(bool avx512, bool bf16_on_amx) {
  if (bf16_on_amx) return 0;
  return avx512 ? 16 : 8;
}

bool cpu_has_amx() { return isa_includes(dnnl::cpu_isa::avx512_core_amx); }

// Note [Fewer multiplications or faster ones]: AVX512-BF16 multiplies bf16 pairs at twice the
// rate of f32 FMAs and no more, so oneDNN's direct bf16 convolution does the direct method's
// multiplications at best twice as fast as f32 ones. Our f32 Winograd F(4x4, 5x5) does 6.25x
// fewer (64 per 4x4 outputs instead of 400) and our single-input-channel loops are bound by
// memory, which bf16 does not help oneDNN's kernels with (one channel pads a pair of them):
// a block on either is faster in f32 between bf16 edges (lenet: docs/performance.md, "bf16 on
// the CPU"). F(4x4, 3x3) saves 4x, which its transforms eat most of: resnet20 is faster on
// oneDNN's bf16 layers. AMX multiplies bf16 about 16x faster than f32 FMAs: oneDNN everywhere.
bool f32_block_is_faster(bool amx, ConvAlgorithm algorithm, const Conv2dConfig& conv) {
  if (amx) return false;
  if (single_channel_conv_applies(algorithm, conv)) return true;
  return conv.kernel == 5 && winograd_tile(algorithm, conv) == 4;
}

}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
  return std::make_unique<cpu::CpuBackend>(options);
}

}  // namespace ddpv
