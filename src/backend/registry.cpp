// The backend registry: the one place in the tree that knows which backends were compiled in.
#include <cstdlib>

#include "backend/cpu/cpu_backend.hpp"
#include "ddpv/backend/backend.hpp"
#if DDPV_HAVE_CUDA
#include "backend/cuda/cuda_backend.hpp"
#endif

namespace ddpv {

Precision parse_precision(const std::string& name) {
  if (name == "fp32" || name == "f32") return Precision::kF32;
  if (name == "bf16") return Precision::kBF16;
  if (name == "fp16" || name == "f16") return Precision::kF16;
  DDPV_FAIL("unknown precision '", name, "': use fp32, bf16 or fp16");
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kF32: return "fp32";
    case Precision::kBF16: return "bf16";
    case Precision::kF16: return "fp16";
  }
  return "?";
}

void Backend::sgd_update_sum(const SgdConfig&, const std::vector<ParamSpan>&, int64_t, float*,
                             const std::vector<const float*>&, float*) {
  DDPV_FAIL("the ", device_name(device()),
            " backend has no summed SGD update (Note [Shared update] is for host memory)");
}

bool cuda_backend_compiled() {
#if DDPV_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#if DDPV_HAVE_CUDA
  return cuda_visible_device_count();
#else
  return 0;
#endif
}

Device resolve_device(const std::string& name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda" || name == "gpu") {
    DDPV_CHECK(cuda_backend_compiled(),
               "--device cuda: this build has no CUDA backend (rebuild with WITH_CUDA=ON in "
               "Makefile.inc on a machine with the CUDA toolkit, cuDNN and NCCL)");
    DDPV_CHECK(cuda_device_count() > 0,
               "--device cuda: no CUDA device is visible on this host (check nvidia-smi and "
               "CUDA_VISIBLE_DEVICES, or use --device cpu)");
    return Device::kCuda;
  }
  if (name == "auto") return cuda_device_count() > 0 ? Device::kCuda : Device::kCpu;
  DDPV_FAIL("unknown device '", name, "': use auto, cpu or cuda");
}

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  if (options.device == Device::kCpu) return make_cpu_backend(options);
#if DDPV_HAVE_CUDA
  return make_cuda_backend(options);
#else
  DDPV_FAIL("the CUDA backend is not compiled into this build; use --device cpu");
#endif
}

}  // namespace ddpv
