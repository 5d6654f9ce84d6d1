// Progress bar and duration formatting.
#include "train/console.hpp"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ddpv {

std::string format_duration(double seconds) {
  // An ETA from a rate near zero can be any size; past a million hours it says nothing, and
  // past 9e18 seconds the conversion below would be undefined.
  constexpr double kLongest = 3600.0 * 1e6;
  if (!std::isfinite(seconds) || seconds < 0 || seconds >= kLongest) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  }
  return buf;
}

bool stdout_is_terminal() {
  if (!isatty(STDOUT_FILENO)) return false;
  if (std::getenv("OMPI_COMM_WORLD_RANK") == nullptr) return true;
  // The launcher (mpirun, or orted on other nodes) is our parent: look at where its stdout goes.
  char link[64], target[256];
  std::snprintf(link, sizeof link, "/proc/%d/fd/1", static_cast<int>(getppid()));
  const ssize_t n = readlink(link, target, sizeof target - 1);
  if (n <= 0) return false;
  target[n] = '\0';
  return std::strncmp(target, "/dev/pts/", 9) == 0 || std::strncmp(target, "/dev/tty", 8) == 0;
}

void ProgressBar::update(int64_t epoch, int64_t epochs, int64_t step, int64_t steps, double loss,
                         double images_per_s, double eta_s) {
  if (!enabled_) return;
  const double now =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  if (step < steps && now - last_draw_ < 0.2) return;
  last_draw_ = now;
  constexpr int kWidth = 24;
  const int filled = steps > 0 ? static_cast<int>(kWidth * step / steps) : 0;
  char bar[kWidth + 1];
  for (int i = 0; i < kWidth; ++i) bar[i] = i < filled ? '#' : '.';
  bar[kWidth] = '\0';
  std::printf("\r\033[Kepoch %lld/%lld [%s] %lld/%lld loss %.4f %.0f img/s ETA %s",
              static_cast<long long>(epoch), static_cast<long long>(epochs), bar,
              static_cast<long long>(step), static_cast<long long>(steps), loss, images_per_s,
              format_duration(eta_s).c_str());
  std::fflush(stdout);
  drawn_ = true;
}

void ProgressBar::clear() {
  if (!drawn_) return;
  std::printf("\r\033[K");
  std::fflush(stdout);
  drawn_ = false;
}

}  // namespace ddpv
