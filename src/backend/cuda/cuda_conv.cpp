// Convolution on cuDNN: forward, backward-data and backward-filter over NHWC activations, f32 or
// bf16, with algorithms found once per shape and a private NHWC (KRSC) copy of the OIHW filter.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "backend/cuda/cuda_context.hpp"
#include "backend/cuda/cuda_kernels.hpp"
#include "backend/cuda/cuda_ops.hpp"
#include "ddpv/core/log.hpp"

namespace ddpv::cuda {
namespace {

// Note [Filter layout]: the arena holds conv weights as OIHW (PyTorch's layout), but cuDNN's
// fast NHWC kernels (tensor cores in bf16) want the filter NHWC too, i.e. (O, KH, KW, I).
// Each call transposes the filter into scratch (fused with the cast to bf16 when the precision
// is bf16), and backward-filter's result goes back through the inverse transpose, which also
// does the accumulate. Filters are small next to activations: transposing ResNet-50's 25M
// weights is a small fraction of a step.
//
// Note [Convolution algorithms]: the first call for a shape runs cudnnFind* (it times every
// algorithm, like torch.backends.cudnn.benchmark) and the choice is cached in the context under
// a key of the shape, so ResNet's repeated blocks and all later steps reuse it. Deterministic
// runs take the fastest deterministic algorithm; fp32 runs take only FMA (no TF32) algorithms so
// that they match the CPU backend; algorithms needing more than kMaxWorkspace are skipped.
//
// Note [bf16 fallback]: cuDNN's bf16 NHWC kernels are written for channel counts in multiples
// of 8; for others (an RGB stem, lenet's grey input) it may offer none. Rather than fail the
// run, such a layer switches itself to fp32 for good, with a warning naming it; every other
// layer stays bf16. The layer still reads and writes the backend's bf16 activations, through
// casts at its edges (Note [Casts at the edges]).
//
// Under bf16, x, y, dy, dx and the filter copy are bf16 with fp32 accumulation (the convolution
// descriptor's compute type); the filter gradient comes out bf16 in the KRSC copy (cuDNN's
// legacy API writes dw in x's dtype) and is widened into the fp32 arena by the transpose back.
// A bias is added in f32 to the stored output (y = round(round(conv) + b) under bf16).
constexpr size_t kMaxWorkspace = size_t{2} << 30;

template <typename Perf>
std::optional<ConvAlgo> pick_algo(const Perf* perf, int count, bool deterministic, bool fp32,
                                  const std::string& key) {
  for (int i = 0; i < count; ++i) {
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > kMaxWorkspace) continue;
    if (deterministic && p.determinism != CUDNN_DETERMINISTIC) continue;
    if (fp32 && p.mathType != CUDNN_FMA_MATH && p.mathType != CUDNN_DEFAULT_MATH) continue;
    DDPV_DEBUG("cuda conv ", key, ": algo ", static_cast<int>(p.algo), ", ", p.time, " ms, ",
               p.memory, " B workspace");
    return ConvAlgo{static_cast<int>(p.algo), fp32 ? CUDNN_FMA_MATH : p.mathType, p.memory};
  }
  return std::nullopt;
}

class CudaConv2d final : public Conv2dOp {
 public:
  CudaConv2d(std::shared_ptr<CudaContext> ctx, const Conv2dConfig& cfg)
      : ctx_(std::move(ctx)), cfg_(cfg) {
    DDPV_CHECK(cfg.in_channels > 0 && cfg.out_channels > 0 && cfg.in_h > 0 && cfg.in_w > 0 &&
                   cfg.kernel > 0 && cfg.stride > 0 && cfg.padding >= 0,
               "conv2d: channels, input size, kernel and stride must be positive and padding "
               "non-negative; got in_channels=",
               cfg.in_channels, " out_channels=", cfg.out_channels, " input ", cfg.in_h, "x",
               cfg.in_w, " kernel=", cfg.kernel, " stride=", cfg.stride, " padding=", cfg.padding);
    DDPV_CHECK(cfg.out_h() > 0 && cfg.out_w() > 0, "conv2d: kernel ", cfg.kernel,
               " does not fit the input ", cfg.in_h, "x", cfg.in_w, " with padding ", cfg.padding,
               " (output size would be <= 0); use a smaller kernel or more padding");
    set_precision(ctx_->bf16());
    DDPV_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv_desc_.get(), cfg.padding, cfg.padding,
                                                     cfg.stride, cfg.stride, 1, 1,
                                                     CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  }

