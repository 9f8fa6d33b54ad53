// Levelled logging to stderr. Level from WAN_LOG_LEVEL (error|warn|info|debug) or set_log_level.
#pragma once
#include "core/error.h"

namespace wan {
enum class LogLevel { Error = 0, Warn = 1, Info = 2, Debug = 3 };
void set_log_level(LogLevel l);
LogLevel log_level();
void log_write(LogLevel l, const std::string& msg);
}  // namespace wan

#define WAN_LOG(level, ...)                                                        \
  do {                                                                             \
    if (static_cast<int>(::wan::LogLevel::level) <= static_cast<int>(::wan::log_level())) \
      ::wan::log_write(::wan::LogLevel::level, ::wan::cat(__VA_ARGS__));           \
  } while (0)
#define LOG_ERROR(...) WAN_LOG(Error, __VA_ARGS__)
#define LOG_WARN(...) WAN_LOG(Warn, __VA_ARGS__)
#define LOG_INFO(...) WAN_LOG(Info, __VA_ARGS__)
#define LOG_DEBUG(...) WAN_LOG(Debug, __VA_ARGS__)
