// Levelled logging. Lines are written whole (one fwrite) so threads do not interleave mid-line.
#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace wan {
namespace {
LogLevel initial_level() {
  const char* e = std::getenv("WAN_LOG_LEVEL");
  if (!e) return LogLevel::Warn;
  if (!strcmp(e, "error")) return LogLevel::Error;
  if (!strcmp(e, "info")) return LogLevel::Info;
  if (!strcmp(e, "debug")) return LogLevel::Debug;
  return LogLevel::Warn;
}
std::atomic<int> g_level{static_cast<int>(initial_level())};
}  // namespace

void set_log_level(LogLevel l) { g_level = static_cast<int>(l); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }
void log_write(LogLevel l, const std::string& msg) {
  static const char* tags[] = {"error", "warn", "info", "debug"};
  std::string line = cat("[", tags[static_cast<int>(l)], "] ", msg, "\n");
  fwrite(line.data(), 1, line.size(), stderr);
}
}  // namespace wan
