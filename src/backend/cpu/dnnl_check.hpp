// Private to the CPU backend: DDPV_DNNL_CHECK, the engine/stream context the ops share, and the
// user-mode scratchpad every primitive of an op draws from.
#pragma once

#include <oneapi/dnnl/dnnl_debug.h>

#include <algorithm>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <string_view>
#include <unordered_map>

#include "ddpv/backend/backend.hpp"
#include "ddpv/core/error.hpp"

namespace ddpv::cpu {

[[noreturn]] inline void throw_dnnl_error(dnnl_status_t status, const char* detail,
                                          const std::string& what, const char* file, int line) {
  ::ddpv::throw_error(::ddpv::detail::concat("oneDNN: ", what, " failed: ", dnnl_status2str(status),
                                             " (", detail, ")"),
                      file, line);
}

// Turns a status of oneDNN's C API (dnnl_sgemm, ...) into the dnnl::error the C++ API throws,
// so that DDPV_DNNL_CHECK reports both the same way.
inline void check_dnnl_status(dnnl_status_t status, const char* call) {
  if (status != dnnl_success) throw dnnl::error(status, call);
}

}  // namespace ddpv::cpu

// Runs the statements and converts a dnnl::error into ddpv::Error naming `context` and the status:
//   DDPV_DNNL_CHECK("conv2d forward", fwd.execute(stream, args));
#define DDPV_DNNL_CHECK(context, ...)                                                            \
  do {                                                                                           \
    try {                                                                                        \
      __VA_ARGS__;                                                                               \
    } catch (const ::dnnl::error& dnnl_error_) {                                                 \
      ::ddpv::cpu::throw_dnnl_error(dnnl_error_.status, dnnl_error_.what(), (context), __FILE__, \
                                    __LINE__);                                                   \
    }                                                                                            \
  } while (0)

namespace ddpv::cpu {

using Mem = dnnl::memory;
using Tag = dnnl::memory::format_tag;
using Dt = dnnl::memory::data_type;

// What every op of the CPU backend shares: one engine, one in-order stream, the thread count.
// engine and stream are reference-counted handles, so each op holds its own copy.
struct CpuContext {
  dnnl::engine engine;
  dnnl::stream stream;
  int threads = 0;                            // 0: the OpenMP runtime's default
  int block = 0;                              // the activation block (Note [Blocked activations])
  ConvAlgorithm conv = ConvAlgorithm::kAuto;  // Note [Winograd convolution]

  // Note [OpenMP threads per calling thread]: omp_set_num_threads sets the team size for the
  // calling thread only, and libdnnl runs its OpenMP regions from whichever thread calls it
  // (a trainer thread need not be the one that built the backend). Every op entry point
  // therefore re-applies the count; it is a store to a thread-local variable.
  void bind_threads() const;
};

// A plain f32 memory descriptor of the given dims and tag.
inline Mem::desc f32_desc(const Mem::dims& dims, Tag tag) { return Mem::desc(dims, Dt::f32, tag); }
// oneDNN's name for an activation dtype.
inline Dt dnnl_dtype(DType t) { return t == DType::kBF16 ? Dt::bf16 : Dt::f32; }

// An activation of logical dims (N, C, H, W) in the layout of `block` (Note [Blocked
// activations]): NHWC for 0, oneDNN's nChw8c / nChw16c for 8 / 16; f32 unless `dt` says.
inline Mem::desc activation_desc(const Mem::dims& nchw, int block, Dt dt = Dt::f32) {
  DDPV_CHECK(block == 0 || block == 8 || block == 16, "no activation layout with block ", block);
  DDPV_CHECK(block == 0 || nchw[1] % block == 0, nchw[1], " channels do not fill blocks of ",
             block);
  return Mem::desc(nchw, dt, block == 0 ? Tag::nhwc : block == 8 ? Tag::nChw8c : Tag::nChw16c);
}

// A memory object over caller-owned data; the pointer is bound per call with bind().
inline Mem user_memory(const Mem::desc& md, const dnnl::engine& eng) {
  return Mem(md, eng, DNNL_MEMORY_NONE);
}
inline void bind(const Mem& m, const void* p) { m.set_data_handle(const_cast<void*>(p)); }

// Whether oneDNN put a primitive on one of its reference (plain C++) kernels.
inline bool is_reference(const dnnl::primitive_desc_base& pd) {
  return std::string_view(pd.impl_info_str()).starts_with("ref");
}

// A caller-owned tensor as one primitive sees it, in the layout (and dtype) it prefers: load()
// brings the caller's values in, store() takes the primitive's result out (no-ops when the two
// descriptors agree).
struct Relayout {
  Mem user, prim;
  dnnl::reorder to_prim, to_user;
  bool same = true;

