// ddpv::Error and its rank/host context.
#include "ddpv/core/error.hpp"

#include <unistd.h>

#include <atomic>
#include <cstring>

namespace ddpv {
namespace {
std::atomic<int> g_rank{-1};  // see Note [Error context]

const char* basename_of(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}
}  // namespace

void set_error_rank(int rank) { g_rank.store(rank); }
int error_rank() { return g_rank.load(); }

const std::string& host_name() {
  static const std::string name = [] {
    char buf[256] = {0};
    if (gethostname(buf, sizeof(buf) - 1) != 0) return std::string("unknown-host");
    return std::string(buf);
  }();
  return name;
}

Error::Error(const std::string& message, const char* file, int line)
    : std::runtime_error([&] {
        std::string where = error_rank() >= 0
                                ? "rank " + std::to_string(error_rank()) + " on " + host_name()
                                : host_name();
        return message + " [" + where + ", " + basename_of(file) + ":" + std::to_string(line) + "]";
      }()),
      message_(message),
      location_(std::string(basename_of(file)) + ":" + std::to_string(line)) {}

void write_line(const std::string& line) {
  const std::string text = line + "\n";
  ssize_t ignored = ::write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
}

void throw_error(const std::string& message, const char* file, int line) {
  throw Error(message, file, line);
}

}  // namespace ddpv
