#!/usr/bin/env bash
# Runs every tests/cluster/*_test.sh (what `make test-cluster` does) with a time limit each;
# prints one line per test with its result and duration. Exit 77 of a test = skipped, which
# does not fail the run; any other non-zero status does.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
limit=${CLUSTER_TEST_TIMEOUT:-300}
failed=0
summary=()
for t in "$here"/*_test.sh; do
  name=$(basename "$t" .sh)
  echo "==== $name"
  start=$(date +%s)
  timeout --kill-after=20 "$limit" bash "$t"
  rc=$?
  took=$(( $(date +%s) - start ))
  case $rc in
    0) result=passed ;;
    77) result=skipped ;;
    124|137) result="FAILED (timed out after $limit s)"; failed=1 ;;
    *) result="FAILED (status $rc)"; failed=1 ;;
  esac
  summary+=("$(printf '%-18s %-34s %4d s' "$name" "$result" "$took")")
done
echo "==== cluster tests"
printf '%s\n' "${summary[@]}"
exit $failed
