// The image decoders (libjpeg-turbo, libpng) behind ddpv-convert folder, and the resize the
// converter applies to what they decode. Byte 0 picks 1 or 3 channels; the rest is the file.
#include <cstdlib>

#include "data/image_codec.hpp"
#include "ddpv/core/error.hpp"
#include "fuzz_support.hpp"

namespace {
// Below the converter's default --max-pixels (2^26), so that a legitimate large image stays
// within libFuzzer's memory limit while the cap's check is still reached.
constexpr int64_t kMaxPixels = int64_t{1} << 24;
}  // namespace

DDPV_FUZZ_TARGET(image_codec) {
  if (size < 1) return 0;
  const int channels = (data[0] & 1) ? 3 : 1;
  ddpv::codec::Image image;
  std::string error;
  if (!ddpv::codec::decode_image(data + 1, size - 1, channels, kMaxPixels, &image, &error)) {
    if (error.empty()) std::abort();  // a refusal must say why
    return 0;
  }
  if (image.height <= 0 || image.width <= 0 || image.channels != channels ||
      image.pixels.size() != static_cast<size_t>(image.height) * image.width * channels)
    std::abort();
  try {
    const ddpv::codec::Image out = ddpv::codec::resize_center_crop(image, 32, 32);
    unsigned sum = 0;  // every output byte is read: MemorySanitizer-style use of what was written
    for (uint8_t v : out.pixels) sum += v;
    if (out.pixels.size() != size_t{32} * 32 * channels || sum == ~0u) std::abort();
  } catch (const ddpv::Error&) {
  }
  return 0;
}
