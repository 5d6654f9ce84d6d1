// DeviceFeed: two device slots filled on the upload stream (Note [Two slots]).
#include "train/device_feed.hpp"

#include "ddpv/core/log.hpp"

namespace ddpv {

DeviceFeed::DeviceFeed(BatchSource& source, UploadStream* uploads, Allocator* device_alloc)
    : source_(source), uploads_(uploads), device_alloc_(device_alloc) {
  DDPV_CHECK(uploads_ == nullptr || uploads_->slots() >= 2,
             "DeviceFeed needs an upload stream of at least 2 slots");
  DDPV_CHECK(uploads_ == nullptr || device_alloc_ != nullptr,
             "DeviceFeed needs the device allocator for its upload slots");
}

DeviceFeed::~DeviceFeed() {
  try {
    drain();
  } catch (const std::exception& e) {
    DDPV_WARN("waiting for batch uploads at shutdown: ", e.what());
  }
}

void DeviceFeed::drain() {
  host_only_.reset();
  if (uploads_ == nullptr) return;
  for (int s = 0; s < 2; ++s) {
    Slot& slot = slots_[static_cast<size_t>(s)];
    if (slot.host) uploads_->host_done(s);
    slot.host.reset();
    slot.loaded = false;
  }
}

void DeviceFeed::start_epoch(int64_t epoch, int64_t start_step) {
  drain();
  handed_out_ = false;
  current_ = 0;
  source_.start_epoch(epoch, start_step);
}

void DeviceFeed::load(int s) {
  Slot& slot = slots_[static_cast<size_t>(s)];
  if (slot.host) uploads_->host_done(s);  // the old host batch may go back to the loader
  slot.host = source_.next();
  slot.loaded = true;
  if (!slot.host) return;  // the end of the epoch
  const Batch& b = *slot.host;
  // Grow the slot's device buffers to this batch (the first batch is the largest as a rule;
  // evaluation's last one may be smaller).
  if (slot.images.nbytes() < b.images.nbytes() || slot.labels.nbytes() < b.labels.nbytes()) {
    slot.images = Tensor::empty(b.images.shape(), b.images.dtype(), device_alloc_);
    slot.labels = Tensor::empty(b.labels.shape(), b.labels.dtype(), device_alloc_);
    uploads_->release(s);  // the allocator zero-fills on the compute stream: upload after that
  }
  uploads_->copy(s, slot.images.raw(), b.images.raw(), b.images.nbytes());
  uploads_->copy(s, slot.labels.raw(), b.labels.raw(), b.labels.nbytes());
  uploads_->commit(s);
}

std::optional<DeviceFeed::Ready> DeviceFeed::next() {
  DDPV_CHECK(!handed_out_, "DeviceFeed::next called twice without done() in between");
  if (uploads_ == nullptr) {
    host_only_ = source_.next();
    if (!host_only_) return std::nullopt;
    handed_out_ = true;
    return Ready{host_only_->images, host_only_->labels, host_only_->size, host_only_->global};
  }
  Slot& slot = slots_[static_cast<size_t>(current_)];
  if (!slot.loaded) load(current_);  // the first batch of the epoch
  if (!slot.host) return std::nullopt;
  uploads_->acquire(current_);
  handed_out_ = true;
  const Batch& b = *slot.host;
  const Device d = device_alloc_->device();
  return Ready{Tensor::wrap(slot.images.raw(), b.images.shape(), b.images.dtype(), d),
               Tensor::wrap(slot.labels.raw(), b.labels.shape(), b.labels.dtype(), d), b.size,
               b.global};
}

void DeviceFeed::done() {
  DDPV_CHECK(handed_out_, "DeviceFeed::done without a batch from next()");
  handed_out_ = false;
  if (uploads_ == nullptr) return;
  uploads_->release(current_);
  slots_[static_cast<size_t>(current_)].loaded = false;
  current_ = 1 - current_;
  load(current_);  // Note [Two slots]: batch k + 1 uploads while batch k computes
}

}  // namespace ddpv
