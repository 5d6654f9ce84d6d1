#!/usr/bin/env bash
# Note [Shared update] end to end (mpirun -np 2, CPU): the shared update's checkpoint equals
# the allreduce path's (--no-shared-update) bit for bit, parameters and momentum; it leaves
# nothing in /dev/shm, even when a rank is killed (and the job ends); and where /dev/shm is too
# small (a 1 MiB tmpfs in a private mount namespace, when root may make one), every rank warns,
# keeps a copy of the model and trains to the same checkpoint.
source "$(dirname "$0")/lib.sh"
common=(--synthetic --synthetic-size 512 --model lenet --device cpu --threads 1 --batch-size 16
        --max-steps 12 --deterministic --seed 5 --lr 0.05 --momentum 0.9 --weight-decay 5e-4
        --val-split none --log-every 4 --no-progress)
before=$(ls /dev/shm | grep -c '^ddpv-' || true)
run() {  # run NAME [args...]: trains into $WORK/NAME, log in $WORK/NAME.log
  local name=$1; shift
  mpirun_np 2 "$BIN/ddpv-train" "${common[@]}" --checkpoint-dir "$WORK/$name" "$@" \
    >"$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "run $name ($*) failed"; }
}
final() { echo "$WORK/$1/$(cat "$WORK/$1/latest")"; }
same() {  # same A B: the final checkpoints' /params and /optimizer are equal bit for bit
  for g in /params /optimizer; do
    h5diff -r "$(final "$1")" "$(final "$2")" "$g" "$g" >"$WORK/diff.txt" 2>&1 ||
      { head -20 "$WORK/diff.txt"; fail "$2: $g differs from $1"; }
  done
}

run shared
grep -q "shared update (2 ranks per node x 1 node" "$WORK/shared.log" ||
  { cat "$WORK/shared.log"; fail "2 ranks on one node did not use the shared update"; }
run allreduce --no-shared-update
grep -q "mpi (.*(--no-shared-update)" "$WORK/allreduce.log" ||
  { cat "$WORK/allreduce.log"; fail "--no-shared-update did not select the allreduce"; }
same allreduce shared
# The run moved the parameters: otherwise equal checkpoints prove nothing.
"$PY" - "$(final shared)" <<'PYEOF' || fail "the momentum is zero after 12 steps: did SGD run?"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
names = []
f["optimizer"].visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
assert names and max(float(np.abs(np.asarray(f["optimizer"][n])).max()) for n in names) > 0
PYEOF
after=$(ls /dev/shm | grep -c '^ddpv-' || true)
[ "$after" = "$before" ] || fail "shared memory objects left in /dev/shm: $(ls /dev/shm | grep '^ddpv-')"

# A rank killed in the middle of training (a node failure): the job ends, non-zero, well
# within 30 s; no rank hangs in the node's barrier and nothing is left in /dev/shm.
long=(--synthetic --synthetic-size 100000 --model lenet --device cpu --threads 1 --batch-size 16
      --epochs 50 --val-split none --no-progress)
mpirun_np 2 "$BIN/ddpv-train" "${long[@]}" >"$WORK/kill.log" 2>&1 &
job=$!
for _ in $(seq 300); do
  grep -q "shared update (2 ranks per node" "$WORK/kill.log" && break
  sleep 0.1
done
grep -q "shared update (2 ranks per node" "$WORK/kill.log" ||
  { cat "$WORK/kill.log"; fail "the long run did not start with the shared update"; }
sleep 1  # into the steps
# The ranks' own command lines (mpirun's names ddpv-train and its arguments too).
ranks='^[^ ]*/ddpv-train .*--synthetic-size 100000'
victim=$(pgrep -f -- "$ranks" | tail -1)
[ -n "$victim" ] || fail "no rank of the long run to kill"
kill -9 "$victim"
for _ in $(seq 300); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$job" 2>/dev/null; then fail "the job still runs 30 s after a rank was killed"; fi
rc=0
wait "$job" || rc=$?
[ "$rc" -ne 0 ] || fail "the job exited 0 after a rank was killed"
[ -z "$(pgrep -f -- "$ranks")" ] || fail "a rank outlived the job"
after=$(ls /dev/shm | grep -c '^ddpv-' || true)
[ "$after" = "$before" ] || fail "a killed run left shared memory in /dev/shm: $(ls /dev/shm | grep '^ddpv-')"

if [ "$(id -u)" -eq 0 ] && command -v unshare >/dev/null &&
   unshare -m --propagation private sh -c 'mount -t tmpfs -o size=1m tmpfs /dev/shm' 2>/dev/null; then
  # Open MPI's own shared-memory transport may complain about the small /dev/shm too; the
  # trainer must still start, fall back and train.
  unshare -m --propagation private bash -c \
    'mount -t tmpfs -o size=1m tmpfs /dev/shm && "$@"' _ \
    "${DDPV_MPIRUN:-mpirun}" -np 2 "${MPIRUN_ARGS[@]}" "$BIN/ddpv-train" "${common[@]}" \
    --checkpoint-dir "$WORK/full" >"$WORK/full.log" 2>&1 ||
    { cat "$WORK/full.log"; fail "the run with a full /dev/shm failed instead of falling back"; }
  grep -q "warning: shared update: reserving .* in /dev/shm: No space left on device; each rank keeps a copy" \
    "$WORK/full.log" || { cat "$WORK/full.log"; fail "no warning naming the full /dev/shm"; }
  grep -q "(shared memory failed on 1 rank(s), see the warning)" "$WORK/full.log" ||
    { cat "$WORK/full.log"; fail "rank 0 did not say why the shared update is off"; }
  same shared full
else
  echo "skipped the full /dev/shm case: needs root and unshare -m"
fi
echo PASS
