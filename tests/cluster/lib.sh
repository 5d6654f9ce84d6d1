# The preamble of tests/cluster/*_test.sh (sourced, not run): the source, build and binary
# folders, and log/skip/fail helpers that name the sourcing test. A test may redefine fail()
# to print more (slurm_test.sh prints its jobs' output).
# shellcheck shell=bash
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${BUILD_DIR:-build}
case "$build" in /*) ;; *) build=$root/$build ;; esac
bin=${DDPV_BIN_DIR:-$build/bin}
py=/usr/bin/python3
t0=$(date +%s)
test_name=$(basename "$0" .sh)

log() { echo "$test_name [$(( $(date +%s) - t0 )) s]: $*"; }
skip() { echo "$test_name: SKIP: $*"; exit 77; }
fail() { echo "$test_name: FAIL: $*"; exit 1; }
