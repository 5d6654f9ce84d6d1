// The backend-neutral op set: every layer computes through these interfaces, never through a
// vendor library directly. One implementation per device: src/backend/cpu (oneDNN) and
// src/backend/cuda (cuDNN, cuBLAS, own kernels). All pointers are memory of the backend's device;
// activations are NHWC (or channel-blocked where the backend prefers it, Note [Blocked
// activations]), conv weights OIHW, linear weights (out, in): PyTorch's layouts.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ddpv/core/choice.hpp"
#include "ddpv/core/tensor.hpp"

namespace ddpv {

enum class Precision : uint8_t { kF32, kBF16, kF16 };
std::span<const ChoiceWord<Precision>> choices(Precision);  // fp32 | bf16 | fp16 (Note [Choices])
Precision parse_precision(const std::string& name);          // throws on an unknown name
const char* precision_name(Precision p);

// Note [Activation dtype]: activations and their gradients travel between layers in the
// backend's activation dtype (Backend::activation_dtype(): f32, or bf16 under --precision bf16
// on either backend), the way AMP keeps them; parameters, their gradients, BatchNorm's statistics,
// scale and shift, the optimizer's state and the loss stay f32. An op is handed its
// activations as typed views: ConstAct (read) and MutAct (written). A view converts implicitly
// from a float pointer (an f32 view), so fp32 callers pass pointers as before; an op reads a
// view's elements through f32() or bf16(), which check the dtype (an op given a dtype it does
// not take is an internal error, not a silent reinterpretation). The model's input is f32
// (the loader's batch) whatever the activation dtype, so an op's dtypes may differ between
// its input and its output.
struct ConstAct {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  ConstAct() = default;
  ConstAct(std::nullptr_t) {}            // NOLINT: implicit, as a null pointer
  ConstAct(const float* p) : data(p) {}  // NOLINT: implicit, an f32 view
  ConstAct(const void* p, DType t) : data(p), dtype(t) {}
  explicit operator bool() const { return data != nullptr; }
  bool is_bf16() const { return dtype == DType::kBF16; }
  // The elements as f32 or bf16; null for a null view whatever its dtype.
  const float* f32() const {
    DDPV_CHECK(data == nullptr || dtype == DType::kF32, "an op was handed ", dtype_name(dtype),
               " activations where it reads f32 (internal)");
    return static_cast<const float*>(data);
  }
  const uint16_t* bf16() const {
    DDPV_CHECK(data == nullptr || dtype == DType::kBF16, "an op was handed ", dtype_name(dtype),
               " activations where it reads bf16 (internal)");
    return static_cast<const uint16_t*>(data);
  }
};
struct MutAct {
  void* data = nullptr;
  DType dtype = DType::kF32;
  MutAct() = default;
  MutAct(std::nullptr_t) {}      // NOLINT: implicit, as a null pointer
  MutAct(float* p) : data(p) {}  // NOLINT: implicit, an f32 view
  MutAct(void* p, DType t) : data(p), dtype(t) {}
  operator ConstAct() const { return {data, dtype}; }  // NOLINT: a written view is readable
  explicit operator bool() const { return data != nullptr; }
  bool is_bf16() const { return dtype == DType::kBF16; }
  float* f32() const { return const_cast<float*>(ConstAct(*this).f32()); }
  uint16_t* bf16() const { return const_cast<uint16_t*>(ConstAct(*this).bf16()); }
};
// Views of a tensor's memory in its own dtype (null for an undefined tensor).
inline ConstAct cact(const Tensor& t) { return {t.raw(), t.dtype()}; }
inline MutAct mact(const Tensor& t) { return {t.raw(), t.dtype()}; }

// Note [Blocked activations]: oneDNN's convolutions run faster on channel-blocked activations,
// (N, C/b, H, W, b) with b = 8 on AVX2 and 16 on AVX-512 (oneDNN's nChw8c / nChw16c), than on
// NHWC, in every convolution direction for resnet20's shapes (docs/performance.md, CPU engine).
// A backend names the block it prefers (Backend::activation_block(), 0 for none); a layer whose
// channel count the block divides keeps its output in that layout and tells its ops so through
// the `block` fields below (0 = NHWC). Since layers decide from their channel counts alone, a
// whole network stays blocked from its first such layer on, and no op converts anything;
// elementwise ops do not care. What enters the model (NHWC from the loader) is converted when
// its channel count is a multiple of the block, and Flatten turns either layout into PyTorch's
// (C, H, W) order. The CUDA backend prefers NHWC (block 0): cuDNN's fast kernels want it.
inline int block_for(int channels, int preferred) {
  return preferred > 0 && channels % preferred == 0 ? preferred : 0;
}

// ---- op configurations (fixed per layer; the batch size n is given per call) ----------------

struct Conv2dConfig {
  int in_channels = 0, out_channels = 0;
  int in_h = 0, in_w = 0;  // input spatial size
  int kernel = 3, stride = 1, padding = 0;
  bool bias = false;
  int in_block = 0, out_block = 0;  // layouts of x and y (Note [Blocked activations])
  // 0 when the kernel does not fit (integer division would truncate -1/2 up to 0).
  int out_h() const {
    return in_h + 2 * padding < kernel ? 0 : (in_h + 2 * padding - kernel) / stride + 1;
  }
  int out_w() const {
    return in_w + 2 * padding < kernel ? 0 : (in_w + 2 * padding - kernel) / stride + 1;
  }
};

struct BatchNormConfig {
  int channels = 0, h = 0, w = 0;
  float eps = 1e-5f;
  float momentum = 0.1f;  // PyTorch convention: running = (1 - m) * running + m * batch
  int block = 0;          // layout of x and y (Note [Blocked activations])
};

enum class PoolKind : uint8_t { kMax, kAvg, kGlobalAvg };
struct Pool2dConfig {
  PoolKind kind = PoolKind::kMax;
  int channels = 0, in_h = 0, in_w = 0;
  int kernel = 2, stride = 2, padding = 0;  // ignored for kGlobalAvg
  int block = 0;                            // layout of x and y (Note [Blocked activations])
  int out_h() const {
    return kind == PoolKind::kGlobalAvg  ? 1
           : in_h + 2 * padding < kernel ? 0
                                         : (in_h + 2 * padding - kernel) / stride + 1;
  }
  int out_w() const {
    return kind == PoolKind::kGlobalAvg  ? 1
           : in_w + 2 * padding < kernel ? 0
                                         : (in_w + 2 * padding - kernel) / stride + 1;
  }
};

struct LinearConfig {
  int in_features = 0, out_features = 0;
  bool bias = true;
};

// ---- ops: created once per layer, primitives built once per batch size and reused ----------
// An op object serves one layer: a backward uses what the last forward of the same batch size
// on the same object kept (batch statistics, max-pool workspace, probabilities).

class Conv2dOp {
 public:
  virtual ~Conv2dOp() = default;
  // x: (N, H, W, Cin)  w: (Cout, Cin, K, K)  b: (Cout) or null  ->  y: (N, OH, OW, Cout)
  virtual void forward(int n, ConstAct x, const float* w, const float* b, MutAct y) = 0;
  // dy: (N, OH, OW, Cout) -> dx: (N, H, W, Cin) (null: not needed), dw: (Cout, Cin, K, K),
  // db: (Cout) (null when no bias). accumulate: add to dw/db instead of overwriting them.
  virtual void backward(int n, ConstAct x, const float* w, ConstAct dy, MutAct dx, float* dw,
                        float* db, bool accumulate) = 0;
  // How the op computes, for logs and tests: "direct", "winograd F(4x4,5x5)", ...
  virtual std::string algorithm() const { return "direct"; }
};

class BatchNormOp {
 public:
  virtual ~BatchNormOp() = default;
  // Training: normalise with the batch statistics, keep them for backward, and update the
  // running statistics (unbiased variance, as PyTorch). x, y: (N, H, W, C); others: (C).
  virtual void forward_train(int n, ConstAct x, const float* gamma, const float* beta, MutAct y,
                             float* running_mean, float* running_var) = 0;
  virtual void forward_infer(int n, ConstAct x, const float* gamma, const float* beta,
                             const float* running_mean, const float* running_var, MutAct y) = 0;
  // Backward of the last forward_train. dx: (N, H, W, C); dgamma, dbeta: (C).
  virtual void backward(int n, ConstAct x, const float* gamma, ConstAct dy, MutAct dx,
                        float* dgamma, float* dbeta, bool accumulate) = 0;
};

class Pool2dOp {
 public:
  virtual ~Pool2dOp() = default;
  // x: (N, H, W, C) -> y: (N, OH, OW, C). Max pooling keeps what backward needs.
  virtual void forward(int n, ConstAct x, MutAct y) = 0;
  // dy: (N, OH, OW, C) -> dx: (N, H, W, C), of the last forward.
  virtual void backward(int n, ConstAct dy, MutAct dx) = 0;
};

// Note [Fused blocks]: a chain conv -> [batchnorm] -> [+ residual] -> [relu] -> [max pool],
// the shape of every convolution of the model zoo with what follows it, that a backend may
// compute as one op: fewer passes over the activations, the ReLU applied where the value is
// already in a register, the pooling taken from the tile that was just written, the batch
// statistics summed while the output is formed. A backend that has no such op for a chain
// declines it (Backend::fused_block returns null) and nn runs the plain ops one layer at a
// time; the two compute the same to rounding (ModelTest.FusedLayersComputeWhatSeparateLayers-
// Compute). Which fusions the op applies is its own business; describe_*() say which.
struct FusedBlockConfig {
  Conv2dConfig conv;
  bool batch_norm = false;
  BatchNormConfig bn;         // with batch_norm: the BatchNorm of the convolution's output
  bool add_residual = false;  // y = relu(bn(conv(x)) + residual): needs batch_norm and relu
  bool relu = false;
  bool max_pool = false;
  Pool2dConfig pool;            // with max_pool: a max pooling of the ReLU's output
  bool add_input_grad = false;  // asks backward to add dx (Note [Input gradient added])
};

// The layer's tensors, in the arenas (nulls for the parts the block lacks).
struct FusedBlockParams {
  const float* w = nullptr;
  const float* b = nullptr;
  const float* gamma = nullptr;
  const float* beta = nullptr;
  float* running_mean = nullptr;
  float* running_var = nullptr;
  float* dw = nullptr;
  float* db = nullptr;
  float* dgamma = nullptr;
  float* dbeta = nullptr;
};

class FusedBlockOp {
 public:
  virtual ~FusedBlockOp() = default;
  // Floats per sample that forward keeps for backward besides x and y (`saved`), and that
  // backward may use for gradients between the stages (`scratch`); the caller owns both,
  // and may share the scratch with other blocks that never run backward at the same time.
  virtual int64_t saved_per_sample() const = 0;
  virtual int64_t scratch_per_sample() const = 0;
  // True if backward adds the input gradient to what dx holds (asked by add_input_grad).
  virtual bool adds_input_grad() const { return false; }
  // x: the convolution's input -> y: the block's output; residual: shaped as the output
  // (with add_residual, else null). Training uses and updates the batch statistics. x, the
  // residual, y, dy and dx are activations in the backend's dtype (Note [Activation dtype]; x
  // may be the model's f32 input); `saved` and `scratch` are the block's own f32 buffers.
  virtual void forward(int n, bool training, ConstAct x, const FusedBlockParams& p,
                       ConstAct residual, float* saved, MutAct y) = 0;
  // Backward of the last training forward: dy is the gradient of y or, with add_residual,
  // of the sum before the ReLU (the caller, which owns the shortcut, applies that ReLU's
  // backward once for both branches). dx: null when not needed. accumulate: add to the
  // parameter gradients.
  virtual void backward(int n, ConstAct x, const FusedBlockParams& p, const float* saved,
                        ConstAct y, ConstAct dy, float* scratch, MutAct dx, bool accumulate) = 0;
  // For the layer list: how the convolution computes and what it took in ("winograd
  // F(4x4,5x5), + relu, + maxpool"), and what the BatchNorm and the pooling took in
  // ("+ relu, statistics from the convolution"; "+ relu backward"; empty for nothing).
  virtual std::string describe_conv() const = 0;
  virtual std::string describe_batch_norm() const { return ""; }
  virtual std::string describe_pool() const { return ""; }
};

class LinearOp {
 public:
  virtual ~LinearOp() = default;
  // x: (N, in)  w: (out, in)  b: (out) or null  ->  y: (N, out)
  virtual void forward(int n, ConstAct x, const float* w, const float* b, MutAct y) = 0;
  // dy: (N, out) -> dx: (N, in) (null: not needed), dw: (out, in), db: (out) or null.
  virtual void backward(int n, ConstAct x, const float* w, ConstAct dy, MutAct dx, float* dw,
                        float* db, bool accumulate) = 0;
};

struct LossResult {
  double loss_sum = 0;  // sum over the batch of -log softmax(logits)[label]
  int64_t correct = 0;  // samples whose arg-max equals the label
};

class SoftmaxCrossEntropyOp {
 public:
  virtual ~SoftmaxCrossEntropyOp() = default;
  // logits: (N, K), labels: (N) in [0, K). Keeps the probabilities for backward.
  // Returns on the host (a GPU backend synchronises here).
  virtual LossResult forward(int n, ConstAct logits, const int32_t* labels) = 0;
  // dlogits: (N, K) = (softmax - onehot(label)) * scale; scale = 1/N gives the batch mean.
  virtual void backward(int n, const int32_t* labels, MutAct dlogits, float scale) = 0;
};

struct SgdConfig {
  float lr = 0.1f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  float grad_scale = 1.0f;  // folded-in gradient averaging (1 / (world size * accum steps))
};

// Element i of the sum of n arenas, summed pairwise: halves of power-of-two sizes from the left,
// ((g0 + g1) + (g2 + g3)) + (g4 + g5) for six. It is the order of Open MPI's recursive doubling
// for a power-of-two count: the shared update of 4 ranks on one node gives the parameters of
// 2 nodes x 2 ranks (the multi-host test) and, as measured, of Open MPI's 4-rank allreduce;
// and its rounding grows with log2(n), not n. No arenas sum to 0.
inline float pairwise_sum(const float* const* g, size_t n, int64_t i) {
  float stack[64];  // partial sums of the sizes of n's binary digits, largest first
  stack[0] = 0.0f;
  int top = 0;
  for (size_t k = 0; k < n; ++k) {
    stack[top++] = g[k][i];
    for (size_t done = k + 1; (done & 1) == 0; done >>= 1, --top) stack[top - 2] += stack[top - 1];
  }
  while (top > 1) {
    stack[top - 2] += stack[top - 1];
    --top;
  }
  return stack[0];
}

// A run of the flat arena with one weight-decay setting (BatchNorm parameters and biases
// are not decayed).
struct ParamSpan {
  int64_t offset = 0, count = 0;
  bool decay = true;
};

// Note [Batch uploads]: input batches go to a GPU on a copy stream of their own, so that the
// next batch uploads while the current step computes. The memory involved comes in slots (a
// device buffer and the pinned host batch it is filled from); for each use of a slot the caller
//   copy(slot, ...) ... commit(slot)  queues the uploads; they start once compute has released
//                                      the slot (its last reader is done), never before;
//   acquire(slot)                      makes compute queued after it wait for the uploads (the
//                                      host does not block);
//   ... queues the compute that reads the slot ...
//   release(slot)                      marks compute queued so far as the slot's last reader;
//   host_done(slot)                    blocks the host until the slot's uploads have finished,
//                                      before the host batch is reused.
// A backend whose device reads host memory directly (the CPU) has no upload stream.
class UploadStream {
 public:
  virtual ~UploadStream() = default;
  virtual int slots() const = 0;
  virtual void copy(int slot, void* device_dst, const void* host_src, size_t bytes) = 0;
  virtual void commit(int slot) = 0;
  virtual void acquire(int slot) = 0;
  virtual void release(int slot) = 0;
  virtual void host_done(int slot) = 0;
};

enum class ConvAlgorithm : uint8_t {
  kAuto,      // the backend picks per layer
  kDirect,    // the library's direct convolution everywhere
  kWinograd,  // Winograd wherever the layer allows it (stride 1, 3x3 or 5x5, ...)
};
std::span<const ChoiceWord<ConvAlgorithm>> choices(ConvAlgorithm);  // auto | direct | winograd

// CPU, under --precision bf16: what computes the layers (Note [bf16 on oneDNN]).
enum class CpuBf16 : uint8_t {
  kAuto,      // oneDNN's bf16 primitives where the CPU computes in bf16, else the fallback
  kOneDnn,    // oneDNN's bf16 primitives wherever oneDNN creates them, on any of its kernels
  kFallback,  // f32 kernels between bf16 activations (Note [bf16 fallback on the CPU])
};
std::span<const ChoiceWord<CpuBf16>> choices(CpuBf16);  // auto | onednn | fallback

// CUDA: which cuDNN functions BatchNorm runs on (Note [BatchNorm on cuDNN]).
enum class BatchNormPath : uint8_t {
  kEx,      // cudnnBatchNormalization*Ex, NHWC persistent kernels where cuDNN has them
  kLegacy,  // the plain cudnnBatchNormalizationForwardTraining / Backward
};
std::span<const ChoiceWord<BatchNormPath>> choices(BatchNormPath);  // ex | legacy

struct BackendOptions {
  Device device = Device::kCpu;
  int device_index = 0;  // GPU ordinal (the rank's node-local rank)
  int threads = 0;       // CPU threads per rank; 0 = the runtime's default
  Precision precision = Precision::kF32;
  bool deterministic = false;
  // Note [Tuning options]: the switches below exist for comparisons and for ruling a fast
  // path out when results look wrong; ddpv-train sets them from --cpu-layout, --cpu-conv,
  // --no-fuse and --cuda-bn (or a config file), and the backend's name() lists any that is
  // not the default. The library reads no environment variable for them.
  // CPU: the activation block (Note [Blocked activations]); -1 = the ISA's, 0 = NHWC.
  int activation_block = -1;
  // CPU: how stride-1 3x3 and 5x5 convolutions compute (Note [Winograd convolution]); kAuto
  // picks per layer.
  ConvAlgorithm conv_algorithm = ConvAlgorithm::kAuto;
  // CPU: compute chains of layers as fused blocks (Note [Fused blocks]; docs/architecture.md,
  // "Layer fusion"); false declines every block, so every layer runs on its own.
  bool fuse_layers = true;
  // CPU: what computes the layers under Precision::kBF16 (Note [bf16 on oneDNN]).
  CpuBf16 cpu_bf16 = CpuBf16::kAuto;
  // CUDA: BatchNorm's cuDNN functions.
  BatchNormPath cuda_batchnorm = BatchNormPath::kEx;
};

class LayerProfile;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;

