// Private to the CPU backend: the prefetches of the Winograd transforms
// (kernels/winograd/per_isa_kernels.hpp), which ask for the activation rows a transform will reach
// next. Internal linkage, as in kernels/simd/vec8.hpp: each instruction set's files get their own
// copies.
#pragma once

#include <algorithm>
#include <cstdint>

namespace ddpv::cpu {
namespace {  // NOLINT(google-build-namespaces): see above

// Note [Prefetching the next region]: the input transform stalled on its loads of the
// activation (perf annotate: a third of its samples on the instructions after them), which
// is out of L2 by then (a batch of lenet's conv2 input is 1.6 MB), and output_adjoint on the
// pooled gradient and its positions. Each work item of an image (a tile and group) therefore
// asks for its share of the next image's cache lines, so that the next image is in L2 when
// its items start: `item` of `items` prefetches the item-th slice of `bytes`. Only within a
// chunk: the chunk's products would evict a prefetched next chunk. Under perf (model_bench
// --sgd 1 lenet) both transforms took a smaller share of the step; prefetching the output
// transform's next tile of products did not help (docs/performance.md, "CPU engine").
inline void prefetch_slice(const void* next, int64_t bytes, int item, int items) {
  const auto* p = static_cast<const char*>(next);
  const int64_t lines = (bytes + 63) / 64, per = (lines + items - 1) / items;
  const int64_t end = std::min(lines, per * (item + 1));
  for (int64_t l = per * item; l < end; ++l) __builtin_prefetch(p + l * 64, 0, 2);
}

// Note [Prefetching the next row of tiles]: within an image the transforms walk rows of tiles,
// and each row reads (or writes) M rows of the activation that the row before did not touch
// (the input transform's tiles overlap by A - M rows, the others' not at all). resnet20's stage-1
// images (64 KiB a 16-channel group, a row of pixels 2 KiB) left the hardware prefetcher behind:
// perf annotate put a third of input_v's samples on the instructions after its loads, and the
// transforms took several times their arithmetic. Each tile now asks for its share of the next
// row of tiles' new rows (its own columns), into L1: a row ahead is 8 KiB there. model_bench
// --sgd 1 flipping each change before every step (a temporary switch, the median ratio of
// consecutive steps): each of the input transform's reads (better into L1 than into L2),
// output_adjoint's and the output transform's stores (prefetched for writing) shortened
// resnet20's step on top of the others; lenet, whose conv2 images are 25 KiB and pooled,
// barely moved. input_adjoint's read-modify-writes of dx, prefetched the same way, gained too
// little to keep (docs/performance.md, "CPU engine").
template <int Write>
inline void prefetch_block(const float* plane, int h, int w, int64_t step, int y0, int y1, int x0,
                           int x1) {
  for (int yy = std::max(y0, 0); yy < std::min(y1, h); ++yy)
    for (int xx = std::max(x0, 0); xx < std::min(x1, w); ++xx)
      __builtin_prefetch(plane + (int64_t{yy} * w + xx) * step, Write, 3);
}

}  // namespace
}  // namespace ddpv::cpu
