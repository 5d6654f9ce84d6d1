// Private to the CPU backend: factories of the op objects, one per op-family file.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cpu/dnnl_check.hpp"
#include "backend/f32_ops.hpp"
#include "ddpv/backend/backend.hpp"

namespace ddpv::cpu {

// The CPU's op kernels compute on f32 activations (backend/f32_ops.hpp); bf16 activations
// reach oneDNN's bf16 primitives (Note [bf16 on oneDNN]) or, where those are not used, the f32
// kernels through the fallback's adapters (Note [bf16 fallback on the CPU]).
//
// The CPU ops with what their kernels can take in from their neighbours. Only the CPU's fused
// blocks (fused_block.cpp, Note [Fused blocks]) ask for these; a layer sees plain ops.
class FusableConv : public F32Conv2dOp {
 public:
  // Note [Input gradient added]: asks backward and backward_pooled to add the input gradient
  // to what dx holds instead of overwriting it; true if they will from now on.
  virtual bool add_input_grad() { return false; }
  // Note [Batch statistics from the convolution]: asks forward to write, into sums (2 x Cout
  // doubles that outlive the op), the sum of y over images and positions per output channel,
  // then the sum of its squares; true if every forward will from now on (forward_pooled
  // writes none). Null sums stop it again (evaluation, where they would go unread).
  virtual bool write_batch_stats(double* /*sums*/) { return false; }
  // Note [Fused ReLU]: asks forward to write max(0, y) (NaN kept, -0 as +0: the ReLU op's
  // rule) where it can do so for free; true if it will. Backward is unchanged: dy is still the
  // gradient of the convolution's own output (the ReLU's backward has masked it).
  virtual bool fuse_relu() { return false; }
  // Note [Max pooling fused into the convolution]: after fuse_relu(), asks for forward_pooled
  // with a kernel x kernel, stride-kernel max pooling of the rectified output; true if the op
  // has it. forward_pooled writes the pooling's output (N, OH / k, OW / k, Cout) in y's layout
  // and the window positions as Pool2dOp::positions_for wants them, not y itself.
  virtual bool fuse_max_pool(int /*kernel*/) { return false; }
  virtual void forward_pooled(int /*n*/, const float* /*x*/, const float* /*w*/, const float* /*b*/,
                              float* /*pooled*/, int32_t* /*positions*/) {
    DDPV_FAIL("this convolution has no fused max pooling (internal: fuse_max_pool said no)");
  }
  // Note [Pooled weight gradient]: backward of the last forward_pooled, from the pooling's
  // output gradient dpooled (N, OH / k, OW / k, Cout) and the positions that forward recorded:
  // what backward gives for the dy that the pooling's backward (ReLU's folded) would give.
  virtual void backward_pooled(int /*n*/, const float* /*x*/, const float* /*w*/,
                               const float* /*dpooled*/, const int32_t* /*positions*/,
                               float* /*dx*/, float* /*dw*/, float* /*db*/, bool /*accumulate*/) {
    DDPV_FAIL("this convolution has no fused max pooling (internal: fuse_max_pool said no)");
  }
};

class FusableBatchNorm : public F32BatchNormOp {
 public:
  // Note [BatchNorm + ReLU]: asks both forwards to write max(0, y) and backward to take dy as
  // the gradient of that rectified output (applying the ReLU's backward itself). True if it
  // will. A channel whose batch statistics are not finite comes out as NaN, as unfused.
  virtual bool fuse_relu() { return false; }
  // Note [Batch statistics from the convolution]: 2 x channels doubles that the op writing x
  // may fill in each of its forwards (Conv2dOp::write_batch_stats); null if this op cannot
  // take its statistics from there. After take_given_stats(), forward_train normalises with
  // the statistics computed from them instead of reading x for its own.
  virtual double* given_stats() { return nullptr; }
  virtual void take_given_stats() {}
  virtual bool takes_given_stats() const { return false; }
  // Note [BatchNorm + residual]: y = max(0, the normalisation of x + other), NaN kept as the
  // add_relu op keeps it, in one pass: in training with the statistics given (and the running
  // statistics updated as forward_train does), else with the running ones. fuse_add_relu() is
  // true if the op has it; backward is then that of the normalisation alone.
  virtual bool fuse_add_relu() { return false; }
  virtual void forward_add_relu(int /*n*/, bool /*training*/, const float* /*x*/,
                                const float* /*gamma*/, const float* /*beta*/,
                                const float* /*other*/, float* /*y*/, float* /*running_mean*/,
                                float* /*running_var*/) {
    DDPV_FAIL("this BatchNorm adds no residual (internal: fuse_add_relu said no)");
  }
};

class FusablePool : public F32Pool2dOp {
 public:
  // Note [ReLU folded into max pooling]: for a pooling whose input is a ReLU's output, asks
  // backward to apply that ReLU's backward too (dx zero where the window's maximum is not
  // positive), so the ReLU's own backward pass can be skipped. True if it will; forwards
  // from then on record what it needs.
  virtual bool fold_relu_backward() { return false; }
  // Note [Max pooling fused into the convolution]: for a max pooling whose windows tile the
  // input and that folds its ReLU, readies the record of window positions for a forward of n
  // images (one int32 per output element, in the output's layout: the first largest of the
  // window in row-major order, -1 where the maximum is not positive) and returns it; a fused
  // producer writes it and the output, and backward then runs as after forward. Null where
  // this pooling cannot be fused.
  virtual int32_t* positions_for(int /*n*/) { return nullptr; }
};

// f32 <-> bf16 over arrays, rounding to nearest even (f32_to_bf16), on the OpenMP team where
// the count is worth it (bf16_fallback.cpp).
void bf16_to_f32_array(int64_t count, const uint16_t* x, float* y);
void f32_to_bf16_array(int64_t count, const float* x, uint16_t* y);

// Note [bf16 fallback on the CPU]: bf16_fallback.cpp. The grow-only f32 buffers that every
// adapter of one backend shares.
class Bf16Staging {
 public:
  explicit Bf16Staging(const CpuContext& ctx) : ctx_(ctx) {}
  // f32 elements of `a`: a itself when it is f32 (or null), else a copy in buffer k.
  const float* in(int k, ConstAct a, int64_t count) {
    if (!a.is_bf16() || a.data == nullptr) return a.f32();
    float* f = buffer(k, count);
    bf16_to_f32_array(count, a.bf16(), f);
    return f;
  }
  // Where an op writes the f32 elements of `a`: a itself when it is f32 (or null), else
  // buffer k, which finish() then rounds into a.
  float* out(int k, MutAct a, int64_t count) {
    if (!a.is_bf16() || a.data == nullptr) return a.f32();
    return buffer(k, count);
  }
  void finish(int k, MutAct a, int64_t count) {
    if (a.is_bf16() && a.data != nullptr)
      f32_to_bf16_array(count, buffers_[static_cast<size_t>(k)].data(), a.bf16());
  }
  // bf16 elements of `a`: a itself when it is bf16 (or null), else its f32 values rounded
  // into a bf16 buffer of this staging's (for oneDNN's bf16 ops handed the model's f32 input).
  const uint16_t* as_bf16(ConstAct a, int64_t count) {
    if (a.is_bf16() || a.data == nullptr) return a.bf16();
    if (bf16_.size() < static_cast<size_t>(count)) bf16_.resize(static_cast<size_t>(count));
    f32_to_bf16_array(count, a.f32(), bf16_.data());
    return bf16_.data();
  }
  void bind_threads() const { ctx_.bind_threads(); }

