// JPEG/PNG decoding (round trips, corrupt and oversized files) and antialiased resizing.
#include <array>
#include <cmath>
#include <random>

#include "data/image_codec.hpp"
#include "support/test_support.hpp"

namespace ddpv::codec {
namespace {

Image smooth_image(int h, int w, int c) {
  Image im{h, w, c, std::vector<uint8_t>(static_cast<size_t>(h * w * c))};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int k = 0; k < c; ++k)
        im.pixels[static_cast<size_t>((y * w + x) * c + k)] = static_cast<uint8_t>(
            x * 150 / std::max(1, w - 1) + y * 60 / std::max(1, h - 1) + k * 20);
  return im;
}

TEST(DataCodec, PngRoundTripIsExactForGrayAndRgb) {
  std::mt19937 gen(3);
  for (int c : {1, 3}) {
    Image im{13, 7, c, std::vector<uint8_t>(static_cast<size_t>(13 * 7 * c))};
    for (auto& v : im.pixels) v = static_cast<uint8_t>(gen() & 0xff);
    const auto bytes = encode_png(im);
    Image back;
    std::string error;
    ASSERT_TRUE(decode_image(bytes.data(), bytes.size(), c, 1 << 20, &back, &error)) << error;
    EXPECT_EQ(back.height, 13);
    EXPECT_EQ(back.width, 7);
    EXPECT_EQ(back.pixels, im.pixels);
  }
}

TEST(DataCodec, JpegRoundTripIsClose) {
  const Image im = smooth_image(24, 40, 3);
  const auto bytes = encode_jpeg(im, 95);
  Image back;
  std::string error;
  ASSERT_TRUE(decode_image(bytes.data(), bytes.size(), 3, 1 << 20, &back, &error)) << error;
  ASSERT_EQ(back.pixels.size(), im.pixels.size());
  double err = 0;
  for (size_t i = 0; i < im.pixels.size(); ++i) err += std::abs(back.pixels[i] - im.pixels[i]);
  EXPECT_LT(err / im.pixels.size(), 4.0);
  // RGB file read as one channel: converted, not rejected.
  ASSERT_TRUE(decode_image(bytes.data(), bytes.size(), 1, 1 << 20, &back, &error)) << error;
  EXPECT_EQ(back.channels, 1);
}

TEST(DataCodec, CorruptTruncatedAndOversizedFilesAreRejected) {
  const Image im = smooth_image(64, 80, 3);
  Image out;
  for (const auto& bytes : {encode_jpeg(im), encode_png(im)}) {
    std::string error;
    auto cut = bytes;
    cut.resize(bytes.size() / 2);
    EXPECT_FALSE(decode_image(cut.data(), cut.size(), 3, 1 << 20, &out, &error));
    EXPECT_NE(error.find("corrupt"), std::string::npos) << error;
    error.clear();
    EXPECT_FALSE(decode_image(bytes.data(), bytes.size(), 3, 64 * 80 - 1, &out, &error));
    EXPECT_NE(error.find("80x64"), std::string::npos) << error;  // width x height
    error.clear();
    EXPECT_TRUE(decode_image(bytes.data(), bytes.size(), 3, 64 * 80, &out, &error)) << error;
  }
  std::string error;
  const uint8_t junk[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_FALSE(decode_image(junk, sizeof(junk), 3, 1 << 20, &out, &error));
  EXPECT_NE(error.find("neither a JPEG nor a PNG"), std::string::npos);
  // A JPEG whose data is scrambled after the header.
  auto bad = encode_jpeg(im);
  for (size_t i = bad.size() / 2; i < bad.size() - 2; ++i) bad[i] = static_cast<uint8_t>(i * 31);
  EXPECT_FALSE(decode_image(bad.data(), bad.size(), 3, 1 << 20, &out, &error));
}

TEST(DataResize, IdentityAndConstantImagesArePreserved) {
  const Image im = smooth_image(9, 11, 3);
  std::vector<uint8_t> same(im.pixels.size());
  resize_bilinear_aa(im.pixels.data(), 9, 11, 3, same.data(), 9, 11);
  EXPECT_EQ(same, im.pixels);
  std::vector<uint8_t> flat(50 * 30, 77), out(7 * 13);
  resize_bilinear_aa(flat.data(), 50, 30, 1, out.data(), 7, 13);
  for (uint8_t v : out) EXPECT_EQ(v, 77);
  out.resize(90 * 70);
  resize_bilinear_aa(flat.data(), 50, 30, 1, out.data(), 90, 70);
  for (uint8_t v : out) EXPECT_EQ(v, 77);
}

TEST(DataResize, DownscalingAveragesInsteadOfAliasing) {
  // A one-pixel checkerboard sampled at every 8th pixel would read all 0 or all 255.
  std::vector<uint8_t> board(64 * 64);
  for (int y = 0; y < 64; ++y)
    for (int x = 0; x < 64; ++x) board[static_cast<size_t>(y * 64 + x)] = ((x + y) % 2) ? 255 : 0;
  std::vector<uint8_t> out(8 * 8);
  resize_bilinear_aa(board.data(), 64, 64, 1, out.data(), 8, 8);
  for (uint8_t v : out) EXPECT_NEAR(v, 127.5, 2.0);
  // A linear ramp stays linear: output o covers source pixels [4o, 4o + 4), centre 4o + 1.5.
  std::vector<uint8_t> ramp(64);
  for (int x = 0; x < 64; ++x) ramp[static_cast<size_t>(x)] = static_cast<uint8_t>(2 * x);
  std::vector<uint8_t> r(16);
  resize_bilinear_aa(ramp.data(), 1, 64, 1, r.data(), 1, 16);
  for (int o = 1; o < 15; ++o) EXPECT_NEAR(r[static_cast<size_t>(o)], 2 * (4 * o + 1.5), 1.0) << o;
}

TEST(DataResize, CenterCropKeepsTheMiddleOfTheLongerSide) {
  // 40 rows x 20 columns: white bands in the top and bottom quarters, black in the middle.
  Image im{40, 20, 1, std::vector<uint8_t>(800, 0)};
  for (int y = 0; y < 40; ++y)
    if (y < 10 || y >= 30)
      for (int x = 0; x < 20; ++x) im.pixels[static_cast<size_t>(y * 20 + x)] = 255;
  const Image out = resize_center_crop(im, 10, 10);  // scale 1/2 to 20x10, crop rows 5..14
  ASSERT_EQ(out.pixels.size(), 100u);
  for (int y = 1; y < 9; ++y)
    for (int x = 0; x < 10; ++x) EXPECT_EQ(out.pixels[static_cast<size_t>(y * 10 + x)], 0) << y;
  for (int x = 0; x < 10; ++x) EXPECT_LT(out.pixels[static_cast<size_t>(x)], 128);
}

// Note [Extreme aspect ratios]: where the whole resized image would hold more than 4 crops,
// the source's centre is cut first. The result is the crop of the whole image resized (the old
// path, computed here as the reference) wherever the kernel near the crop's edges sees no
// different pixels beyond them: here, images that vary only along the short side.
TEST(DataResize, ExtremeAspectRatiosCutTheCentreFirstWithTheSameResult) {
  for (const auto& [sh, sw, h, w] : {std::array{4, 64, 4, 4}, std::array{8, 128, 4, 4},
                                     std::array{96, 6, 3, 3}}) {
    Image im{sh, sw, 1, std::vector<uint8_t>(static_cast<size_t>(sh) * sw)};
    for (int y = 0; y < sh; ++y)
      for (int x = 0; x < sw; ++x)
        im.pixels[static_cast<size_t>(y) * sw + x] =
            static_cast<uint8_t>(sh < sw ? 30 * y + 5 : 30 * x + 5);
    const double scale = std::max(static_cast<double>(h) / sh, static_cast<double>(w) / sw);
    const int rh = std::max(h, static_cast<int>(std::lround(sh * scale)));
    const int rw = std::max(w, static_cast<int>(std::lround(sw * scale)));
    ASSERT_GT(int64_t{rh} * rw, 4 * h * w);  // the case takes the cut-first path
    std::vector<uint8_t> whole(static_cast<size_t>(rh) * rw);
    resize_bilinear_aa(im.pixels.data(), sh, sw, 1, whole.data(), rh, rw);
    const Image out = resize_center_crop(im, h, w);
    ASSERT_EQ(out.pixels.size(), static_cast<size_t>(h) * w);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        EXPECT_EQ(out.pixels[static_cast<size_t>(y) * w + x],
                  whole[static_cast<size_t>(y + (rh - h) / 2) * rw + x + (rw - w) / 2])
            << sh << "x" << sw << " at " << y << "," << x;
  }
  // A 1 x 1,000,000 image covering 32 x 32 (a 3 GB intermediate before) is its centre pixel.
  Image line{1, 1000000, 1, std::vector<uint8_t>(1000000, 10)};
  for (int x = 499990; x < 500010; ++x) line.pixels[static_cast<size_t>(x)] = 200;
  const Image out = resize_center_crop(line, 32, 32);
  for (uint8_t v : out.pixels) EXPECT_EQ(v, 200);
}

}  // namespace
}  // namespace ddpv::codec