  Relayout() = default;
  Relayout(const Mem::desc& user_md, const Mem::desc& prim_md, const dnnl::engine& eng)
      : user(user_memory(user_md, eng)), same(user_md == prim_md) {
    if (same) {
      prim = user;
    } else {
      prim = Mem(prim_md, eng);
      to_prim = dnnl::reorder(user, prim);
      to_user = dnnl::reorder(prim, user);
    }
  }
  void load(const CpuContext& ctx, const void* p) {
    bind(user, p);
    if (!same) to_prim.execute(ctx.stream, user, prim);
  }
  void store(const CpuContext& ctx, void* p) {
    bind(user, p);
    if (!same) to_user.execute(ctx.stream, prim, user);
  }
};

// A weight gradient computed in the layout a backward-weights primitive prefers (`prim`) and
// stored into the caller's arena, f32 in PyTorch's layout: overwriting it, or adding to it
// (a reorder with a sum post-op) when gradients accumulate.
struct WeightGrad {
  Mem user, prim;
  dnnl::reorder to_user, add_to_user;

  WeightGrad() = default;
  WeightGrad(const Mem::desc& user_md, const Mem::desc& prim_md, const dnnl::engine& eng)
      : user(user_memory(user_md, eng)), prim(prim_md, eng), to_user(prim, user) {
    dnnl::post_ops sum;
    sum.append_sum(1.0f);
    dnnl::primitive_attr add_attr;
    add_attr.set_post_ops(sum);
    add_to_user =
        dnnl::reorder(dnnl::reorder::primitive_desc(eng, prim_md, eng, user_md, add_attr));
  }
  void store(const CpuContext& ctx, float* p, bool accumulate) {
    bind(user, p);
    (accumulate ? add_to_user : to_user).execute(ctx.stream, prim, user);
  }
};

// The primitives (and memory) an op builds for each batch size it meets, with its member
// function build(n, plan).
template <class Plan>
class PlansByBatch {
 public:
  template <class Op>
  using Build = void (Op::*)(int, Plan&) const;

  // The plan for n images, built on first use; a refusal of oneDNN's becomes ddpv::Error
  // naming `name`.
  template <class Op>
  Plan& get(int n, const char* name, const Op* op, Build<Op> build) {
    auto it = plans_.find(n);
    if (it != plans_.end()) return *it->second;
    auto p = std::make_unique<Plan>();
    DDPV_DNNL_CHECK(
        std::string(name) + ": building the primitives for batch size " + std::to_string(n),
        (op->*build)(n, *p));
    return *plans_.emplace(n, std::move(p)).first->second;
  }
  // Note [bf16 on oneDNN]: the plan for n images, or null where oneDNN refuses it (not for the
  // hot path: the refusal is an exception).
  template <class Op>
  const Plan* try_get(int n, const Op* op, Build<Op> build) {
    if (auto it = plans_.find(n); it != plans_.end()) return it->second.get();
    auto p = std::make_unique<Plan>();
    try {
      (op->*build)(n, *p);
    } catch (const dnnl::error&) {
      return nullptr;
    }
    return plans_.emplace(n, std::move(p)).first->second.get();
  }
  const Plan* find(int n) const {
    const auto it = plans_.find(n);
    return it == plans_.end() ? nullptr : it->second.get();
  }
  void clear() { plans_.clear(); }

 private:
  std::unordered_map<int, std::unique_ptr<Plan>> plans_;
};

// Primitive attributes asking for a user-provided scratchpad (see Note [User scratchpad]).
inline dnnl::primitive_attr user_scratchpad_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// Note [User scratchpad]: in its default mode oneDNN allocates and frees a primitive's
// scratchpad around every execution. Our primitives are built with scratchpad_mode::user and
// share one buffer per op and batch size, sized once for the largest of them, so that the
// steady-state step allocates no large buffer. The primitives of one op run one at a time.
class Scratchpad {
 public:
  void require(const dnnl::primitive_desc_base& pd) {
    bytes_ = std::max(bytes_, pd.scratchpad_desc().get_size());
  }
  void allocate(const dnnl::engine& eng) {
    const auto n = static_cast<Mem::dim>(std::max<size_t>(bytes_, 64));
    buffer_ = Mem(Mem::desc({n}, Dt::u8, Tag::x), eng);
  }
  // A memory object of pd's scratchpad descriptor over the shared buffer.
  Mem view(const dnnl::primitive_desc_base& pd, const dnnl::engine& eng) const {
    return Mem(pd.scratchpad_desc(), eng, buffer_.get_data_handle());
  }

