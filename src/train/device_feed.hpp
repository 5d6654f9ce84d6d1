// DeviceFeed: hands the step its batches in device memory, uploading the next batch while the
// current one computes (Note [Batch uploads] in backend.hpp).
#pragma once

#include <array>
#include <memory>
#include <optional>

#include "ddpv/backend/backend.hpp"
#include "train/batch_source.hpp"

namespace ddpv {

// Use per batch:
//   while (auto b = feed.next()) {
//     ... queue the compute that reads b->images and b->labels ...
//     feed.done();  // after the last compute reading the batch is queued
//   }
//
// Note [Two slots]: with an upload stream, batch k lives in slot k % 2. done() releases the
// slot of batch k and then queues the upload of batch k + 1 into the other slot, whose last
// reader (batch k - 1) was released one done() earlier. So the host fetches batch k + 1 from
// the source and queues its upload while the device still computes batch k, and the upload
// runs on the copy stream beside that compute. Without an upload stream (CPU) next() returns
// the source's host batch itself.
class DeviceFeed {
 public:
  // uploads: null when the device reads host memory (then device_alloc is unused). The source,
  // the upload stream and the allocator must outlive the feed.
  DeviceFeed(BatchSource& source, UploadStream* uploads, Allocator* device_alloc);
  ~DeviceFeed();  // waits for queued uploads out of host batches it still holds
  DeviceFeed(const DeviceFeed&) = delete;
  DeviceFeed& operator=(const DeviceFeed&) = delete;

  // Starts `epoch` of the source, skipping its first `start_step` batches.
  void start_epoch(int64_t epoch, int64_t start_step);

  struct Ready {
    Tensor images;  // (B, H, W, C) f32 on the device
    Tensor labels;  // (B) i32 on the device
    int64_t size = 0;
    int64_t global = 0;  // all ranks' samples in this step (Batch::global)
  };
  // The next batch of the epoch, or nullopt at its end. Call done() before the next next().
  std::optional<Ready> next();
  // The compute reading the batch of the last next() is queued.
  void done();

  BatchSource& source() { return source_; }

 private:
  struct Slot {
    std::optional<Batch> host;  // the pinned batch uploaded from; kept until its upload is done
    Tensor images, labels;      // device buffers, grown to the largest batch seen
    bool loaded = false;        // an upload (or the end of the epoch) is queued in this slot
  };
  void load(int slot);  // fetch the source's next batch and queue its upload into `slot`
  void drain();         // wait for every queued upload and drop the host batches

  BatchSource& source_;
  UploadStream* uploads_;
  Allocator* device_alloc_;
  std::array<Slot, 2> slots_;
  int current_ = 0;
  bool handed_out_ = false;  // next() returned a batch that done() has not closed
  std::optional<Batch> host_only_;  // without an upload stream: the batch handed out
};

}  // namespace ddpv
