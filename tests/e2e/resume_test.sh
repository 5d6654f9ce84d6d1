#!/usr/bin/env bash
# With --deterministic, 2 epochs straight and 1 epoch + resume for 1 more end with bit-identical
# parameters, buffers and momentum (mpirun -np 2); so does a resume from the middle of an epoch.
source "$(dirname "$0")/lib.sh"
make_store "$WORK" --train 400 --test 100
common=(--data "$WORK/tiny.h5" --model resnet20 --epochs 2 --batch-size 16 --lr 0.05
        --deterministic --lr-schedule cosine --warmup-epochs 0.5 --val-split none --no-progress)
run() { mpirun_np 2 "$BIN/ddpv-train" "${common[@]}" "$@" >"$WORK/log.txt" 2>&1 || { cat "$WORK/log.txt"; fail "run $* failed"; }; }
run --checkpoint-dir "$WORK/straight"
run --checkpoint-dir "$WORK/split" --run-steps 13          # 13 steps of 13 per epoch: one epoch
grep -q "ckpt-e0001-s00000013" "$WORK/split/latest" || fail "no checkpoint after the first epoch"
run --checkpoint-dir "$WORK/split" --resume auto
run --checkpoint-dir "$WORK/mid" --run-steps 5              # stop inside epoch 1
run --checkpoint-dir "$WORK/mid" --resume auto --run-steps 11
run --checkpoint-dir "$WORK/mid" --resume auto
final() { echo "$1/$(cat "$1/latest")"; }
same() {  # same DIR GROUP [h5diff options]: the group of DIR's final checkpoint equals straight's
  local d=$1 g=$2; shift 2
  h5diff -r "$@" "$(final "$WORK/straight")" "$(final "$WORK/$d")" "$g" "$g" >"$WORK/diff.txt" 2>&1 ||
    { head -20 "$WORK/diff.txt"; fail "$d: $g differs from the straight run"; }
}
for g in /params /buffers /optimizer; do same split "$g"; done
same mid /params
same mid /optimizer
# BatchNorm running statistics are averaged over ranks when a checkpoint is written. Averaging
# is linear, as is their running-average update, so averaging in the middle of an epoch changes
# them only by rounding: equal to 1e-6 of each tensor's largest entry, not bit for bit
# (docs/architecture.md). Per element relative would not do: a channel whose mean is ~1e-8
# (ranks' means of ~1e-2 cancelling) differs by 26% in its rounding noise.
"$PY" - "$(final "$WORK/straight")" "$(final "$WORK/mid")" <<'PYEOF' || fail "mid: /buffers differ from the straight run by more than rounding"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r")["buffers"], h5py.File(sys.argv[2], "r")["buffers"]
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
for k in a:
    x, y = np.asarray(a[k], dtype=np.float64), np.asarray(b[k], dtype=np.float64)
    err = np.abs(x - y).max() / max(np.abs(x).max(), 1e-30)
    if err > 1e-6:
        sys.exit(f"buffer {k}: differs by {err:.3g} of its largest entry")
PYEOF
# A resumed run is not a fresh one: the split run's final checkpoint says step 26.
h5dump -a /step "$(final "$WORK/split")" | grep -q "26" || fail "final step attribute is not 26"
echo "PASS"
