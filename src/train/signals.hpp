// Stop requests from the batch system: SIGTERM and SIGUSR1 (what Slurm sends before a time
// limit or a preemption) ask the trainer to finish its step, checkpoint and exit 0.
#pragma once

namespace ddpv {

// Note [Stop signals]: a signal handler may only set a flag, and signal dispositions are
// process-wide by nature, so this is the one piece of process-global state of the trainer.
// The flag is read once per step and agreed across ranks in the step's metrics allreduce, so
// all ranks stop after the same step even when only some of them received the signal.
void install_stop_handlers();   // SIGTERM, SIGUSR1 (and SIGINT)
int stop_signal_received();     // the signal number, or 0
const char* signal_name(int sig);

}  // namespace ddpv
