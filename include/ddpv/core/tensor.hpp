// Tensor: a typed, shaped view of host or device memory that may own its buffer.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "ddpv/core/dtype.hpp"
#include "ddpv/core/error.hpp"
#include "ddpv/core/shape.hpp"

namespace ddpv {

enum class Device : uint8_t { kCpu, kCuda };
const char* device_name(Device d);  // "cpu", "cuda"

// Hands out raw memory of one device. The host allocator is built in; a backend brings its own
// for device memory (and for pinned host memory).
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) noexcept = 0;
};

// 64-byte aligned host memory, zero-filled.
Allocator* host_allocator();
// Note [Huge pages for large tensors]: host memory for `bytes`, 64-byte aligned; from 2 MiB up,
// 2 MiB aligned and advised for transparent huge pages (MADV_HUGEPAGE). Free with std::free.
// Null when out of memory.
void* allocate_host_pages(size_t bytes);

// What the host allocator holds for this process: bytes in live allocations, the most it has
// held at once, and the largest single allocation, the last two since the last reset.
struct HostMemoryStats {
  size_t in_use = 0, peak = 0, largest = 0;
};
HostMemoryStats host_memory_stats();
void reset_host_memory_peak();  // peak = in_use, largest = 0

class Tensor {
 public:
  Tensor() = default;

  // An owning tensor of fresh memory from `alloc` (host memory when null), zero-filled on host.
  static Tensor empty(const Shape& shape, DType dtype, Allocator* alloc = nullptr);
  // A non-owning view of memory someone else keeps alive.
  static Tensor wrap(void* data, const Shape& shape, DType dtype, Device device = Device::kCpu);

  // Same memory, another shape of the same element count.
  Tensor reshape(const Shape& shape) const;
  // Rows [begin, end) of the outermost dimension, sharing memory.
  Tensor slice(int64_t begin, int64_t end) const;
  // Same memory from the same start, as `shape` (of this dtype), which may hold fewer or more
  // elements than this tensor as long as they fit in what its storage holds: capacity().
  Tensor fit(const Shape& shape) const;

  bool defined() const { return data_ != nullptr || shape_.numel() == 0; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool owns_memory() const { return storage_ != nullptr; }
  // Bytes from raw() to the end of the storage this tensor shares (0 for a view by wrap).
  size_t capacity() const { return capacity_; }

  void* raw() const { return data_; }
  template <typename T>
  T* data() const {
    DDPV_CHECK(dtype_of<T>() == dtype_, "tensor holds ", dtype_name(dtype_), ", asked for ",
               dtype_name(dtype_of<T>()));
    return static_cast<T*>(data_);
  }

  std::string str() const;  // "f32(64, 32, 32, 3)@cpu"

 private:
  std::shared_ptr<void> storage_;  // keeps the buffer alive when owning
  void* data_ = nullptr;
  size_t capacity_ = 0;
  Shape shape_;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
};

}  // namespace ddpv
