// Helpers shared by the CPU tests of the launcher (test_dist_launch.cpp, test_dist_mpi.cpp).
// lookup(m): an EnvLookup over a map (the map must outlive it); host_ranks(n): launch options for n
// ranks without NCCL (host-only ranks, "devices" 0..n-1); since(t): seconds on the steady clock.
#pragma once
#include <map>
#include <string>

#include "core/clock.h"
#include "runtime/dist/launch.h"

namespace wan::test {

inline dist::EnvLookup lookup(const std::map<std::string, std::string>& m) {
  return [&m](const char* n) -> const char* {
    auto it = m.find(n);
    return it == m.end() ? nullptr : it->second.c_str();
  };
}

inline dist::LaunchOptions host_ranks(int n) {
  dist::LaunchOptions o;
  o.nccl = false;
  for (int i = 0; i < n; ++i) o.devices.push_back(i);
  return o;
}

inline double since(Clock::time_point t) { return seconds_since(t); }

}  // namespace wan::test
