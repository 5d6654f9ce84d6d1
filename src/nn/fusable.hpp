// Private to nn: what a Sequence needs of a layer to put it into a fused block (Note [Fused
// blocks] in include/ddpv/backend/backend.hpp). Leaf layers that can be part of a block
// implement Fusable beside Layer; Layer itself stays plain forward and backward.
#pragma once

#include <string>

#include "ddpv/backend/backend.hpp"
#include "ddpv/nn/layers.hpp"

namespace ddpv {

struct BlockPart {
  enum Kind { kNone, kConv, kBatchNorm, kRelu, kMaxPool };
  Kind kind = kNone;
  const Conv2dConfig* conv = nullptr;   // kConv
  const BatchNormConfig* bn = nullptr;  // kBatchNorm
  const Pool2dConfig* pool = nullptr;   // kMaxPool
  ParamSlot* weight = nullptr;          // kConv (bias: null without one), kBatchNorm (gamma)
  ParamSlot* bias = nullptr;            // kConv, kBatchNorm (beta)
  ParamSlot* running_mean = nullptr;    // kBatchNorm
  ParamSlot* running_var = nullptr;     // kBatchNorm
};

class Fusable {
 public:
  virtual ~Fusable() = default;
  // After setup: this layer as a part of a block.
  virtual BlockPart part() = 0;
  // The layer now runs inside a fused block: `how` is what the block's op says it took in
  // (for describe()), and the layer's own op is released, as it never runs.
  virtual void join_block(const std::string& how) = 0;
};

// The layer as a part of a block; kind kNone for a layer that cannot be one.
inline BlockPart block_part(Layer& layer) {
  auto* f = dynamic_cast<Fusable*>(&layer);
  return f != nullptr ? f->part() : BlockPart{};
}

}  // namespace ddpv
