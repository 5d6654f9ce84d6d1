#!/usr/bin/env bash
# `make fuzz`: builds the libFuzzer programs (fuzz/targets/, docs/fuzzing.md) with clang,
# AddressSanitizer and UBSan in a build of their own (FUZZ_DIR, default build-fuzz) and runs
# each target for FUZZ_SECONDS (default 60), JOBS at a time. A target's working corpus
# (FUZZ_DIR/corpus/<target>) starts from fuzz/corpus/<target> and fuzz/regressions/<target>
# and grows from run to run. libFuzzer runs in fork mode and keeps going past a finding; each
# one is then run again alone and triaged (scripts/fuzz_triage.py): one of ours fails the run,
# one inside libhdf5/libpng/libjpeg is kept under FUZZ_DIR/runs/<stamp>/<target>/ and listed.
# Environment: FUZZ_DIR, FUZZ_SECONDS, FUZZ_TARGETS (names, default all), JOBS, FUZZ_CC,
# FUZZ_CXX, MPICXX.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${FUZZ_DIR:-build-fuzz}"
case "$dir" in /*) ;; *) dir="$here/$dir" ;; esac
seconds="${FUZZ_SECONDS:-60}"
jobs="${JOBS:-$(nproc)}"
cc="${FUZZ_CC:-clang}" cxx="${FUZZ_CXX:-clang++}"
if ! command -v "$cxx" >/dev/null; then
  echo "fuzz: $cxx not found: run scripts/install-deps.sh --fuzz (clang and its libFuzzer runtime)" >&2
  exit 1
fi
# -Wno-pass-failed: the instrumented loops no longer vectorise where `#pragma omp simd` asks.
flags="-fsanitize=address,undefined,fuzzer-no-link -fno-omit-frame-pointer -fno-sanitize-recover=undefined -g -Wno-pass-failed"
mkdir -p "$dir"
cmake -S "$here" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDPV_WITH_CUDA=OFF \
  -DDDPV_BUILD_TESTS=OFF -DDDPV_BUILD_BENCH=OFF -DDDPV_FUZZ=ON \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" -DMPI_CXX_COMPILER="${MPICXX:-mpicxx}" \
  "-DCMAKE_C_FLAGS=$flags" "-DCMAKE_CXX_FLAGS=$flags" \
  "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined" >"$dir/configure.log" 2>&1 ||
  { cat "$dir/configure.log"; exit 1; }
cmake --build "$dir" -j "$jobs" --target fuzz-programs

if [[ -n "${FUZZ_TARGETS:-}" ]]; then
  read -r -a targets <<<"$FUZZ_TARGETS"
else
  targets=()
  for f in "$here"/fuzz/targets/*.cpp; do targets+=("$(basename "$f" .cpp)"); done
fi
runs="$dir/runs/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$runs"
# Leak detection is off: libhdf5 keeps free lists and its error stacks to the end of the
# process, which LeakSanitizer reports after every input that made it fail.
export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=0"
export UBSAN_OPTIONS="print_stacktrace=1"

fuzz_one() {
  local t=$1 work="$dir/corpus/$1" art="$runs/$1"
  mkdir -p "$work" "$art"
  local seeds=("$here/fuzz/corpus/$t")
  [[ -d "$here/fuzz/regressions/$t" ]] && seeds+=("$here/fuzz/regressions/$t")
  (cd "$art" && timeout -k 10 $((seconds + 120)) "$dir/bin/ddpv-fuzz-$t" -fork=1 \
    -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1 -max_total_time="$seconds" \
    -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=30 -artifact_prefix="$art/" \
    "$work" "${seeds[@]}" >"$art/log" 2>&1) || true
}

running=0
for t in "${targets[@]}"; do
  [[ -x "$dir/bin/ddpv-fuzz-$t" ]] || { echo "fuzz: no target '$t'" >&2; exit 2; }
  fuzz_one "$t" &
  running=$((running + 1))
  if ((running >= jobs)); then wait -n; running=$((running - 1)); fi
done
wait

status=0
for t in "${targets[@]}"; do
  art="$runs/$t"
  last=$(grep -E '^#[0-9]+: cov: ' "$art/log" | tail -1 || true)
  execs=$(sed -E 's/^#([0-9]+):.*/\1/' <<<"$last")
  cov=$(sed -E 's/.* cov: ([0-9]+).*/\1/' <<<"$last")
  shopt -s nullglob
  found=("$art"/crash-* "$art"/oom-* "$art"/timeout-* "$art"/leak-*)
  shopt -u nullglob
  found=("${found[@]/%.report/}")
  echo "fuzz: $t: ${execs:-0} inputs in ${seconds} s, cov ${cov:-?}, ${#found[@]} finding(s)"
  if [[ -z "$last" ]]; then
    echo "fuzz: $t did not run: see $art/log" >&2
    tail -20 "$art/log" >&2
    status=1
    continue
  fi
  if ((${#found[@]} > 0)); then
    "$here/scripts/fuzz_triage.py" "$here" "$dir/bin/ddpv-fuzz-$t" "${found[@]}" || status=1
  fi
done
if ((status != 0)); then
  echo "fuzz: a finding of ours (its report beside it, ARTIFACT.report) or a target that did not run; reproduce with $dir/bin/ddpv-fuzz-TARGET ARTIFACT" >&2
  exit 1
fi
echo "fuzz: no finding of ours in ${#targets[@]} targets (runs in $runs)"