 private:
  float* buffer(int k, int64_t count) {
    std::vector<float>& b = buffers_[static_cast<size_t>(k)];
    if (b.size() < static_cast<size_t>(count)) b.resize(static_cast<size_t>(count));
    return b.data();
  }

  const CpuContext& ctx_;
  std::array<std::vector<float>, 4> buffers_;
  std::vector<uint16_t> bf16_;
};

// Each wraps an f32 op of the same configuration: it hands the op f32 copies of its bf16
// inputs and rounds the op's f32 outputs into the bf16 ones, through `staging`.
std::unique_ptr<Conv2dOp> bf16_fallback(std::unique_ptr<Conv2dOp> op, const Conv2dConfig& cfg,
                                        Bf16Staging& staging);
std::unique_ptr<BatchNormOp> bf16_fallback(std::unique_ptr<BatchNormOp> op,
                                           const BatchNormConfig& cfg, Bf16Staging& staging);
std::unique_ptr<Pool2dOp> bf16_fallback(std::unique_ptr<Pool2dOp> op, const Pool2dConfig& cfg,
                                        Bf16Staging& staging);
std::unique_ptr<LinearOp> bf16_fallback(std::unique_ptr<LinearOp> op, const LinearConfig& cfg,
                                        Bf16Staging& staging);
std::unique_ptr<SoftmaxCrossEntropyOp> bf16_fallback(std::unique_ptr<SoftmaxCrossEntropyOp> op,
                                                     int classes, Bf16Staging& staging);
// A fused block (Note [Fused blocks]) built with cfg.add_input_grad off: its input, residual
// and output and their gradients go through staging; `saved` and `scratch` stay the f32
// block's own, so nothing between the block's layers is rounded.
std::unique_ptr<FusedBlockOp> bf16_fallback(std::unique_ptr<FusedBlockOp> op,
                                            const FusedBlockConfig& cfg, Bf16Staging& staging);

std::unique_ptr<FusableConv> make_conv2d(const CpuContext& ctx,
                                         const Conv2dConfig& cfg);  // conv.cpp

// Note [bf16 on oneDNN]: under --precision bf16 the convolutions, BatchNorms, poolings and fully
// connected layers run on oneDNN's bf16 primitives where the CPU computes in bf16 (AVX512-BF16
// or AMX; --cpu-bf16 auto). Activations and their gradients go in and out as bf16, in the
// layouts of the f32 path (NHWC or the ISA's channel blocks, which oneDNN's bf16 kernels take
// too); products of bf16 values are summed in f32, which is what AMP's autocast computes. The
// arena's f32 weights are reordered into bf16 in the primitive's layout on every call (as f32
// weights are, Note [Conv weight layouts]); weight and bias gradients come out of oneDNN in f32
// from the bf16 inputs and land in the f32 gradient arena as the f32 path's do; BatchNorm's
// statistics, scale and shift stay f32. The convolution and the inner product also take the
// model's f32 input (an RGB stem's NHWC images), rounded once into a staging buffer. Our own
// f32 kernels (Winograd, the single-channel loops, our max pooling, the fused blocks) are not
// used under bf16: max pooling too is oneDNN's.
//
// Which path an op takes is settled when it is built, by building its primitives for a batch
// of two: auto gives an op that oneDNN refuses in bf16, or puts on a reference kernel, the
// fallback (Note [bf16 fallback on the CPU]) and ddpv-train says how many did; --cpu-bf16
// onednn takes whatever kernel oneDNN has (on plain AVX-512 it emulates bf16; on AVX2 it
// refuses, and the op's refusal is then the run's one-line error); --cpu-bf16 fallback forces
// the fallback. Auto stops short of plain AVX-512 because there oneDNN's bf16 is emulated and
// its speed against the fallback's has not been measured.
//
// Each returns null where oneDNN refuses the op in bf16, or puts it on a reference kernel while
// !any_kernel.
// The convolution and the inner product take the model's f32 input too, rounded to bf16 in
// `staging`.
std::unique_ptr<Conv2dOp> make_onednn_bf16_conv2d(const CpuContext& ctx, const Conv2dConfig& cfg,
                                                  bool any_kernel,
                                                  Bf16Staging& staging);  // conv.cpp
std::unique_ptr<BatchNormOp> make_onednn_bf16_batchnorm2d(const CpuContext& ctx,
                                                          const BatchNormConfig& cfg,
                                                          bool any_kernel,
                                                          bool relu = false);  // batchnorm.cpp
std::unique_ptr<Pool2dOp> make_onednn_bf16_pool2d(const CpuContext& ctx, const Pool2dConfig& cfg,
                                                  bool any_kernel,
                                                  Bf16Staging& staging);  // pool.cpp
std::unique_ptr<LinearOp> make_onednn_bf16_linear(const CpuContext& ctx, const LinearConfig& cfg,
                                                  bool any_kernel,
                                                  Bf16Staging& staging);  // linear.cpp
// Note [bf16 blocks on oneDNN] (bf16_block.cpp): conv -> BatchNorm -> ReLU on oneDNN's bf16
// ops, `bn` built with the ReLU fused in; null for any other chain.
std::unique_ptr<FusedBlockOp> make_onednn_bf16_block(const FusedBlockConfig& cfg,
                                                     std::unique_ptr<Conv2dOp> conv,
                                                     std::unique_ptr<BatchNormOp> bn);
// Whether make_onednn_bf16_block takes the chain.
bool onednn_bf16_block_applies(const FusedBlockConfig& cfg);

// Note [bf16 elementwise loops] (bf16_eltwise.cpp): the elementwise ops on bf16 views only, on
// the team where the count is worth it; each rounds its f32 result once.
void bf16_relu(int64_t count, const uint16_t* x, uint16_t* y);
void bf16_relu_backward(int64_t count, const uint16_t* y, const uint16_t* dy, uint16_t* dx);
void bf16_add(int64_t count, const uint16_t* a, const uint16_t* b, uint16_t* y, bool relu);

// Whether the CPU computes in bf16 (AVX512-BF16 or AMX), as oneDNN sees it.
bool cpu_computes_bf16();
// Whether it does so with AMX's tiles, as oneDNN sees it.
bool cpu_has_amx();
// The activations' layout when --cpu-layout does not say (0: NHWC, else the channel block):
// Notes [Blocked activations] and [Channels last for AMX].
int preferred_activation_block(bool avx512, bool bf16_on_amx);
// Note [Fewer multiplications or faster ones]: under --cpu-bf16 auto on a CPU that computes in
// bf16, whether a fused block is faster as the f32 block between bf16 edges (the fallback's
// adapter) than as oneDNN's bf16 layers: `amx` says which bf16 instructions the CPU has.
bool f32_block_is_faster(bool amx, ConvAlgorithm algorithm, const Conv2dConfig& conv);
// kernels/single_channel/conv2d.cpp: a convolution from one input channel on our own loops, where
// it applies; `baseline`: the loops built for the baseline instruction set even where AVX2 + FMA
// are there (the tests compare the two).
bool single_channel_conv_applies(ConvAlgorithm algorithm, const Conv2dConfig& c);
std::unique_ptr<FusableConv> make_single_channel_conv2d(const CpuContext& ctx,
                                                        const Conv2dConfig& cfg,
                                                        bool baseline = false);
std::unique_ptr<FusableBatchNorm> make_batchnorm2d(const CpuContext& ctx,
                                                   const BatchNormConfig& cfg);  // batchnorm.cpp
std::unique_ptr<FusablePool> make_pool2d(const CpuContext& ctx,
                                         const Pool2dConfig& cfg);  // pool.cpp
// fused_block.cpp: Note [Fused blocks] on the CPU; `backend` runs the elementwise passes.
std::unique_ptr<FusedBlockOp> make_fused_block(const CpuContext& ctx, Backend& backend,
                                               const FusedBlockConfig& cfg);
std::unique_ptr<LinearOp> make_linear(const CpuContext& ctx,
                                      const LinearConfig& cfg);  // linear.cpp
std::unique_ptr<SoftmaxCrossEntropyOp> make_softmax_cross_entropy(const CpuContext& ctx,
                                                                  int classes);  // softmax_xent.cpp

// Checks the batch size handed to an op call.
inline void check_batch(const char* op, int n) {
  DDPV_CHECK(n > 0, op, ": batch size must be positive, got ", n);
}

// The checks every Conv2dOp entry point makes of its arguments.
inline void check_conv_forward(const Conv2dConfig& c, int n, const float* b) {
  check_batch("conv2d forward", n);
  DDPV_CHECK(!c.bias || b != nullptr, "conv2d forward: the layer has a bias but b is null");
}
inline void check_conv_backward(const Conv2dConfig& c, int n, const float* dw, const float* db) {
  check_batch("conv2d backward", n);
  DDPV_CHECK(dw != nullptr, "conv2d backward: dw must not be null");
  DDPV_CHECK(!c.bias || db != nullptr, "conv2d backward: the layer has a bias but db is null");
}

}  // namespace ddpv::cpu
