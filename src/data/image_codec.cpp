// JPEG (libjpeg-turbo) and PNG (libpng simplified API) decoding and encoding.
#include "data/image_codec.hpp"

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
// clang-format off
#include <jpeglib.h>
#include <png.h>
// clang-format on

#include "ddpv/core/error.hpp"

namespace ddpv::codec {
namespace {

// Note [libjpeg errors]: libjpeg reports errors through a callback that must not return. We
// longjmp back to the frame of with_decompressor (or encode_jpeg); no C++ object with a
// destructor lives in the frames skipped (libjpeg's C frames and a body that holds none across
// its libjpeg calls), and the outputs are reached through pointers.
struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void jpeg_on_message(j_common_ptr cinfo, int level) {
  if (level < 0) jpeg_on_error(cinfo);  // a warning means damaged data: treat it as an error
}

// Adobe CMYK / YCCK JPEGs (libjpeg converts neither to RGB) are decoded as CMYK and converted
// here. Adobe writes the inks inverted (255 = no ink), which is what nearly every CMYK JPEG is,
// so R = C * K / 255 and so on, as PIL does.
void cmyk_row_to(const uint8_t* cmyk, int width, int channels, uint8_t* out) {
  for (int x = 0; x < width; ++x) {
    const int c = cmyk[4 * x], m = cmyk[4 * x + 1], y = cmyk[4 * x + 2], k = cmyk[4 * x + 3];
    const int r = (c * k + 127) / 255, g = (m * k + 127) / 255, b = (y * k + 127) / 255;
    if (channels == 3) {
      out[3 * x] = static_cast<uint8_t>(r);
      out[3 * x + 1] = static_cast<uint8_t>(g);
      out[3 * x + 2] = static_cast<uint8_t>(b);
    } else {  // ITU-R BT.601 luma, as libjpeg's RGB -> gray
      out[x] = static_cast<uint8_t>((299 * r + 587 * g + 114 * b + 500) / 1000);
    }
  }
}

bool is_cmyk(const jpeg_decompress_struct& cinfo) {
  return cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
}

// The part of a JPEG decode shared by the whole-image and the region decoders: rows
// [first_row, end_row) of the output (after any jpeg_crop_scanline) into out, converting CMYK.
// Called with the decompressor started; the longjmp target is the caller's.
void read_rows(jpeg_decompress_struct& cinfo, int channels, int first_row, int end_row, Image* out,
               std::vector<uint8_t>& cmyk) {
  const int width = static_cast<int>(cinfo.output_width);
  out->height = end_row - first_row;
  out->width = width;
  out->channels = channels;
  out->pixels.resize(static_cast<size_t>(out->height) * width * channels);
  if (first_row > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(first_row));
  if (is_cmyk(cinfo)) cmyk.resize(static_cast<size_t>(width) * 4);
  while (static_cast<int>(cinfo.output_scanline) < end_row) {
    uint8_t* dst =
        out->pixels.data() +
        static_cast<size_t>(static_cast<int>(cinfo.output_scanline) - first_row) * width * channels;
    JSAMPROW row = is_cmyk(cinfo) ? cmyk.data() : dst;
    jpeg_read_scanlines(&cinfo, &row, 1);
    if (is_cmyk(cinfo)) cmyk_row_to(cmyk.data(), width, channels, dst);
  }
}

// Runs body(cinfo) on a decompressor over `data` whose header has been read, and destroys it.
// A libjpeg error (or warning) anywhere, in the header or in body, longjmps back here and
// returns false with "corrupt JPEG: <libjpeg's message>" in *error. So body's frame is skipped
// by the longjmp (Note [libjpeg errors]): it may hold no object with a destructor while it
// calls libjpeg; what it fills lives with its caller.
template <typename Body>
bool with_decompressor(const uint8_t* data, size_t size, std::string* error, Body&& body) {
  jpeg_decompress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_on_error;
  err.mgr.emit_message = jpeg_on_message;
  err.message[0] = '\0';
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    *error = std::string("corrupt JPEG: ") + err.message;
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  const bool ok = body(cinfo);
  jpeg_destroy_decompress(&cinfo);
  return ok;
}

bool decode_jpeg(const uint8_t* data, size_t size, int channels, int64_t max_pixels, Image* out,
                 std::string* error) {
  std::vector<uint8_t> cmyk;
  return with_decompressor(data, size, error, [&](jpeg_decompress_struct& cinfo) {
    if (int64_t{cinfo.image_width} * cinfo.image_height > max_pixels) {
      *error = pixel_cap_error("JPEG", cinfo.image_width, cinfo.image_height, max_pixels);
      return false;
    }
    cinfo.out_color_space = is_cmyk(cinfo) ? JCS_CMYK : channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_start_decompress(&cinfo);
    read_rows(cinfo, channels, 0, static_cast<int>(cinfo.output_height), out, cmyk);
    jpeg_finish_decompress(&cinfo);
    return true;
  });
}

bool decode_png(const uint8_t* data, size_t size, int channels, int64_t max_pixels, Image* out,
                std::string* error) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, data, size)) {
    *error = std::string("corrupt PNG: ") + image.message;
    return false;
  }
  if (int64_t{image.width} * image.height > max_pixels) {
    *error = pixel_cap_error("PNG", image.width, image.height, max_pixels);
    png_image_free(&image);
    return false;
  }
  // Note [PNG samples]: the file's own samples, as PIL reads them (and so torchvision): 16-bit
  // ones scaled by 1/257, alpha dropped (not composed onto black), colour to gray by BT.601 on
  // the stored values. libpng's simplified API would treat 16-bit data as linear light and
  // gamma-encode it (a 16-bit ramp came out up to 50 levels too bright), and compose alpha in
  // linear light; so it is asked for the file's format, 16-bit kept linear (not converted),
  // and the rest is done here. Linear output with alpha comes premultiplied: undone.
  const bool color = (image.format & PNG_FORMAT_FLAG_COLOR) != 0;
  const bool alpha = (image.format & PNG_FORMAT_FLAG_ALPHA) != 0;
  const bool deep = (image.format & PNG_FORMAT_FLAG_LINEAR) != 0;
  image.format = (color ? PNG_FORMAT_FLAG_COLOR : 0u) | (alpha ? PNG_FORMAT_FLAG_ALPHA : 0u) |
                 (deep ? PNG_FORMAT_FLAG_LINEAR : 0u);
  const int src_c = (color ? 3 : 1) + (alpha ? 1 : 0);
  std::vector<uint8_t> raw(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, raw.data(), 0, nullptr)) {
    *error = std::string("corrupt PNG: ") + image.message;
    png_image_free(&image);
    return false;
  }
  out->height = static_cast<int>(image.height);
  out->width = static_cast<int>(image.width);
  out->channels = channels;
  out->pixels.resize(static_cast<size_t>(out->height) * out->width * channels);
  const uint16_t* raw16 = reinterpret_cast<const uint16_t*>(raw.data());
  for (size_t i = 0; i < static_cast<size_t>(out->height) * out->width; ++i) {
    int v[3];
    for (int k = 0; k < (color ? 3 : 1); ++k) {
      if (deep) {
        uint32_t x = raw16[i * src_c + k];
        if (alpha) {
          const uint32_t a16 = raw16[i * src_c + src_c - 1];
          x = a16 == 0 ? 0 : std::min<uint32_t>(65535, (x * 65535 + a16 / 2) / a16);
        }
        v[k] = static_cast<int>((x * 255 + 32767) / 65535);
      } else {
        v[k] = raw[i * src_c + k];
      }
    }
    uint8_t* o = out->pixels.data() + i * channels;
    if (channels == 1) {
      o[0] = static_cast<uint8_t>(color ? (299 * v[0] + 587 * v[1] + 114 * v[2] + 500) / 1000
                                        : v[0]);
    } else {
      for (int k = 0; k < 3; ++k) o[k] = static_cast<uint8_t>(color ? v[k] : v[0]);
    }
  }
  return true;
}

