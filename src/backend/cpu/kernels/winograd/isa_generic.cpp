// The Winograd loops compiled for the baseline instruction set, for CPUs without AVX2 + FMA.
#define DDPV_WINOGRAD_ISA generic
#include "backend/cpu/kernels/winograd/per_isa_kernels.hpp"

namespace ddpv::cpu {
const WinogradKernels* winograd_kernels_generic(int m, int r) { return generic::kernels_for(m, r); }
}  // namespace ddpv::cpu