  // Note [Layer profile]: the profile that timed scopes on this backend add to (ProfileScope,
  // in nn); null, the default, times nothing. The caller owns it and keeps it alive while set.
  void set_profile(LayerProfile* profile) { profile_ = profile; }
  LayerProfile* profile() const { return profile_; }

  virtual std::string name() const = 0;  // "cpu (oneDNN 2.6.3, 1 thread)"

  // Memory of the device, and host memory fit for fast copies to it (pinned on a GPU).
  virtual Allocator* allocator() = 0;
  virtual Allocator* staging_allocator() = 0;
  // Copies between any two of {host, this device}; ordered with the backend's compute.
  virtual void copy(void* dst, Device dst_device, const void* src, Device src_device,
                    size_t bytes) = 0;
  // Waits until everything queued on the device has finished (a no-op on CPU).
  virtual void synchronize() = 0;
  // An upload stream with `slots` slots (Note [Batch uploads]); null when the device reads host
  // memory directly, as the CPU does.
  virtual std::unique_ptr<UploadStream> upload_stream(int /*slots*/) { return nullptr; }
  // The native compute stream (cudaStream_t on CUDA, null on CPU), for communicators that
  // order their launches after compute (see Note [Stream-ordered collectives] in dist).
  virtual void* native_stream() { return nullptr; }

