// JPEG (libjpeg-turbo) and PNG (libpng simplified API) decoding and encoding.
#include "data/image_codec.hpp"

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
// longjmp back to decode_jpeg's frame; no C++ object with a destructor lives in the frames
// skipped (they are libjpeg's C frames), and the output vector is reached through a pointer.
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

bool decode_jpeg(const uint8_t* data, size_t size, int channels, int64_t max_pixels, Image* out,
                 std::string* error) {
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
  const int64_t pixels = int64_t{cinfo.image_width} * cinfo.image_height;
  if (pixels > max_pixels) {
    *error = "JPEG declares " + std::to_string(cinfo.image_width) + "x" +
             std::to_string(cinfo.image_height) + " pixels, over the cap of " +
             std::to_string(max_pixels) + " (--max-pixels)";
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  cinfo.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  out->height = static_cast<int>(cinfo.output_height);
  out->width = static_cast<int>(cinfo.output_width);
  out->channels = channels;
  out->pixels.resize(static_cast<size_t>(out->height) * out->width * channels);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row =
        out->pixels.data() + static_cast<size_t>(cinfo.output_scanline) * out->width * channels;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
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
  const int64_t pixels = int64_t{image.width} * image.height;
  if (pixels > max_pixels) {
    *error = "PNG declares " + std::to_string(image.width) + "x" + std::to_string(image.height) +
             " pixels, over the cap of " + std::to_string(max_pixels) + " (--max-pixels)";
    png_image_free(&image);
    return false;
  }
  image.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  out->height = static_cast<int>(image.height);
  out->width = static_cast<int>(image.width);
  out->channels = channels;
  out->pixels.resize(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, out->pixels.data(), 0, nullptr)) {
    *error = std::string("corrupt PNG: ") + image.message;
    png_image_free(&image);
    return false;
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
