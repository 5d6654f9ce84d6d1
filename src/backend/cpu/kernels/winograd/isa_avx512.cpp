// The Winograd loops compiled for AVX-512 (F and VL) + FMA (src/CMakeLists.txt adds the flags
// to this file alone); kernels/winograd/conv2d.cpp calls them only where the CPU has them.
#if defined(__AVX512F__) && defined(__AVX512VL__) && defined(__FMA__)
#define DDPV_WINOGRAD_ISA avx512
#include "backend/cpu/kernels/winograd/per_isa_kernels.hpp"

namespace ddpv::cpu {
const WinogradKernels* winograd_kernels_avx512(int m, int r) { return avx512::kernels_for(m, r); }
}  // namespace ddpv::cpu
#else
#include "backend/cpu/kernels/winograd/winograd.hpp"

namespace ddpv::cpu {
const WinogradKernels* winograd_kernels_avx512(int, int) { return nullptr; }
}  // namespace ddpv::cpu
#endif
