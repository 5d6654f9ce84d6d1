// Training augmentation (random crop with zero padding, horizontal flip) fused with
// normalisation from uint8 NHWC to float NHWC.
#pragma once

#include <cstdint>

namespace ddpv {

struct AugmentOptions {
  bool crop = true;  // random crop of the zero-padded image back to H x W
  int pad = 4;       // padding on every side before the crop
  bool flip = true;  // horizontal flip with probability 1/2
};

// One sample's draw: the crop offset in the padded image, in [0, 2 * pad], and the flip.
struct AugmentDraw {
  int dy = 0;
  int dx = 0;
  bool flip = false;
};

// Note [Augmentation keys]: every draw comes from Rng(derive_key(seed, epoch, sample, stream)),
// a function of the sample's global index and not of the rank, the position in a batch or the
// thread that runs it. So a sample is augmented identically at any world size, which is what
// lets a 2-rank run reproduce a 1-rank run. Without crop the offset is the identity (pad, pad).
AugmentDraw draw_augmentation(const AugmentOptions& options, uint64_t seed, int64_t epoch,
                              int64_t sample_index);
// The identity draw (evaluation): no shift, no flip.
AugmentDraw identity_draw(const AugmentOptions& options);

// dst(y, x, c) = (src(y + dy - pad, x' + dx - pad, c) / 255 - mean[c]) * inv_std[c], where
// x' = W - 1 - x when flipped and pixels outside the source read as 0 (PyTorch's RandomCrop
// with padding, then RandomHorizontalFlip, ToTensor and Normalize).
void augment_normalize(const uint8_t* src,  // (H, W, C)
                       int height, int width, int channels, int pad, const AugmentDraw& draw,
                       const float* mean, const float* inv_std,  // (C)
                       float* dst);                              // (H, W, C)

// The same with the byte -> float mapping of each channel computed once (a loader builds it
// once and reuses it for every image): table[c][v] = (v / 255 - mean[c]) * inv_std[c].
struct NormalizeTable {
  NormalizeTable(int channels, const float* mean, const float* inv_std);
  int channels;
  float table[4][256];
};
void augment_normalize(const uint8_t* src, int height, int width, int pad, const AugmentDraw& draw,
                       const NormalizeTable& table, float* dst);

// ---- encoded images of any size (ImageNet-style) --------------------------------------------

struct ResizedCropOptions {
  double scale_lo = 0.08, scale_hi = 1.0;             // of the image's area
  double ratio_lo = 3.0 / 4.0, ratio_hi = 4.0 / 3.0;  // width / height
  bool flip = true;
  double eval_fraction = 0.875;  // evaluation: resize the shorter side to crop / this, centre
};

// A region of the source image (pixels) to resize to the crop, and whether to flip after.
struct CropRegion {
  double y = 0, x = 0, h = 0, w = 0;
  bool flip = false;
};

// Note [Resized crop]: torchvision's RandomResizedCrop.get_params, drawn from the sample's key
// (Note [Augmentation keys]): up to 10 tries of an area in [scale_lo, scale_hi] of the image
// and a log-uniform aspect ratio, rounded to whole pixels, accepted when the box fits, at a
// uniform position; else the centre crop of the whole image clamped to the ratio range.
CropRegion draw_resized_crop(const ResizedCropOptions& options, int height, int width,
                             uint64_t seed, int64_t epoch, int64_t sample_index);
// Evaluation (torchvision's Resize(round(crop / eval_fraction)) + CenterCrop(crop)): the
// region of the source that those keep, centred, at fractional size.
CropRegion center_crop_region(const ResizedCropOptions& options, int height, int width, int crop_h,
                              int crop_w);

}  // namespace ddpv
