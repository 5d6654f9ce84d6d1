// BucketPlan: the gradient arena cut into contiguous buckets, each reduced by one collective.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ddpv/nn/model.hpp"

namespace ddpv {

// One collective's worth of the gradient arena: floats [offset, offset + count), holding the
// tensors params[indices] (indices into Model::params(), increasing).
struct Bucket {
  int64_t offset = 0;
  int64_t count = 0;
  std::vector<int> params;
  int64_t bytes() const { return count * static_cast<int64_t>(sizeof(float)); }
};

// Note [Bucket plan]: made once from byte sizes, walking the arena in its own order (reverse
// layer order, so the first bucket holds the gradients that backward finishes first). The
// first bucket is capped at kFirstBucketBytes so that communication starts early; the rest at
// bucket_mb MiB. A tensor larger than its cap gets a bucket of its own (it is never split: a
// bucket is ready when its tensors are, and splitting one gains nothing). bucket_mb == 0 means
// one bucket per tensor, for comparison.
class BucketPlan {
 public:
  static constexpr int64_t kFirstBucketBytes = int64_t{1} << 20;
  static constexpr double kDefaultBucketMb = 25.0;

  // params: in arena order, contiguous from offset 0 (throws otherwise). bucket_mb >= 0.
  BucketPlan(const std::vector<ArenaEntry>& params, double bucket_mb = kDefaultBucketMb);

  const std::vector<Bucket>& buckets() const { return buckets_; }
  int size() const { return static_cast<int>(buckets_.size()); }
  int num_params() const { return static_cast<int>(bucket_of_.size()); }
  int bucket_of(int param_index) const;  // throws when out of range
  int64_t total_count() const { return total_; }
  double bucket_mb() const { return bucket_mb_; }
  std::string summary() const;  // "3 buckets (1.0, 25.0, 3.2 MiB) over 62 tensors"

 private:
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;
  int64_t total_ = 0;
  double bucket_mb_ = 0;
};

}  // namespace ddpv
