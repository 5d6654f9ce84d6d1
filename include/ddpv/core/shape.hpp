// Shape: the dimensions of a tensor, outermost first; activations are (N, H, W, C).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace ddpv {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::vector<int64_t> dims);

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t operator[](int i) const;  // negative i counts from the back; throws when out of range
  int64_t numel() const;
  const std::vector<int64_t>& dims() const { return dims_; }
  Shape with_dim(int i, int64_t value) const;  // copy with dimension i replaced
  std::string str() const;                     // "(64, 32, 32, 3)"

  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return dims_ != o.dims_; }

 private:
  std::vector<int64_t> dims_;
};

}  // namespace ddpv
