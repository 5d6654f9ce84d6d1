#!/usr/bin/env bash
# A checkpoint of ddpv-train (mpirun -np 2) loads into the equivalent PyTorch module and
# evaluates on the store to the same accuracy and loss as our own evaluation: the names and
# layouts match torch's. Skips (77) when python3-torch is not installed.
source "$(dirname "$0")/lib.sh"
"$PY" -c "import torch, h5py" 2>/dev/null || { echo "SKIP: python3-torch or python3-h5py not installed"; exit 77; }
make_store "$WORK" --train 300 --test 101
for model in lenet resnet20; do
  mpirun_np 2 "$BIN/ddpv-train" --data "$WORK/tiny.h5" --model "$model" --epochs 1 --batch-size 16 \
    --lr 0.02 --checkpoint-dir "$WORK/ck-$model" --metrics "$WORK/$model.jsonl" --no-progress \
    >"$WORK/train.txt" 2>&1 || { cat "$WORK/train.txt"; fail "$model: training failed"; }
  ours_acc=$(json_field "$WORK/$model.jsonl" summary val_acc)
  ours_loss=$(json_field "$WORK/$model.jsonl" summary val_loss)
  out=$("$PY" "$SRC/scripts/export_torch.py" --checkpoint "$WORK/ck-$model/$(cat "$WORK/ck-$model/latest")" \
        --data "$WORK/tiny.h5" --split test | tail -1)
  echo "$model: ours accuracy=$ours_acc loss=$ours_loss; torch $out"
  "$PY" - "$ours_acc" "$ours_loss" "$out" <<'PYEOF' || fail "$model: torch disagrees with our evaluation"
import sys
acc, loss, line = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
kv = dict(p.split("=") for p in line.split())
assert int(kv["samples"]) == 101, kv
assert abs(float(kv["accuracy"]) - acc) < 1e-5, (kv, acc)
assert abs(float(kv["loss"]) - loss) < 1e-4 * max(1.0, loss), (kv, loss)
PYEOF
done
echo "PASS"
