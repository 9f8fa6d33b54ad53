// A fixed thread pool with a blocking parallel_for. Threads = WAN_THREADS or hardware concurrency.
// parallel_for splits [0, n) into contiguous chunks of at least `grain`; nested calls run serially.
#pragma once
#include <cstdint>
#include <functional>

namespace wan {
int num_threads();
// fn(begin, end) is called on disjoint ranges covering [0, n); returns when all are done.
// Exceptions thrown by fn are rethrown (the first one) in the caller.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);
}  // namespace wan
