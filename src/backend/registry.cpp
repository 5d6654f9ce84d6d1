// The backend registry: the one place in the tree that knows which backends were compiled in.
#include <cstdlib>

#include "backend/cpu/cpu_backend.hpp"
#include "ddpv/backend/backend.hpp"
#if DDPV_HAVE_CUDA
#include "backend/cuda/cuda_backend.hpp"
#endif

namespace ddpv {

std::span<const ChoiceWord<Precision>> choices(Precision) {
  static constexpr ChoiceWord<Precision> kWords[] = {{"fp32", Precision::kF32},
                                                     {"bf16", Precision::kBF16},
                                                     {"fp16", Precision::kF16},
                                                     {"f32", Precision::kF32},
                                                     {"f16", Precision::kF16}};
  return kWords;
}

Precision parse_precision(const std::string& name) {
  if (const auto p = find_choice<Precision>(name)) return *p;
  DDPV_FAIL("unknown precision '", name, "': use ", choice_list<Precision>());
}

const char* precision_name(Precision p) { return choice_name(p); }

std::span<const ChoiceWord<ConvAlgorithm>> choices(ConvAlgorithm) {
  static constexpr ChoiceWord<ConvAlgorithm> kWords[] = {{"auto", ConvAlgorithm::kAuto},
                                                         {"direct", ConvAlgorithm::kDirect},
                                                         {"winograd", ConvAlgorithm::kWinograd}};
  return kWords;
}

std::span<const ChoiceWord<CpuBf16>> choices(CpuBf16) {
  static constexpr ChoiceWord<CpuBf16> kWords[] = {
      {"auto", CpuBf16::kAuto}, {"onednn", CpuBf16::kOneDnn}, {"fallback", CpuBf16::kFallback}};
  return kWords;
}

std::span<const ChoiceWord<BatchNormPath>> choices(BatchNormPath) {
  static constexpr ChoiceWord<BatchNormPath> kWords[] = {{"ex", BatchNormPath::kEx},
                                                         {"legacy", BatchNormPath::kLegacy}};
  return kWords;
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

std::span<const ChoiceWord<DeviceChoice>> choices(DeviceChoice) {
  static constexpr ChoiceWord<DeviceChoice> kWords[] = {
      {"auto", DeviceChoice::kAuto}, {"cpu", DeviceChoice::kCpu}, {"cuda", DeviceChoice::kCuda},
      {"gpu", DeviceChoice::kCuda}};
  return kWords;
}

Device resolve_device(DeviceChoice choice) {
  switch (choice) {
    case DeviceChoice::kCpu: return Device::kCpu;
    case DeviceChoice::kAuto: return cuda_device_count() > 0 ? Device::kCuda : Device::kCpu;
    case DeviceChoice::kCuda: break;
  }
  DDPV_CHECK(cuda_backend_compiled(),
             "--device cuda: this build has no CUDA backend (rebuild with WITH_CUDA=ON in "
             "Makefile.inc on a machine with the CUDA toolkit, cuDNN and NCCL)");
  DDPV_CHECK(cuda_device_count() > 0,
             "--device cuda: no CUDA device is visible on this host (check nvidia-smi and "
             "CUDA_VISIBLE_DEVICES, or use --device cpu)");
  return Device::kCuda;
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
