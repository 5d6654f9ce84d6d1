// Leveled logging to stderr with a rank prefix; rank-0-only helpers for user-facing lines.
#pragma once

#include <string>

#include "ddpv/core/error.hpp"

namespace ddpv {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

// The threshold starts at kInfo, or at DDPV_LOG_LEVEL (debug|info|warn|error|off) when set:
// a run-time choice for the user, not a build switch.
void set_log_level(LogLevel level);
LogLevel log_level();
LogLevel parse_log_level(const std::string& name);  // throws Error on an unknown name

// Writes "ddpv[rank R] LEVEL: message" to stderr as one write, so lines of ranks do not mix.
void log_message(LogLevel level, const std::string& message);

}  // namespace ddpv

#define DDPV_LOG(level, ...)                                                     \
  do {                                                                           \
    if (::ddpv::LogLevel::level >= ::ddpv::log_level())                          \
      ::ddpv::log_message(::ddpv::LogLevel::level, ::ddpv::detail::concat(__VA_ARGS__)); \
  } while (0)
#define DDPV_DEBUG(...) DDPV_LOG(kDebug, __VA_ARGS__)
#define DDPV_INFO(...) DDPV_LOG(kInfo, __VA_ARGS__)
#define DDPV_WARN(...) DDPV_LOG(kWarn, __VA_ARGS__)
