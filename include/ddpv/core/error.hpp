// ddpv::Error, the one exception type of the project, and the check macros built on it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ddpv {

// Thrown by every failed check. what() reads
//   "<message> [rank R on HOST, file.cpp:42]"
// so a failure on node 37 of 64 says where it happened (see Note [Error context]).
class Error : public std::runtime_error {
 public:
  Error(const std::string& message, const char* file, int line);
  const std::string& message() const { return message_; }
  const std::string& location() const { return location_; }

 private:
  std::string message_;
  std::string location_;
};

// Note [Error context]: the rank is known only after MPI starts, and an error raised before
// that (option parsing, a bad store path) says "host" alone. World sets the rank once; it is
// process-wide state by nature (one process = one rank), not a singleton object.
void set_error_rank(int rank);
int error_rank();  // -1 until set
const std::string& host_name();

// Writes `line` and a newline to stderr in one write(2), so that the line is not interleaved
// with other ranks' output (the error lines of abort paths).
void write_line(const std::string& line);

// Builds the "[rank R on HOST, file:line]" suffix and throws.
[[noreturn]] void throw_error(const std::string& message, const char* file, int line);

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace ddpv

// Throws ddpv::Error with the streamed arguments as message: DDPV_FAIL("bad shape ", s).
#define DDPV_FAIL(...) ::ddpv::throw_error(::ddpv::detail::concat(__VA_ARGS__), __FILE__, __LINE__)

// Throws unless cond holds: DDPV_CHECK(n > 0, "batch size must be positive, got ", n).
#define DDPV_CHECK(cond, ...)                                                       \
  do {                                                                              \
    if (!(cond)) [[unlikely]]                                                       \
      ::ddpv::throw_error(::ddpv::detail::concat(__VA_ARGS__), __FILE__, __LINE__); \
  } while (0)
