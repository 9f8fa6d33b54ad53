// Durations for timings and deadlines, on the steady clock.
#pragma once
#include <chrono>

namespace wan {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace wan
