#!/usr/bin/env python3
"""throttle.py STOPPED PERIOD_MS -- CMD [ARGS...]: run CMD, stopped (SIGSTOP) for the fraction
STOPPED of every PERIOD_MS milliseconds and running (SIGCONT) for the rest, and exit with its
status: a rank on a throttled or shared node, made on purpose for the tests of Note [Rank
times] and Note [Balanced batches] (SLOW_RANK in lib.sh). Unlike a slower kernel it slows the
rank alike on every CPU and under any build (sanitizers included); like a node's CPU quota it
stretches work longer than a period, not a burst that fits in the running part of one.
SIGTERM and SIGINT are passed on (after a SIGCONT, so a stopped CMD can act on them); CMD is
killed if this wrapper dies first, so no stopped rank outlives its job."""
import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1


def main(argv):
    if len(argv) < 5 or argv[3] != "--":
        sys.exit("usage: throttle.py STOPPED PERIOD_MS -- CMD [ARGS...]")
    stopped, period = float(argv[1]), float(argv[2]) / 1000.0
    if not 0.0 <= stopped < 1.0 or period <= 0.0:
        sys.exit("throttle.py: STOPPED must be in [0, 1) and PERIOD_MS positive")
    cmd = argv[4:]
    libc = ctypes.CDLL(None, use_errno=True)
    pid = os.fork()
    if pid == 0:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() == 1:  # the wrapper died before the line above
            os._exit(1)
        try:
            os.execvp(cmd[0], cmd)
        except OSError as e:
            print(f"throttle.py: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
            os._exit(127)

    passed_on = []

    def forward(signum, _frame):
        passed_on.append(signum)  # no more stops: let CMD shut down at its own pace
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    status = None
    while status is None:
        time.sleep(period * (1.0 - stopped))
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
            break
        if stopped > 0.0 and not passed_on:
            try:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(period * stopped)
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
