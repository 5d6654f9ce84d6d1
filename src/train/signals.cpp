// Stop signals, collected by a watcher thread (Note [No signal on a compute thread]).
#include "train/signals.hpp"

#include <pthread.h>

#include <csignal>
#include <ctime>
#include <initializer_list>

namespace ddpv {
namespace {

std::atomic<int> g_stop_signal{0};  // Note [Stop signals]

sigset_t stop_set() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kStopSignals) sigaddset(&set, sig);
  return set;
}

}  // namespace

void block_stop_signals() {
  const sigset_t set = stop_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

StopSignalWatcher::StopSignalWatcher() {
  block_stop_signals();  // in case main() did not (tests): the watcher must be the only taker
  thread_ = std::thread([this] {
    const sigset_t set = stop_set();
    const timespec tick{0, 100 * 1000 * 1000};  // check quit_ ten times a second
    while (!quit_.load()) {
      const int sig = sigtimedwait(&set, nullptr, &tick);
      if (sig > 0) g_stop_signal.store(sig);
    }
  });
}

StopSignalWatcher::~StopSignalWatcher() {
  quit_.store(true);
  if (thread_.joinable()) thread_.join();
}

int stop_signal_received() { return g_stop_signal.load(); }

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGINT:
      return "SIGINT";
    default:
      return "a signal";
  }
}

}  // namespace ddpv
