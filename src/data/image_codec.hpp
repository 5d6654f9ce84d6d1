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

// A rectangle in an image's pixel coordinates; fractional where it is a scaled one.
struct Region {
  double y = 0, x = 0, h = 0, w = 0;
  // Non-empty and inside a height x width image (up to rounding of a scaled region).
  bool within(double height, double width) const {
    return h > 0 && w > 0 && y >= 0 && x >= 0 && y + h <= height + 1e-6 && x + w <= width + 1e-6;
  }
};

// "<kind> declares WxH pixels, over the cap of N (--max-pixels)": the one line for an image
// whose header claims more pixels than a decoder may allocate.
std::string pixel_cap_error(const char* kind, int64_t width, int64_t height, int64_t cap);

// A JPEG's header: its size and its components (1 gray, 3 YCbCr or RGB, 4 CMYK or YCCK).
struct JpegHeader {
  int height = 0, width = 0, components = 0;
  bool cmyk = false;  // Adobe CMYK / YCCK: libjpeg cannot convert it to RGB
};
bool is_jpeg(const uint8_t* data, size_t size);  // the SOI marker
// Reads the header only (no entropy data). False with *error for a corrupt header.
bool read_jpeg_header(const uint8_t* data, size_t size, JpegHeader* out, std::string* error);

// Note [Reduced decoding]: libjpeg-turbo can decode at scale num/8 (num = 1, 2, 4, 8) by a smaller
// inverse DCT, far cheaper than decoding at full size and shrinking, and can leave out rows
// (jpeg_skip_scanlines: entropy decoding only) and columns outside an iMCU-aligned window
// (jpeg_crop_scanline). decode_jpeg_region decodes the part of the image that `region` (in
// full-size pixels) covers, plus `margin` output pixels around it for a resampling kernel that
// reads past the region, at the smallest scale at which the region is still at least
// min_h x min_w pixels (so the final resize only shrinks, by less than 2). *scaled is the region in
// the returned image's coordinates. A warning of libjpeg counts as an error, as in decode_image;
// data after the last row needed is not looked at. With expect_h and expect_w the header must
// say that size (checked before anything is decoded).
bool decode_jpeg_region(const uint8_t* data, size_t size, int channels, const Region& region,
                        int min_h, int min_w, int margin, Image* out, Region* scaled,
                        std::string* error, int expect_h = 0, int expect_w = 0);

// Encoders (quality 95 JPEG; 8-bit PNG); channels 1 or 3. Throw ddpv::Error on failure.
std::vector<uint8_t> encode_jpeg(const Image& image, int quality = 95);
std::vector<uint8_t> encode_png(const Image& image);

// Note [Resize]: separable resampling with a triangle (bilinear) kernel whose support widens
// with the downscale factor, as PIL's antialiased BILINEAR: downscaling averages every source
// pixel under the footprint instead of sampling a few (no aliasing), upscaling interpolates.
// src (sh, sw, c) -> dst (dh, dw, c).
void resize_bilinear_aa(const uint8_t* src, int sh, int sw, int c, uint8_t* dst, int dh, int dw);
// The same filter mapping `region` of src onto dst. With clip the kernel reads only pixels
// inside the region (as cropping first, then resizing: torchvision's RandomResizedCrop), else
// any pixel of src (as resizing, then cropping: Resize + CenterCrop). `scratch` is reused.
void resize_region(const uint8_t* src, int sh, int sw, int c, const Region& region, bool clip,
                   uint8_t* dst, int dh, int dw, std::vector<float>* scratch);

// Scales so the image covers height x width (the shorter side, relative to the target, fits
// exactly), then crops the center.
Image resize_center_crop(const Image& src, int height, int width);

// The loader's transform of one encoded image: decode `region` (full-size pixels) at a reduced
// scale (Note [Reduced decoding]) and resize it to out (dh, dw, channels) with resize_region.
// The header must say expect_h x expect_w (the store's /shapes), so a store whose shapes and
// bytes disagree fails rather than cropping the wrong place.
struct TransformScratch {
  Image decoded;
  std::vector<float> mid;
};
bool crop_resize_jpeg(const uint8_t* data, size_t size, int channels, int expect_h, int expect_w,
                      const Region& region, bool clip, int dh, int dw, uint8_t* out,
                      TransformScratch* scratch, std::string* error);

}  // namespace ddpv::codec