void jpeg_throw(j_common_ptr cinfo) {
  char message[JMSG_LENGTH_MAX];
  (*cinfo->err->format_message)(cinfo, message);
  std::fprintf(stderr, "encode_jpeg: %s\n", message);
  std::longjmp(reinterpret_cast<JpegError*>(cinfo->err)->jump, 1);
}

}  // namespace

std::string pixel_cap_error(const char* kind, int64_t width, int64_t height, int64_t cap) {
  return std::string(kind) + " declares " + std::to_string(width) + "x" + std::to_string(height) +
         " pixels, over the cap of " + std::to_string(cap) + " (--max-pixels)";
}

bool is_jpeg(const uint8_t* data, size_t size) {
  return size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
}

bool read_jpeg_header(const uint8_t* data, size_t size, JpegHeader* out, std::string* error) {
  return with_decompressor(data, size, error, [&](jpeg_decompress_struct& cinfo) {
    out->height = static_cast<int>(cinfo.image_height);
    out->width = static_cast<int>(cinfo.image_width);
    out->components = cinfo.num_components;
    out->cmyk = is_cmyk(cinfo);
    return true;
  });
}

bool decode_jpeg_region(const uint8_t* data, size_t size, int channels, const Region& region,
                        int min_h, int min_w, int margin, Image* out, Region* scaled,
                        std::string* error, int expect_h, int expect_w) {
  std::vector<uint8_t> cmyk;
  return with_decompressor(data, size, error, [&](jpeg_decompress_struct& cinfo) {
    const double ih = cinfo.image_height, iw = cinfo.image_width;
    if (expect_h > 0 && (static_cast<int>(ih) != expect_h || static_cast<int>(iw) != expect_w)) {
      *error = "JPEG header says " + std::to_string(cinfo.image_height) + "x" +
               std::to_string(cinfo.image_width) + " but the store's shape is " +
               std::to_string(expect_h) + "x" + std::to_string(expect_w);
      return false;
    }
    if (!region.within(ih, iw)) {
      *error = "crop region outside the " + std::to_string(cinfo.image_width) + "x" +
               std::to_string(cinfo.image_height) + " image";
      return false;
    }
    // Only the scales 1/8, 2/8, 4/8 and 8/8: libjpeg-turbo has SIMD inverse DCTs for those
    // alone, and its plain-C 6x6 (with 12x12 for 4:2:0 chroma) cost more than the larger resize
    // saved.
    int num = 8;
    while (num > 1 && region.h * (num / 2) / 8 >= min_h && region.w * (num / 2) / 8 >= min_w)
      num /= 2;
    cinfo.scale_num = static_cast<unsigned>(num);
    cinfo.scale_denom = 8;
    cinfo.out_color_space = is_cmyk(cinfo) ? JCS_CMYK : channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_start_decompress(&cinfo);
    // The scaled size is ceil(side * num / 8): map the region by the sizes' ratio.
    const double sy = cinfo.output_height / ih, sx = cinfo.output_width / iw;
    const int oh = static_cast<int>(cinfo.output_height),
              ow = static_cast<int>(cinfo.output_width);
    const Region r{region.y * sy, region.x * sx, region.h * sy, region.w * sx};
    const int y0 = std::max(0, static_cast<int>(std::floor(r.y)) - margin);
    const int y1 = std::min(oh, static_cast<int>(std::ceil(r.y + r.h)) + margin);
    const int x0 = std::max(0, static_cast<int>(std::floor(r.x)) - margin);
    const int x1 = std::min(ow, static_cast<int>(std::ceil(r.x + r.w)) + margin);
    JDIMENSION xoff = static_cast<JDIMENSION>(x0), cw = static_cast<JDIMENSION>(x1 - x0);
    if (x0 > 0 || x1 < ow) jpeg_crop_scanline(&cinfo, &xoff, &cw);  // widens to the iMCU grid
    read_rows(cinfo, channels, y0, y1, out, cmyk);
    jpeg_abort_decompress(&cinfo);  // the rows below the region are not needed
    *scaled = Region{r.y - y0, r.x - static_cast<double>(xoff), r.h, r.w};
    return true;
  });
}

