// Bulk Philox fills (the per-element maths is inline in philox.h, shared with the GPU): split over the
// thread pool in fixed ranges, so the values never depend on the thread count.
#include "core/philox.h"

#include "core/thread_pool.h"

namespace wan {
void philox_normal_fill(uint64_t seed, uint64_t offset, float* dst, size_t n) {
  parallel_for(static_cast<int64_t>(n), 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dst[i] = philox_normal(seed, offset + static_cast<uint64_t>(i));
  });
}
}  // namespace wan
