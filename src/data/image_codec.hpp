// Private: JPEG/PNG decoding with a size cap, encoding (for tests and tools), and resizing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddpv::codec {

struct Image {
  int height = 0;
  int width = 0;
  int channels = 0;
  std::vector<uint8_t> pixels;  // (H, W, C)
};

// Decodes a JPEG or PNG (told apart by their signatures) to `channels` (1 or 3) channels.
// Returns false with a one-line reason in *error for a corrupt, truncated or unsupported file,
// and for one whose header declares more than max_pixels pixels; in that case nothing of the
// declared size is allocated. Never throws for bad data; libjpeg warnings (e.g. a premature end
// of data) count as errors, so a truncated file is never half gray.
bool decode_image(const uint8_t* data, size_t size, int channels, int64_t max_pixels, Image* out,
                  std::string* error);

// Encoders (quality 95 JPEG; 8-bit PNG); channels 1 or 3. Throw ddpv::Error on failure.
std::vector<uint8_t> encode_jpeg(const Image& image, int quality = 95);
std::vector<uint8_t> encode_png(const Image& image);

// Note [Resize]: separable resampling with a triangle (bilinear) kernel whose support widens
// with the downscale factor, as PIL's antialiased BILINEAR: downscaling averages every source
// pixel under the footprint instead of sampling a few (no aliasing), upscaling interpolates.
// src (sh, sw, c) -> dst (dh, dw, c).
void resize_bilinear_aa(const uint8_t* src, int sh, int sw, int c, uint8_t* dst, int dh, int dw);

// Scales so the image covers height x width (the shorter side, relative to the target, fits
// exactly), then crops the center.
Image resize_center_crop(const Image& src, int height, int width);

}  // namespace ddpv::codec