bool crop_resize_jpeg(const uint8_t* data, size_t size, int channels, int expect_h, int expect_w,
                      const Region& region, bool clip, int dh, int dw, uint8_t* out,
                      TransformScratch* scratch, std::string* error) {
  // Without clip the kernel reads up to its radius past the region: at most 2 scaled pixels,
  // as the scale chosen leaves the region under twice the output (Note [Reduced decoding]).
  Region scaled;
  if (!decode_jpeg_region(data, size, channels, region, dh, dw, clip ? 0 : 3, &scratch->decoded,
                          &scaled, error, expect_h, expect_w))
    return false;
  const Image& d = scratch->decoded;
  scaled.h = std::min(scaled.h, d.height - scaled.y);
  scaled.w = std::min(scaled.w, d.width - scaled.x);
  resize_region(d.pixels.data(), d.height, d.width, channels, scaled, clip, out, dh, dw,
                &scratch->mid);
  return true;
}

bool decode_image(const uint8_t* data, size_t size, int channels, int64_t max_pixels, Image* out,
                  std::string* error) {
  if (channels != 1 && channels != 3) {
    *error = "channels must be 1 or 3";
    return false;
  }
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (size >= 8 && std::memcmp(data, kPng, 8) == 0)
    return decode_png(data, size, channels, max_pixels, out, error);
  if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff)
    return decode_jpeg(data, size, channels, max_pixels, out, error);
  *error = "neither a JPEG nor a PNG file (unknown signature)";
  return false;
}

