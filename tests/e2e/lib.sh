# Shared helpers of the end-to-end tests (sourced, not run). CTest sets DDPV_BIN_DIR,
# DDPV_SOURCE_DIR, DDPV_MPIRUN and DDPV_MPIRUN_ARGS.
set -euo pipefail
BIN=${DDPV_BIN_DIR:?run through ctest (DDPV_BIN_DIR unset)}
SRC=${DDPV_SOURCE_DIR:?}
PY=${DDPV_PYTHON3:-/usr/bin/python3}
read -r -a MPIRUN_ARGS <<<"${DDPV_MPIRUN_ARGS:-}"
WORK=$(mktemp -d /tmp/ddpv-e2e.XXXXXX)
# On any exit: no background job (an mpirun under test) may outlive the test.
trap 'kill -9 $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
mpirun_np() { local np=$1; shift; "${DDPV_MPIRUN:-mpirun}" -np "$np" "${MPIRUN_ARGS[@]}" "$@"; }
MPI2=("${DDPV_MPIRUN:-mpirun}" -np 2 "${MPIRUN_ARGS[@]}")  # for commands run under `timeout`

# make_store DIR [make_tiny_store.py args...] -> DIR/tiny.h5
make_store() {
  local dir=$1; shift
  "$PY" "$SRC/tests/e2e/make_tiny_store.py" "$dir/idx" "$@"
  "$BIN/ddpv-convert" idx --train-images "$dir/idx/train-images" --train-labels "$dir/idx/train-labels" \
    --test-images "$dir/idx/test-images" --test-labels "$dir/idx/test-labels" --out "$dir/tiny.h5" >/dev/null
}

# json_field FILE EVENT KEY: the value of KEY in the last record of EVENT in a metrics file.
json_field() {
  "$PY" - "$1" "$2" "$3" <<'PYEOF'
import json, sys
path, event, key = sys.argv[1:]
rec = [json.loads(l) for l in open(path) if l.strip()]
rec = [r for r in rec if r.get("event") == event]
print(rec[-1][key] if rec else "missing")
PYEOF
}

# wait_for_steps METRICS: waits until the metrics file shows a step record (training has begun).
wait_for_steps() {
  for _ in $(seq 1 300); do grep -q '"event": "step"' "$1" 2>/dev/null && return 0; sleep 0.1; done
  fail "training did not start within 30 s"
}

# rank_pid MPIRUN_PID RANK: the pid of that rank's ddpv-train under that mpirun.
rank_pid() {
  local p
  for p in $(pgrep -P "$1" -f ddpv-train); do
    tr '\0' '\n' <"/proc/$p/environ" | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo "$p"; return; }
  done
  fail "no rank $2 under mpirun $1"
}
