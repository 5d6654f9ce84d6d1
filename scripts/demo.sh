#!/usr/bin/env bash
# `make demo`: converts the real Fashion-MNIST from the Debian package into an HDF5 store,
# trains lenet on 2 MPI ranks, and reports test accuracy, images/s and where the metrics and
# the plot are. A few minutes on a 2-core machine. PRECISION=bf16 trains with bf16 activations
# (--precision bf16), EPOCHS=N for another length.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
BIN=$BUILD_DIR/bin
OUT=$BUILD_DIR/demo
EPOCHS=${EPOCHS:-4}
PRECISION=${PRECISION:-fp32}
PY=/usr/bin/python3
FMNIST=/usr/share/datasets/fashion-mnist
mkdir -p "$OUT"

mpirun_args=(--oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none)
[ "$(id -u)" = 0 ] && mpirun_args+=(--allow-run-as-root)

if ! "$BIN/ddpv-convert" inspect "$OUT/fashion-mnist.h5" >/dev/null 2>&1; then
  echo "== converting Fashion-MNIST ($FMNIST) into $OUT/fashion-mnist.h5"
  "$BIN/ddpv-convert" idx --preset fashion-mnist \
    --train-images "$FMNIST/train-images-idx3-ubyte.gz" --train-labels "$FMNIST/train-labels-idx1-ubyte.gz" \
    --test-images "$FMNIST/t10k-images-idx3-ubyte.gz" --test-labels "$FMNIST/t10k-labels-idx1-ubyte.gz" \
    --out "$OUT/fashion-mnist.h5"
fi

echo "== training lenet on 2 ranks for $EPOCHS epochs ($PRECISION)"
rm -f "$OUT/run.jsonl"
${MPIRUN:-mpirun} -np 2 "${mpirun_args[@]}" "$BIN/ddpv-train" --data "$OUT/fashion-mnist.h5" \
  --model lenet --epochs "$EPOCHS" --batch-size 64 --lr 0.05 --momentum 0.9 --weight-decay 5e-4 \
  --lr-schedule cosine --no-augment --precision "$PRECISION" --checkpoint-dir "$OUT/checkpoints" \
  --metrics "$OUT/run.jsonl"

summary() { "$PY" -c "import json,sys; r=[json.loads(l) for l in open('$OUT/run.jsonl') if '\"summary\"' in l][-1]; print(r['$1'])"; }
acc=$(summary val_acc)
ips=$(summary images_per_s)
if "$PY" -c "import matplotlib" 2>/dev/null; then
  "$PY" scripts/plot_metrics.py "$OUT/run.jsonl" -o "$OUT/run.png" >/dev/null && plot="$OUT/run.png"
else
  plot="(matplotlib not installed: scripts/install-deps.sh)"
fi
echo
printf '== test accuracy %.2f%%, %.0f images/s (2 ranks)\n' "$("$PY" -c "print(100*$acc)")" "$ips"
echo "   metrics:    $OUT/run.jsonl"
echo "   plot:       $plot"
echo "   checkpoint: $OUT/checkpoints/$(cat "$OUT/checkpoints/latest")"
"$PY" -c "import sys; sys.exit(0 if $acc >= 0.90 else 1)" || { echo "demo: test accuracy below 90%" >&2; exit 1; }
