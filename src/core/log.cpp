// Leveled logging to stderr, one write per line.
#include "ddpv/core/log.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdlib>

namespace ddpv {
namespace {
LogLevel initial_level() {
  const char* env = std::getenv("DDPV_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return LogLevel::kInfo;
  try {
    return parse_log_level(env);
  } catch (const Error&) {
    return LogLevel::kInfo;
  }
}
std::atomic<LogLevel>& level_ref() {
  static std::atomic<LogLevel> level{initial_level()};
  return level;
}
const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warning";
    case LogLevel::kError: return "error";
    case LogLevel::kOff: return "off";
  }
  return "?";
}
}  // namespace

void set_log_level(LogLevel level) { level_ref().store(level); }
LogLevel log_level() { return level_ref().load(); }

LogLevel parse_log_level(const std::string& name) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "info") return LogLevel::kInfo;
  if (name == "warn" || name == "warning") return LogLevel::kWarn;
  if (name == "error") return LogLevel::kError;
  if (name == "off") return LogLevel::kOff;
  DDPV_FAIL("unknown log level '", name, "': use debug, info, warn, error or off");
}

void log_message(LogLevel level, const std::string& message) {
  std::string line = "ddpv";
  if (error_rank() >= 0) line += "[rank " + std::to_string(error_rank()) + "]";
  line += " ";
  line += level_name(level);
  line += ": ";
  line += message;
  line += '\n';
  // One write(2) per line so that lines from ranks sharing a terminal do not interleave.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace ddpv