  virtual std::unique_ptr<Conv2dOp> conv2d(const Conv2dConfig& cfg) = 0;
  virtual std::unique_ptr<BatchNormOp> batchnorm2d(const BatchNormConfig& cfg) = 0;
  virtual std::unique_ptr<Pool2dOp> pool2d(const Pool2dConfig& cfg) = 0;
  virtual std::unique_ptr<LinearOp> linear(const LinearConfig& cfg) = 0;
  virtual std::unique_ptr<SoftmaxCrossEntropyOp> softmax_cross_entropy(int classes) = 0;
  // Note [Fused blocks]: the chain as one op, or null where this backend declines it.
  virtual std::unique_ptr<FusedBlockOp> fused_block(const FusedBlockConfig& /*cfg*/) {
    return nullptr;
  }

  // Elementwise ops over `count` floats; outputs may alias inputs (in-place use is allowed).
  // relu_backward uses y > 0 as the mask, so y may be the forward output kept in place of x.
  // Activations in any dtype the backend's activations take (Note [Activation dtype]).
  virtual void relu_forward(int64_t count, ConstAct x, MutAct y) = 0;
  virtual void relu_backward(int64_t count, ConstAct y, ConstAct dy, MutAct dx) = 0;
  virtual void add(int64_t count, ConstAct a, ConstAct b, MutAct y) = 0;  // y = a + b
  // y = relu(a + b), a residual block's output; one pass where the backend has it (the CPU's,
  // unless BackendOptions::fuse_layers is off).
  virtual void add_relu(int64_t count, ConstAct a, ConstAct b, MutAct y) {
    add(count, a, b, y);
    relu_forward(count, y, y);
  }
  virtual void fill(int64_t count, float value, float* y) = 0;
  virtual void scale(int64_t count, float alpha, float* y) = 0;  // y *= alpha
  // f32 <-> bf16 over `count` elements, rounding to nearest even as ddpv::f32_to_bf16 does
  // (gradients reduced in bf16, --reduce-dtype bf16). y must not alias x.
  virtual void cast_to_bf16(int64_t count, const float* x, uint16_t* y) = 0;
  virtual void cast_from_bf16(int64_t count, const uint16_t* x, float* y) = 0;
  // True when no element is NaN or +-Inf.
  virtual bool all_finite(int64_t count, const float* x) = 0;
  // Layout changes of (N, H, W, C) activations between NCHW (kNchw), NHWC (0) and blocked (b):
  // for Flatten, whose output must follow PyTorch's (C, H, W) order so that a following linear
  // layer's weight maps 1:1 onto torch, and for a model input that must become blocked. y must
  // not alias x. The CUDA backend converts between NHWC and NCHW only.
  static constexpr int kNchw = -1;
  virtual void relayout(int n, int h, int w, int c, int from, int to, ConstAct x, MutAct y) = 0;
  // The activation block this backend prefers (Note [Blocked activations]); 0: NHWC.
  virtual int activation_block() const { return 0; }
  // The dtype of activations and their gradients between layers (Note [Activation dtype]).
  virtual DType activation_dtype() const { return DType::kF32; }
  // What the user should be told once about how this backend will run (a slow path taken,
  // say), or empty; ddpv-train prints it as a warning on rank 0.
  virtual std::string caveat() const { return {}; }

