#!/usr/bin/env bash
# The test suite under AddressSanitizer and UndefinedBehaviorSanitizer (`make sanitize`), in a
# build of its own (SANITIZE_DIR, default build-sanitize): the CPU backend only, since the
# sanitizers cannot follow the GPU runtime. Every process the tests start (mpirun's ranks, the
# converter, the trainers that bad-input tests expect to fail) writes its reports to one
# folder, so a report fails the run even where the test only checked for a non-zero exit.
#   1. every test, leak detection off: Open MPI and HDF5 keep allocations to the end of the
#      process, some from components they unloaded, whose frames cannot be named for a
#      suppression;
#   2. the unit tests that start no MPI, leak detection on.
# Environment: SANITIZE_DIR, JOBS, CC, CXX, MPICXX, MPIRUN (as Makefile.inc sets them).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${SANITIZE_DIR:-build-sanitize}"
case "$dir" in /*) ;; *) dir="$here/$dir" ;; esac
jobs="${JOBS:-$(nproc)}"
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"

cmake -S "$here" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDPV_WITH_CUDA=OFF \
  -DCMAKE_C_COMPILER="${CC:-gcc}" -DCMAKE_CXX_COMPILER="${CXX:-g++}" \
  -DMPI_CXX_COMPILER="${MPICXX:-mpicxx}" -DDDPV_MPIRUN="${MPIRUN:-mpirun}" \
  "-DCMAKE_C_FLAGS=$flags" "-DCMAKE_CXX_FLAGS=$flags" \
  "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined" \
  "-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address,undefined"
cmake --build "$dir" -j "$jobs"

reports="$dir/sanitizer-reports"
rm -rf "$reports"
mkdir -p "$reports"
export UBSAN_OPTIONS="print_stacktrace=1:log_path=$reports/ubsan"
status=0
(cd "$dir" && ASAN_OPTIONS="detect_leaks=0:log_path=$reports/asan" \
  ctest --output-on-failure -j "$jobs" --timeout 1800) || status=1
(cd "$dir" && ASAN_OPTIONS="detect_leaks=1:log_path=$reports/leaks" \
  ctest --output-on-failure -j "$jobs" --timeout 1800 -R '^unit[.]' -E 'dist_|cuda_') || status=1

shopt -s nullglob
found=("$reports"/*)
if ((${#found[@]} > 0)); then
  for f in "${found[@]}"; do
    echo "==== $f"
    cat "$f"
  done
  echo "sanitize: ${#found[@]} sanitizer report(s) in $reports: read them above, fix the code, run again" >&2
  exit 1
fi
if ((status != 0)); then
  echo "sanitize: tests failed in the sanitizer build ($dir): see ctest's output above" >&2
  exit 1
fi
echo "sanitize: every test passed with no AddressSanitizer, LeakSanitizer or UBSan report"
