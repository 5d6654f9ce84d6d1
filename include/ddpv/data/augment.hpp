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

}  // namespace ddpv
