// Stop requests from the batch system: SIGTERM and SIGUSR1 (what Slurm sends before a time
// limit or a preemption) ask the trainer to finish its step, checkpoint and exit 0.
#pragma once

#include <atomic>
#include <csignal>
#include <thread>

namespace ddpv {

// Note [Stop signals]: the request is a flag, read once per step and agreed across ranks in the
// step's metrics allreduce, so all ranks stop after the same step even when only some of them
// received the signal. Signal dispositions are process-wide by nature, so the flag is the one
// piece of process-global state of the trainer.
//
// Note [No signal on a compute thread]: oneDNN 2.x's JIT GEMM kernels point rsp into the heap
// while they run (oneDNN issue 4845, fixed in 2026): a signal delivered to a thread inside one
// of them pushes its frame onto the heap. We saw exactly that: about one SIGUSR1 in eight
// aborted a rank inside the next free(). So no thread of ours ever takes a stop signal: main()
// blocks them before any thread starts (every thread inherits the mask), and a watcher thread
// collects them with sigtimedwait(), which delivers nothing on any stack.
void block_stop_signals();  // at the top of main(), before MPI or any thread starts

// Runs the watcher thread for its lifetime (the training loop's).
class StopSignalWatcher {
 public:
  StopSignalWatcher();
  ~StopSignalWatcher();
  StopSignalWatcher(const StopSignalWatcher&) = delete;
  StopSignalWatcher& operator=(const StopSignalWatcher&) = delete;

 private:
  std::atomic<bool> quit_{false};
  std::thread thread_;
};

// The signals that stop a run. Each step's agreement counts, per signal, the ranks that have
// seen it (Note [One agreement per step]), so every rank learns which signal stopped the run
// even where it has not received one itself yet; if the ranks saw different ones, the first
// here wins.
inline constexpr int kStopSignals[] = {SIGTERM, SIGUSR1, SIGINT};

int stop_signal_received();  // the signal number, or 0
const char* signal_name(int sig);

}  // namespace ddpv
