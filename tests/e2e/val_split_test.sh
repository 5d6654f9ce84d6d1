#!/usr/bin/env bash
# The data defaults that must work on any store (issue 43, item 4), under mpirun -np 2:
# --val-split auto takes val, else test, else evaluates nothing; a split that is not there is
# named once with the splits that are; --eval-only evaluates a checkpoint on any split (loss,
# top-1, top-5) the same on 1 and 2 ranks and writes nothing; --drop-last drops each epoch's
# short step.
source "$(dirname "$0")/lib.sh"
make_store "$WORK" --train 300 --test 103
# The same images with the test split renamed val (a store made by `ddpv-convert folder` has
# train and val), and one with no evaluation split at all.
cp "$WORK/tiny.h5" "$WORK/val.h5"
cp "$WORK/tiny.h5" "$WORK/none.h5"
"$PY" - "$WORK" <<'EOF'
import sys, h5py
with h5py.File(sys.argv[1] + "/val.h5", "r+") as f: f.move("test", "val")
with h5py.File(sys.argv[1] + "/none.h5", "r+") as f: del f["test"]
EOF
common=(--model lenet --batch-size 32 --lr 0.05 --no-augment --no-progress)

# auto on a train/val store: evaluates val (103 images; the trainer checks the count).
mpirun_np 2 "$BIN/ddpv-train" --data "$WORK/val.h5" "${common[@]}" --epochs 1 \
  --checkpoint-dir "$WORK/ck" --metrics "$WORK/val.jsonl" >"$WORK/val.txt" 2>&1 || { cat "$WORK/val.txt"; fail "training on a train/val store exited non-zero"; }
val_loss=$(json_field "$WORK/val.jsonl" epoch val_loss)
val_acc=$(json_field "$WORK/val.jsonl" epoch val_acc)
"$PY" -c "import math,sys; sys.exit(0 if math.isfinite(float('$val_loss')) else 1)" || fail "--val-split auto evaluated nothing on a train/val store (val_loss $val_loss)"

# auto on a store without val or test: trains, says once that nothing is evaluated.
mpirun_np 2 "$BIN/ddpv-train" --data "$WORK/none.h5" "${common[@]}" --epochs 1 >"$WORK/none.txt" 2>&1 || { cat "$WORK/none.txt"; fail "training on a store without val/test exited non-zero"; }
[ "$(grep -c 'has neither a val nor a test split' "$WORK/none.txt")" = 1 ] || { cat "$WORK/none.txt"; fail "expected one line saying nothing is evaluated"; }

# A split the store lacks: one line naming it and the splits there are, non-zero exit.
if mpirun_np 2 "$BIN/ddpv-train" --data "$WORK/tiny.h5" "${common[@]}" --val-split nope >"$WORK/nope.txt" 2>&1; then
  fail "--val-split nope was accepted"
fi
[ "$(grep -c -- '--val-split nope: store .* has no such split (it has test, train)' "$WORK/nope.txt")" = 1 ] || { cat "$WORK/nope.txt"; fail "expected one message naming the missing split and the store's splits"; }

# --eval-only: the checkpoint's val figures are the ones its run printed at the end of the
# epoch, on 2 ranks and on 1 (every image once, whatever the world size), and nothing is
# written to the checkpoint directory.
before=$(ls "$WORK/ck")
for np in 2 1; do
  mpirun_np $np "$BIN/ddpv-train" --data "$WORK/val.h5" --model lenet --eval-only --resume auto \
    --checkpoint-dir "$WORK/ck" --metrics "$WORK/eval$np.jsonl" >"$WORK/eval$np.txt" 2>&1 || { cat "$WORK/eval$np.txt"; fail "--eval-only on $np ranks exited non-zero"; }
  grep -q '^eval val: 103 images, loss .* top-1 .* top-5 .* (checkpoint at epoch 1, step 5)' "$WORK/eval$np.txt" || { cat "$WORK/eval$np.txt"; fail "no eval line on $np ranks"; }
  "$PY" - "$WORK/eval$np.jsonl" "$val_loss" "$val_acc" <<'EOF' || fail "--eval-only on $np ranks disagrees with the run's own evaluation"
import json, sys
rec = [json.loads(l) for l in open(sys.argv[1]) if '"eval"' in l][-1]
loss, acc = float(sys.argv[2]), float(sys.argv[3])
assert rec["images"] == 103, rec
assert abs(rec["val_loss"] - loss) <= 1e-4 * max(1.0, abs(loss)), (rec, loss)
assert abs(rec["val_acc"] - acc) < 0.5 / 103, (rec, acc)  # the same images right
assert rec["val_acc"] <= rec["val_top5"] <= 1.0, rec
EOF
done
[ "$(ls "$WORK/ck")" = "$before" ] || fail "--eval-only changed the checkpoint directory"
# Any split, e.g. train; a batch size other than the run's is no resume change here.
mpirun_np 2 "$BIN/ddpv-train" --data "$WORK/val.h5" --model lenet --eval-only --resume auto \
  --checkpoint-dir "$WORK/ck" --val-split train --batch-size 7 >"$WORK/evtrain.txt" 2>&1 || { cat "$WORK/evtrain.txt"; fail "--eval-only on train exited non-zero"; }
grep -q '^eval train: 300 images' "$WORK/evtrain.txt" || { cat "$WORK/evtrain.txt"; fail "no eval line for train"; }
# Without a checkpoint: refused once.
if mpirun_np 2 "$BIN/ddpv-train" --data "$WORK/val.h5" --eval-only >"$WORK/nock.txt" 2>&1; then fail "--eval-only without --resume was accepted"; fi
[ "$(grep -c -- '--eval-only needs --resume' "$WORK/nock.txt")" = 1 ] || { cat "$WORK/nock.txt"; fail "expected one line asking for --resume"; }
if mpirun_np 2 "$BIN/ddpv-train" --data "$WORK/val.h5" --eval-only --resume auto --checkpoint-dir "$WORK/empty" >"$WORK/empty.txt" 2>&1; then fail "--eval-only with no checkpoint was accepted"; fi
[ "$(grep -c 'no checkpoint in .* to evaluate' "$WORK/empty.txt")" = 1 ] || { cat "$WORK/empty.txt"; fail "expected one line saying there is no checkpoint"; }

# --drop-last: 300 images over 2 ranks are 150 a rank, 4 full batches of 32 and one of 22;
# with --drop-last an epoch is the 4 full steps.
for drop in "" --drop-last; do
  mpirun_np 2 "$BIN/ddpv-train" --data "$WORK/val.h5" "${common[@]}" --epochs 2 $drop \
    --metrics "$WORK/drop$drop.jsonl" >"$WORK/drop.txt" 2>&1 || { cat "$WORK/drop.txt"; fail "training ${drop:-without --drop-last} exited non-zero"; }
done
[ "$(json_field "$WORK/drop.jsonl" summary steps)" = 10 ] || fail "expected 2 x 5 steps without --drop-last"
[ "$(json_field "$WORK/drop--drop-last.jsonl" summary steps)" = 8 ] || fail "expected 2 x 4 steps with --drop-last"
if mpirun_np 2 "$BIN/ddpv-train" --data "$WORK/val.h5" --model lenet --batch-size 200 --drop-last >"$WORK/big.txt" 2>&1; then fail "--drop-last with a batch larger than the split was accepted"; fi
[ "$(grep -c -- '--drop-last: split train of .* has 300 images, fewer than one global batch of 400' "$WORK/big.txt")" = 1 ] || { cat "$WORK/big.txt"; fail "expected one line naming the split and the global batch"; }
echo "PASS"