  // One fused SGD step over the flat arena, PyTorch semantics (spans cover [0, count) exactly
  // once; momentum may be null only when cfg.momentum == 0):
  //   g = grad_scale * grad + wd * p   (wd = 0 outside decayed spans)
  //   m = momentum * m + g;  d = nesterov ? g + momentum * m : m;  p -= lr * d
  virtual void sgd_update(const SgdConfig& cfg, const std::vector<ParamSpan>& spans, int64_t count,
                          float* param, const float* grad, float* momentum) = 0;
  // The same step on part of the arena, with the gradient summed from several arenas of the
  // same layout in the order of pairwise_sum (Note [Shared update]). The spans lie inside
  // [0, count) without overlapping and cover only the part to update. Host memory only: the
  // CPU backend implements it, the others throw.
  virtual void sgd_update_sum(const SgdConfig& cfg, const std::vector<ParamSpan>& spans,
                              int64_t count, float* param, const std::vector<const float*>& grads,
                              float* momentum);

 private:
  LayerProfile* profile_ = nullptr;
};

// The registry: the one place that knows which backends were compiled in.
std::unique_ptr<Backend> make_backend(const BackendOptions& options);
bool cuda_backend_compiled();
int cuda_device_count();  // 0 when the CUDA backend is not compiled or no GPU is visible
// --device: a device, or auto (a GPU when one is visible).
enum class DeviceChoice : uint8_t { kAuto, kCpu, kCuda };
std::span<const ChoiceWord<DeviceChoice>> choices(DeviceChoice);  // auto | cpu | cuda
// The device a choice runs on, with a clear error when cuda is unavailable.
Device resolve_device(DeviceChoice choice);

}  // namespace ddpv
