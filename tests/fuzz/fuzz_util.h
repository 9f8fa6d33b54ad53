// What every fuzz target shares: a scratch folder of its own process (the readers take paths, so each
// input is written to a file there), and the one rule of the targets: a reader either returns or
// throws wan::Error. Any other exception escapes LLVMFuzzerTestOneInput and aborts (libFuzzer reports
// it as a crash), as do sanitizer reports, allocations over -malloc_limit_mb and -timeout hangs.
// Invariant: the scratch folder is unique per process (pid) and removed at a normal exit.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/error.h"

namespace wan::fuzz {

inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::filesystem::path d = std::filesystem::path(tmp && *tmp ? tmp : "/tmp") /
                              ("wan-fuzz-" + std::to_string(::getpid()));
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    return d;
  }();
  // Registered once `dir` exists, so the removal runs before `dir` itself is destroyed at exit.
  static const bool cleanup = std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }) == 0;
  (void)cleanup;
  return dir;
}

// Writes (truncates) a file; aborts on an I/O failure, which is the harness's problem, not the input's.
inline void write_file(const std::filesystem::path& path, const void* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || (size && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();
  }
}

// Runs f; a wan::Error is an accepted answer to a bad input, anything else propagates.
template <typename F>
bool accepts(F&& f) {
  try {
    f();
    return true;
  } catch (const wan::Error&) {
    return false;
  }
}

// Aborts with a message when an invariant a reader promises does not hold for what it returned.
inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz invariant violated: %s\n", what);
    std::abort();
  }
}

}  // namespace wan::fuzz
