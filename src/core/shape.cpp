// Shape: dimensions, element count and printing.
#include "ddpv/core/shape.hpp"

#include "ddpv/core/error.hpp"

namespace ddpv {

Shape::Shape(std::initializer_list<int64_t> dims) : dims_(dims) {
  for (int64_t d : dims_) DDPV_CHECK(d >= 0, "negative dimension in shape ", str());
}

Shape::Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {
  for (int64_t d : dims_) DDPV_CHECK(d >= 0, "negative dimension in shape ", str());
}

int64_t Shape::operator[](int i) const {
  const int r = rank();
  const int j = i < 0 ? i + r : i;
  DDPV_CHECK(j >= 0 && j < r, "dimension ", i, " out of range for shape ", str());
  return dims_[j];
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
  return n;
}

Shape Shape::with_dim(int i, int64_t value) const {
  const int j = i < 0 ? i + rank() : i;
  DDPV_CHECK(j >= 0 && j < rank(), "dimension ", i, " out of range for shape ", str());
  std::vector<int64_t> d = dims_;
  d[j] = value;
  return Shape(std::move(d));
}

std::string Shape::str() const {
  std::string s = "(";
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[i]);
  }
  return s + ")";
}

}  // namespace ddpv