 private:
  size_t bytes_ = 0;
  Mem buffer_;
};

// A weighted op's primitives for one batch size (convolution or inner product: forward,
// backward-data, backward-weights) and the memory they run on. The arena's f32 weights are
// reordered into each primitive's layout and dtype on every call (Note [Conv weight layouts]);
// the weight gradient goes back through WeightGrad, the bias gradient through db.
template <class Fwd, class BwdData, class BwdWeights>
struct WeightedPlan {
  Fwd fwd;
  BwdData bwd_data;
  BwdWeights bwd_weights;
  typename Fwd::primitive_desc fwd_pd;
  typename BwdData::primitive_desc bwd_data_pd;
  typename BwdWeights::primitive_desc bwd_w_pd;
  Relayout x, y, dy, dx;  // the caller's activations as the primitives see them
  Relayout w_fwd, w_bwd;
  WeightGrad dw;
  Mem b, db;  // b: caller memory, bound per call; db: what backward-weights writes
  Scratchpad scratch;
  std::unordered_map<int, Mem> fwd_args, bwd_data_args, bwd_weights_args;

  // Builds the primitives, their weights and scratchpad, and their arguments; x, y, dy and dx
  // must be set first. w_user_md: the arena's weights (f32, PyTorch's layout); b_md: the bias,
  // where `bias`.
  void build(const typename Fwd::primitive_desc& f, const typename BwdData::primitive_desc& d,
             const typename BwdWeights::primitive_desc& w, const Mem::desc& w_user_md,
             const Mem::desc& b_md, bool bias, const dnnl::engine& eng) {
    fwd = Fwd(f);
    bwd_data = BwdData(d);
    bwd_weights = BwdWeights(w);
    fwd_pd = f;
    bwd_data_pd = d;
    bwd_w_pd = w;
    scratch.require(f);
    scratch.require(d);
    scratch.require(w);
    scratch.allocate(eng);
    w_fwd = Relayout(w_user_md, f.weights_desc(), eng);
    w_bwd = Relayout(w_user_md, d.weights_desc(), eng);
    dw = WeightGrad(w_user_md, w.diff_weights_desc(), eng);
    b = user_memory(b_md, eng);
    db = Mem(b_md, eng);
    fwd_args = {{DNNL_ARG_SRC, x.prim},
                {DNNL_ARG_WEIGHTS, w_fwd.prim},
                {DNNL_ARG_DST, y.prim},
                {DNNL_ARG_SCRATCHPAD, scratch.view(f, eng)}};
    if (bias) fwd_args.emplace(DNNL_ARG_BIAS, b);
    bwd_data_args = {{DNNL_ARG_DIFF_DST, dy.prim},
                     {DNNL_ARG_WEIGHTS, w_bwd.prim},
                     {DNNL_ARG_DIFF_SRC, dx.prim},
                     {DNNL_ARG_SCRATCHPAD, scratch.view(d, eng)}};
    bwd_weights_args = {{DNNL_ARG_SRC, x.prim},
                        {DNNL_ARG_DIFF_DST, dy.prim},
                        {DNNL_ARG_DIFF_WEIGHTS, dw.prim},
                        {DNNL_ARG_SCRATCHPAD, scratch.view(w, eng)}};
    if (bias) bwd_weights_args.emplace(DNNL_ARG_DIFF_BIAS, db);
  }

  // The three directions on the caller's memory (activations of the plan's dtype); b and db
  // null where the op has no bias. Both backwards read dy, which the caller loads first.
  void forward(const CpuContext& ctx, const void* x_in, const float* w, const float* b_in,
               void* y_out) {
    w_fwd.load(ctx, w);
    x.load(ctx, x_in);
    bind(y.user, y_out);
    if (b_in != nullptr) bind(b, b_in);
    fwd.execute(ctx.stream, fwd_args);
    y.store(ctx, y_out);
  }
  void backward_data(const CpuContext& ctx, const float* w, void* dx_out) {
    w_bwd.load(ctx, w);
    bind(dx.user, dx_out);
    bwd_data.execute(ctx.stream, bwd_data_args);
    dx.store(ctx, dx_out);
  }
  void backward_weights(const CpuContext& ctx, const void* x_in, float* dw_out, float* db_out,
                        int64_t channels, bool accumulate) {
    x.load(ctx, x_in);
    bwd_weights.execute(ctx.stream, bwd_weights_args);
    dw.store(ctx, dw_out, accumulate);
    if (db_out == nullptr) return;
    const float* src = static_cast<const float*>(db.get_data_handle());
    for (int64_t c = 0; c < channels; ++c) db_out[c] = accumulate ? db_out[c] + src[c] : src[c];
  }

  bool on_reference() const {
    return is_reference(fwd_pd) || is_reference(bwd_data_pd) || is_reference(bwd_w_pd);
  }
  // The kernels oneDNN picked: "brgconv:avx512_core_amx_bf16", or the three (forward /
  // backward-data / backward-weights) where they differ.
  std::string kernels() const {
    const std::string f = fwd_pd.impl_info_str(), d = bwd_data_pd.impl_info_str(),
                      w = bwd_w_pd.impl_info_str();
    return f == d && d == w ? f : f + " / " + d + " / " + w;
  }
};

}  // namespace ddpv::cpu
