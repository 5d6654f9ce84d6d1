#!/usr/bin/env bash
# An exception on one rank ends the whole MPI job: mpirun -np 2 where rank 1 throws in the
# middle of training must exit non-zero within 30 s, with one line naming rank 1 and the host.
set -uo pipefail
tool="${DDPV_BIN_DIR:?}/dist_abort_tool"
[[ -x "$tool" ]] || { echo "skip: $tool not built"; exit 77; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
for progress in nonblocking thread; do
  echo "== MPI progress: $progress"
  start=$(date +%s)
  # shellcheck disable=SC2086  # DDPV_MPIRUN_ARGS is a list of words
  timeout 60 "${DDPV_MPIRUN:-mpirun}" -np 2 ${DDPV_MPIRUN_ARGS:-} "$tool" 1 20 "$progress" \
    >"$out" 2>&1
  rc=$?
  elapsed=$(( $(date +%s) - start ))
  cat "$out"
  [[ $rc -ne 0 ]] || fail "the job exited 0"
  [[ $rc -ne 124 ]] || fail "the job hung (killed by timeout after 60 s)"
  (( elapsed <= 30 )) || fail "the job took ${elapsed} s to end (limit 30 s)"
  line="dist_abort_tool: rank 1 on $(hostname): injected failure in backward at step 20"
  n=$(grep -cF "$line" "$out")
  [[ $n -eq 1 ]] || fail "expected exactly one line '$line...', found $n"
  grep -F "$line" "$out" | grep -q "dist_abort_tool.cpp:" || fail "the line does not name file:line"
  if grep -q "dist_abort_tool: rank 0" "$out"; then fail "rank 0 reported an error of its own"; fi
  echo "ok ($progress): exit code $rc after ${elapsed} s"
done
