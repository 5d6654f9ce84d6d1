// The Winograd loops compiled for AVX2 + FMA (src/CMakeLists.txt adds -mavx2 -mfma to this file
// alone); kernels/winograd/conv2d.cpp calls them only where the CPU has both.
#if defined(__AVX2__) && defined(__FMA__)
#define DDPV_WINOGRAD_ISA avx2
#include "backend/cpu/kernels/winograd/per_isa_kernels.hpp"

namespace ddpv::cpu {
const WinogradKernels* winograd_kernels_avx2(int m, int r) { return avx2::kernels_for(m, r); }
}  // namespace ddpv::cpu
#else
#include "backend/cpu/kernels/winograd/winograd.hpp"

namespace ddpv::cpu {
const WinogradKernels* winograd_kernels_avx2(int, int) { return nullptr; }
}  // namespace ddpv::cpu
#endif
