// BucketPlan: cutting the gradient arena into buckets (Note [Bucket plan]).
#include "ddpv/dist/bucket_plan.hpp"

#include <cmath>
#include <cstdio>

#include "ddpv/core/error.hpp"

namespace ddpv {

BucketPlan::BucketPlan(const std::vector<ArenaEntry>& params, double bucket_mb)
    : bucket_mb_(bucket_mb) {
  DDPV_CHECK(std::isfinite(bucket_mb) && bucket_mb >= 0,
             "--bucket-mb must be a size in MiB >= 0 (0 = one bucket per tensor), got ", bucket_mb);
  const auto cap = static_cast<int64_t>(bucket_mb * 1024.0 * 1024.0);
  const int64_t first_cap = std::min(cap, kFirstBucketBytes);
  bucket_of_.resize(params.size());
  Bucket open;
  auto close = [&] {
    if (open.params.empty()) return;
    buckets_.push_back(std::move(open));
    open = Bucket{};
  };
  for (size_t i = 0; i < params.size(); ++i) {
    const ArenaEntry& e = params[i];
    DDPV_CHECK(e.offset == total_ && e.count > 0 && e.extent >= e.count, "parameter arena entry '",
               e.name, "' at offset ", e.offset, " (", e.count, " floats in ", e.extent,
               ") does not follow the previous one at ", total_, ": the arena must be contiguous");
    // The padding after a tensor goes with it (Note [Aligned entries]): buckets tile the arena.
    const int64_t bytes = e.extent * static_cast<int64_t>(sizeof(float));
    const int64_t limit = buckets_.empty() ? first_cap : cap;
    if (!open.params.empty() && open.bytes() + bytes > limit) close();
    if (open.params.empty()) open.offset = e.offset;
    open.count += e.extent;
    open.params.push_back(static_cast<int>(i));
    bucket_of_[i] = static_cast<int>(buckets_.size());
    // A full bucket (or a tensor over the cap, alone in its bucket) is closed at once.
    if (open.bytes() >= (buckets_.empty() ? first_cap : cap)) close();
    total_ += e.extent;
  }
  close();
}

int BucketPlan::bucket_of(int param_index) const {
  DDPV_CHECK(param_index >= 0 && param_index < num_params(), "parameter index ", param_index,
             " out of range [0, ", num_params(), ")");
  return bucket_of_[static_cast<size_t>(param_index)];
}

std::string BucketPlan::summary() const {
  std::string s = std::to_string(buckets_.size()) + " bucket" + (buckets_.size() == 1 ? "" : "s");
  s += " over " + std::to_string(bucket_of_.size()) + " tensors";
  if (buckets_.size() <= 8) {
    s += " (";
    for (size_t b = 0; b < buckets_.size(); ++b) {
      char mb[32];
      std::snprintf(mb, sizeof(mb), "%.2f", static_cast<double>(buckets_[b].bytes()) / (1 << 20));
      s += (b ? ", " : "") + std::string(mb);
    }
    s += " MiB)";
  }
  return s;
}

}  // namespace ddpv