std::vector<uint8_t> encode_jpeg(const Image& image, int quality) {
  DDPV_CHECK(image.channels == 1 || image.channels == 3, "encode_jpeg: bad channels");
  jpeg_compress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_throw;
  unsigned char* buffer = nullptr;
  unsigned long bytes = 0;
  if (setjmp(err.jump)) {
    jpeg_destroy_compress(&cinfo);
    std::free(buffer);
    DDPV_FAIL("encode_jpeg failed");
  }
  jpeg_create_compress(&cinfo);
  jpeg_mem_dest(&cinfo, &buffer, &bytes);
  cinfo.image_width = static_cast<JDIMENSION>(image.width);
  cinfo.image_height = static_cast<JDIMENSION>(image.height);
  cinfo.input_components = image.channels;
  cinfo.in_color_space = image.channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(image.pixels.data()) +
                   static_cast<size_t>(cinfo.next_scanline) * image.width * image.channels;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::vector<uint8_t> out(buffer, buffer + bytes);
  std::free(buffer);
  return out;
}

std::vector<uint8_t> encode_png(const Image& image) {
  DDPV_CHECK(image.channels == 1 || image.channels == 3, "encode_png: bad channels");
  png_image png;
  std::memset(&png, 0, sizeof(png));
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(image.width);
  png.height = static_cast<png_uint_32>(image.height);
  png.format = image.channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  png_alloc_size_t bytes = 0;
  DDPV_CHECK(png_image_write_to_memory(&png, nullptr, &bytes, 0, image.pixels.data(), 0, nullptr),
             "encode_png: ", png.message);
  std::vector<uint8_t> out(bytes);
  DDPV_CHECK(
      png_image_write_to_memory(&png, out.data(), &bytes, 0, image.pixels.data(), 0, nullptr),
      "encode_png: ", png.message);
  out.resize(bytes);
  return out;
}

}  // namespace ddpv::codec
