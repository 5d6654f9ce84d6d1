#!/usr/bin/env bash
# scripts/fuzz_triage.py on real reports kept from fuzz runs (tests/fixtures/fuzz-reports/,
# with the checkout's path replaced by /REPO): each file's name starts with the verdict it must
# get. They cover a UBSan report in our code, a libhdf5 crash on its own heap (library),
# libhdf5 overrunning a buffer our code allocated (ours: we gave it the wrong size), and a
# hang inside Boost that our code called with text it could have refused (ours).
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
py="${DDPV_PYTHON3:-python3}"
fail=0
for f in "$here"/tests/fixtures/fuzz-reports/*.txt; do
  want=$(basename "$f" | cut -d- -f1)
  got=$("$py" -c "
import sys
sys.path.insert(0, '$here/scripts')
import fuzz_triage
print(fuzz_triage.classify(open(sys.argv[1]).read(), '/REPO')[0])" "$f")
  if [[ "$got" != "$want" ]]; then
    echo "FAIL: $(basename "$f"): triaged '$got', expected '$want'"
    fail=1
  else
    echo "ok: $(basename "$f"): $got"
  fi
done
# A report with nothing a sanitizer or libFuzzer says is no finding.
got=$("$py" -c "
import sys
sys.path.insert(0, '$here/scripts')
import fuzz_triage
print(fuzz_triage.classify('INFO: Running with entropic power schedule\nDone 1 runs\n', '/REPO')[0])")
[[ "$got" == flaky ]] || { echo "FAIL: a clean run triaged '$got'"; fail=1; }
exit $fail
