// What rank 0 shows the user: the progress bar with ETA inside an epoch (terminals only), one
// line per epoch and the final summary.
#pragma once

#include <cstdint>
#include <string>

namespace ddpv {

// "1:02:03" or "2:03", rounded to the second; "?" for NaN, negative or a million hours and more.
std::string format_duration(double seconds);

// Whether the user sees this process's stdout on a terminal. Under Open MPI a rank's stdout is
// a pseudo-terminal of mpirun's even when mpirun's own output goes to a file or a pipe, so for
// a launched rank the answer is whether the launcher's stdout is a terminal.
bool stdout_is_terminal();

class ProgressBar {
 public:
  // enabled: rank 0 and stdout is a terminal (and --progress).
  explicit ProgressBar(bool enabled) : enabled_(enabled) {}
  // Redraws at most every 0.2 s: "epoch 3/10 [#####     ] 120/266 loss 0.41 1234 img/s ETA 0:12".
  void update(int64_t epoch, int64_t epochs, int64_t step, int64_t steps, double loss,
              double images_per_s, double eta_s);
  void clear();  // wipes the bar before a normal line is printed
  bool enabled() const { return enabled_; }

 private:
  bool enabled_;
  bool drawn_ = false;
  double last_draw_ = -1;
};

}  // namespace ddpv
