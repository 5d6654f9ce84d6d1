// Tensor construction, views and the built-in host allocator.
#include "ddpv/core/tensor.hpp"

#include <sys/mman.h>

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
    void* p = allocate_host_pages(bytes);
    if (p == nullptr) DDPV_FAIL("out of host memory allocating ", bytes, " bytes");
    std::memset(p, 0, std::max<size_t>(64, (bytes + 63) / 64 * 64));  // as allocated below 2 MiB
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

// Note [Huge pages for large tensors]: a tensor's memory is touched first by the allocator's
// zero-fill, and on a VM a 4 KiB page fault is dear: growing resnet20's tensors from a batch of
// 64 to 80 (about 160 MiB, as --balance may ask: Note [Balanced batches]) made that step
// several times a steady one. Allocations from 2 MiB up are 2 MiB aligned and advised for
// transparent huge pages, which Debian and Ubuntu give on request (`madvise` mode): alternated
// with 4 KiB pages (`model_bench --model resnet20 --batch 64 --batch-change 80 --threads 1
// --sgd 1`), that first step and a run's first training step were markedly shorter, the steady
// step unchanged (docs/performance.md, "Distributed"), nor did the steady step move with the
// Winograd buffers on huge pages too, so those keep 4 KiB pages. Where huge pages are off this
// is a no-op.
void* allocate_host_pages(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  if (bytes < kHuge) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    return std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  }
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, rounded);
  if (p != nullptr) madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure is harmless
  return p;
}

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
