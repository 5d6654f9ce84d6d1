// Tensor construction, views and the built-in host allocator.
#include "ddpv/core/tensor.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

namespace ddpv {
namespace {

// The host allocator's counts (allocations are few and large: a lock costs nothing here).
std::mutex stats_mutex;
HostMemoryStats stats;

class HostAllocator final : public Allocator {
 public:
  Device device() const override { return Device::kCpu; }
  void* allocate(size_t bytes) override {
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (p == nullptr) DDPV_FAIL("out of host memory allocating ", bytes, " bytes");
    std::memset(p, 0, rounded == 0 ? 64 : rounded);
    const std::lock_guard lock(stats_mutex);
    stats.in_use += bytes;
    stats.peak = std::max(stats.peak, stats.in_use);
    stats.largest = std::max(stats.largest, bytes);
    return p;
  }
  void deallocate(void* ptr, size_t bytes) noexcept override {
    std::free(ptr);
    const std::lock_guard lock(stats_mutex);
    stats.in_use -= bytes;
  }
};

}  // namespace

const char* device_name(Device d) { return d == Device::kCpu ? "cpu" : "cuda"; }

Allocator* host_allocator() {
  static HostAllocator alloc;
  return &alloc;
}

HostMemoryStats host_memory_stats() {
  const std::lock_guard lock(stats_mutex);
  return stats;
}

void reset_host_memory_peak() {
  const std::lock_guard lock(stats_mutex);
  stats.peak = stats.in_use;
  stats.largest = 0;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Allocator* alloc) {
  if (alloc == nullptr) alloc = host_allocator();
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = alloc->device();
  const size_t bytes = t.nbytes();
  void* p = alloc->allocate(bytes);
  t.storage_ = std::shared_ptr<void>(p, [alloc, bytes](void* q) { alloc->deallocate(q, bytes); });
  t.data_ = p;
  t.capacity_ = bytes;
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.data_ = data;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  DDPV_CHECK(shape.numel() == numel(), "cannot reshape ", str(), " to ", shape.str(),
             ": element counts differ");
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  DDPV_CHECK(shape_.rank() >= 1 && 0 <= begin && begin <= end && end <= shape_[0],
             "slice [", begin, ", ", end, ") out of range for ", str());
  const int64_t row = shape_[0] == 0 ? 0 : numel() / shape_[0];
  Tensor t = *this;
  t.shape_ = shape_.with_dim(0, end - begin);
  const size_t offset = static_cast<size_t>(begin * row) * dtype_size(dtype_);
  t.data_ = static_cast<char*>(data_) + offset;
  t.capacity_ = owns_memory() ? capacity_ - offset : 0;
  return t;
}

Tensor Tensor::fit(const Shape& shape) const {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype_);
  DDPV_CHECK(bytes <= capacity_, "cannot fit ", shape.str(), " of ", dtype_name(dtype_), " in ",
             str(), ", whose storage holds ", capacity_, " bytes from its start");
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

std::string Tensor::str() const {
  return std::string(dtype_name(dtype_)) + shape_.str() + "@" + device_name(device_);
}

}  // namespace ddpv
