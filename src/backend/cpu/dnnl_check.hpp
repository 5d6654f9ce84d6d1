// Private to the CPU backend: DDPV_DNNL_CHECK, the engine/stream context the ops share, and the
// user-mode scratchpad every primitive of an op draws from.
#pragma once

#include <oneapi/dnnl/dnnl_debug.h>

#include <algorithm>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>

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
// An activation of logical dims (N, C, H, W) in the layout of `block` (Note [Blocked
// activations]): NHWC for 0, oneDNN's nChw8c / nChw16c for 8 / 16.
inline Mem::desc activation_desc(const Mem::dims& nchw, int block) {
  DDPV_CHECK(block == 0 || block == 8 || block == 16, "no activation layout with block ", block);
  DDPV_CHECK(block == 0 || nchw[1] % block == 0, nchw[1], " channels do not fill blocks of ",
             block);
  return f32_desc(nchw, block == 0 ? Tag::nhwc : block == 8 ? Tag::nChw8c : Tag::nChw16c);
}

// A memory object over caller-owned data; the pointer is bound per call with bind().
inline Mem user_memory(const Mem::desc& md, const dnnl::engine& eng) {
  return Mem(md, eng, DNNL_MEMORY_NONE);
}
inline void bind(const Mem& m, const float* p) { m.set_data_handle(const_cast<float*>(p)); }

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

}  // namespace ddpv::cpu