  void forward(int n, ConstAct x, const float* w, const float* b, MutAct y) override {
    DDPV_CHECK(!cfg_.bias || b != nullptr, "conv2d forward: the layer has a bias but b is null");
    set_batch(n);
    const ConvAlgo& a = algo(kFwd);
    const DType c = compute_dtype();  // after algo(): Note [bf16 fallback]
    ScratchCarver sc(ctx_->scratch(ScratchCarver::round(w_count() * elem_) +
                                   staged_bytes(x.data, x.dtype, c, x_count()) +
                                   staged_bytes(y.data, y.dtype, c, y_count())));
    const cudaStream_t st = ctx_->stream();
    void* wk = sc.take(w_count() * elem_);
    const void* x_in = staged_input(x, c, x_count(), sc, st);
    void* y_out = staged_output(y, c, y_count(), sc);
    void* ws = ctx_->workspace(a.workspace);
    DDPV_CUDA_CHECK(oihw_to_ohwi(cfg_.out_channels, cfg_.in_channels, kk(), w, wk, bf16_, st));
    const float one = 1.0f, zero = 0.0f;
    DDPV_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_.get(), a.math));
    DDPV_CUDNN_CHECK(cudnnConvolutionForward(ctx_->cudnn(), &one, x_desc_.get(), x_in,
                                             w_desc_.get(), wk, conv_desc_.get(),
                                             static_cast<cudnnConvolutionFwdAlgo_t>(a.algo), ws,
                                             a.workspace, &zero, y_desc_.get(), y_out));
    if (b != nullptr) {
      DDPV_CUDA_CHECK(
          add_bias(y_count() / cfg_.out_channels, cfg_.out_channels, b, y_out, bf16_, st));
    }
    unstage_output(y_out, c, y, y_count(), st);
  }

  void backward(int n, ConstAct x, const float* w, ConstAct dy, MutAct dx, float* dw, float* db,
                bool accumulate) override {
    DDPV_CHECK(dw != nullptr, "conv2d backward: dw must not be null");
    DDPV_CHECK(!cfg_.bias || db != nullptr, "conv2d backward: the layer has a bias but db is null");
    set_batch(n);
    const ConvAlgo* bd = dx ? &algo(kBwdData) : nullptr;
    const ConvAlgo* bf = &algo(kBwdFilter);
    // A switch to fp32 in the second search (Note [bf16 fallback]) voids the first one.
    if (bd != nullptr && !have_[kBwdData]) bd = &algo(kBwdData);
    const DType c = compute_dtype();
    const size_t wbytes = ScratchCarver::round(w_count() * elem_);
    ScratchCarver sc(ctx_->scratch((bd ? wbytes : 0) + wbytes +
                                   staged_bytes(dy.data, dy.dtype, c, y_count()) +
                                   staged_bytes(x.data, x.dtype, c, x_count()) +
                                   staged_bytes(dx.data, dx.dtype, c, x_count())));
    const cudaStream_t st = ctx_->stream();
    void* wk = bd ? sc.take(w_count() * elem_) : nullptr;
    void* dwk = sc.take(w_count() * elem_);
    const void* dy_in = staged_input(dy, c, y_count(), sc, st);
    const void* x_in = staged_input(x, c, x_count(), sc, st);
    void* dx_out = staged_output(dx, c, x_count(), sc);
    const size_t ws_bytes = std::max(bd ? bd->workspace : 0, bf->workspace);
    void* ws = ctx_->workspace(ws_bytes);
    const float one = 1.0f, zero = 0.0f;
    if (bd != nullptr) {
      DDPV_CUDA_CHECK(oihw_to_ohwi(cfg_.out_channels, cfg_.in_channels, kk(), w, wk, bf16_, st));
      DDPV_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_.get(), bd->math));
      DDPV_CUDNN_CHECK(cudnnConvolutionBackwardData(
          ctx_->cudnn(), &one, w_desc_.get(), wk, y_desc_.get(), dy_in, conv_desc_.get(),
          static_cast<cudnnConvolutionBwdDataAlgo_t>(bd->algo), ws, ws_bytes, &zero, x_desc_.get(),
          dx_out));
      unstage_output(dx_out, c, dx, x_count(), st);
    }
    DDPV_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_.get(), bf->math));
    DDPV_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
        ctx_->cudnn(), &one, x_desc_.get(), x_in, y_desc_.get(), dy_in, conv_desc_.get(),
        static_cast<cudnnConvolutionBwdFilterAlgo_t>(bf->algo), ws, ws_bytes, &zero, w_desc_.get(),
        dwk));
    DDPV_CUDA_CHECK(
        ohwi_to_oihw(cfg_.out_channels, cfg_.in_channels, kk(), dwk, bf16_, dw, accumulate, st));
    if (db != nullptr) {
      DDPV_CUDA_CHECK(bias_grad(y_count() / cfg_.out_channels, cfg_.out_channels, dy.data,
                                dy.is_bf16(), db, accumulate, st));
    }
  }

 private:
  enum Direction { kFwd = 0, kBwdData = 1, kBwdFilter = 2 };

  int kk() const { return cfg_.kernel * cfg_.kernel; }
  DType compute_dtype() const { return bf16_ ? DType::kBF16 : DType::kF32; }
  int64_t x_count() const { return int64_t{n_} * cfg_.in_h * cfg_.in_w * cfg_.in_channels; }
  int64_t y_count() const { return int64_t{n_} * cfg_.out_h() * cfg_.out_w() * cfg_.out_channels; }
  int64_t w_count() const { return int64_t{cfg_.out_channels} * cfg_.in_channels * kk(); }

  // The data type of x, y and the filter as cuDNN sees them (the arena stays f32).
  void set_precision(bool bf16) {
    bf16_ = bf16;
    dtype_ = cudnn_dtype(compute_dtype());
    elem_ = bf16 ? 2 : 4;
    DDPV_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w_desc_.get(), dtype_, CUDNN_TENSOR_NHWC,
                                                cfg_.out_channels, cfg_.in_channels, cfg_.kernel,
                                                cfg_.kernel));
  }

  void set_batch(int n) {
    DDPV_CHECK(n > 0, "conv2d: batch size must be positive, got ", n);
    if (n == n_) return;
    DDPV_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x_desc_.get(), CUDNN_TENSOR_NHWC, dtype_, n,
                                                cfg_.in_channels, cfg_.in_h, cfg_.in_w));
    DDPV_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y_desc_.get(), CUDNN_TENSOR_NHWC, dtype_, n,
                                                cfg_.out_channels, cfg_.out_h(), cfg_.out_w()));
    int on = 0, oc = 0, oh = 0, ow = 0;
    DDPV_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(conv_desc_.get(), x_desc_.get(),
                                                           w_desc_.get(), &on, &oc, &oh, &ow));
    DDPV_CHECK(oh == cfg_.out_h() && ow == cfg_.out_w(), "conv2d: cuDNN output ", oh, "x", ow,
               " differs from the configured ", cfg_.out_h(), "x", cfg_.out_w());
    n_ = n;
    for (bool& h : have_) h = false;
  }

  std::string key(Direction d) const {
    static const char* const kNames[] = {"fwd", "bwd-data", "bwd-filter"};
    return detail::concat(kNames[d], " n", n_, " c", cfg_.in_channels, " ", cfg_.in_h, "x",
                          cfg_.in_w, " k", cfg_.out_channels, " r", cfg_.kernel, " s", cfg_.stride,
                          " p", cfg_.padding, bf16_ ? " bf16" : " fp32",
                          ctx_->deterministic() ? " det" : "");
  }

  const ConvAlgo& algo(Direction d) {
    if (have_[d]) return algos_[d];
    const std::string k = key(d);
    if (const ConvAlgo* cached = ctx_->cached_algo(k)) {
      algos_[d] = *cached;
    } else if (std::optional<ConvAlgo> found = find(d)) {
      algos_[d] = *found;
      ctx_->cache_algo(k, algos_[d]);
    } else if (bf16_) {  // Note [bf16 fallback]
      DDPV_WARN("cuDNN has no bf16 algorithm for convolution ", k,
                ": this layer computes in fp32 from now on");
      set_precision(false);
      const int n = n_;
      n_ = -1;
      set_batch(n);  // describes x and y in fp32 and forgets the bf16 choices
      return algo(d);
    } else {
      DDPV_FAIL("cuDNN has no usable algorithm for convolution ", k,
                ctx_->deterministic() ? " in deterministic mode (try without --deterministic)"
                                      : "");
    }
    have_[d] = true;
    return algos_[d];
  }

  std::optional<ConvAlgo> find(Direction d) {
    const bool fp32 = !bf16_, det = ctx_->deterministic();
    const std::string k = key(d);
    DDPV_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_.get(),
                                                 fp32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
    int found = 0;
    if (d == kFwd) {
      cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      DDPV_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(
          ctx_->cudnn(), x_desc_.get(), w_desc_.get(), conv_desc_.get(), y_desc_.get(),
          CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &found, perf));
      return pick_algo(perf, found, det, fp32, k);
    }
    if (d == kBwdData) {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      DDPV_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(
          ctx_->cudnn(), w_desc_.get(), y_desc_.get(), conv_desc_.get(), x_desc_.get(),
          CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &found, perf));
      return pick_algo(perf, found, det, fp32, k);
    }
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    DDPV_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(
        ctx_->cudnn(), x_desc_.get(), y_desc_.get(), conv_desc_.get(), w_desc_.get(),
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &found, perf));
    return pick_algo(perf, found, det, fp32, k);
  }

  std::shared_ptr<CudaContext> ctx_;
  Conv2dConfig cfg_;
  bool bf16_ = false;  // this layer's precision (Note [bf16 fallback])
  cudnnDataType_t dtype_ = CUDNN_DATA_FLOAT;
  size_t elem_ = 4;
  TensorDesc x_desc_, y_desc_;
  FilterDesc w_desc_;
  ConvDesc conv_desc_;
  int n_ = -1;
  ConvAlgo algos_[3];
  bool have_[3] = {false, false, false};
};

}  // namespace

std::unique_ptr<Conv2dOp> make_conv2d(std::shared_ptr<CudaContext> ctx, const Conv2dConfig& cfg) {
  return std::make_unique<CudaConv2d>(std::move(ctx), cfg);
}

}  // namespace ddpv::cuda
