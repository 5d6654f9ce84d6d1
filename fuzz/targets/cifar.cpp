// CIFAR-10 / CIFAR-100 binary batches (ddpv-convert cifar). Byte 0 picks the variant and label;
// the rest is the batch file.
#include <cstdlib>

#include "convert.hpp"
#include "ddpv/core/error.hpp"
#include "fuzz_support.hpp"

DDPV_FUZZ_TARGET(cifar) {
  if (size < 1) return 0;
  using ddpv::convert::CifarLayout;
  const CifarLayout layouts[] = {{1, 0, 10}, {2, 1, 100}, {2, 0, 20}};
  const CifarLayout& layout = layouts[data[0] % 3];
  std::vector<uint8_t> images;
  std::vector<int32_t> labels;
  try {
    const int64_t n = ddpv::convert::decode_cifar(data + 1, size - 1, layout, "fuzz.bin",
                                                  &images, &labels);
    if (n <= 0 || static_cast<uint64_t>(n * layout.record()) != size - 1 ||
        images.size() != static_cast<size_t>(n * CifarLayout::kPixels) ||
        labels.size() != static_cast<size_t>(n))
      std::abort();
    for (int32_t l : labels)
      if (l < 0 || l > 255) std::abort();
  } catch (const ddpv::Error&) {
  }
  return 0;
}
