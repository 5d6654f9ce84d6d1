#!/usr/bin/env bash
# ddpv-train end to end under mpirun -np 2 on a small store: training, per-epoch evaluation over
# exactly the validation set, the epoch lines, the metrics file and its summary record; and the
# same with gradients reduced in bf16; and --profile-layers.
source "$(dirname "$0")/lib.sh"
make_store "$WORK" --train 600 --test 203
mpirun_np 2 "$BIN/ddpv-train" --data "$WORK/tiny.h5" --model lenet --epochs 3 --batch-size 32 \
  --lr 0.05 --no-augment --metrics "$WORK/run.jsonl" --log-every 5 >"$WORK/out.txt" 2>&1 || { cat "$WORK/out.txt"; fail "training exited non-zero"; }
cat "$WORK/out.txt"
for e in 1 2 3; do grep -q "^epoch $e/3 train_loss .* val_loss .* val_acc .* img/s .* elapsed" "$WORK/out.txt" || fail "no epoch line $e"; done
grep -q "^done: 3 epochs" "$WORK/out.txt" || fail "no summary line"
# 203 test samples over 2 ranks: 102 + 101, none counted twice (the trainer checks the count).
acc=$(json_field "$WORK/run.jsonl" summary val_acc)
"$PY" -c "import sys; a=float('$acc'); sys.exit(0 if a > 0.9 else 1)" || fail "val_acc $acc <= 0.9 on a separable problem"
for key in images_per_s val_acc val_loss train_loss steps epochs elapsed_s world_size global_batch comm_wait_s data_wait_s; do
  v=$(json_field "$WORK/run.jsonl" summary "$key"); [ "$v" != missing ] || fail "summary lacks $key"
done
[ "$(json_field "$WORK/run.jsonl" summary world_size)" = 2 ] || fail "world_size != 2"
[ "$(json_field "$WORK/run.jsonl" summary global_batch)" = 64 ] || fail "global_batch != 64"
# 600 samples / 2 ranks = 300 per rank -> 10 batches of 32 per epoch -> 30 steps.
[ "$(json_field "$WORK/run.jsonl" summary steps)" = 30 ] || fail "expected 30 steps"
[ "$(grep -c '"event": "step"' "$WORK/run.jsonl")" = 6 ] || fail "expected a step record every 5 steps"
# The plot script turns the metrics into a PNG (when matplotlib is present).
if "$PY" -c "import matplotlib" 2>/dev/null; then
  "$PY" "$SRC/scripts/plot_metrics.py" "$WORK/run.jsonl" -o "$WORK/run.png"
  [ -s "$WORK/run.png" ] || fail "no plot written"
fi
# Gradients reduced in bf16 (Note [bf16 reduction]) learn the same separable problem.
mpirun_np 2 "$BIN/ddpv-train" --data "$WORK/tiny.h5" --model lenet --epochs 3 --batch-size 32 \
  --lr 0.05 --no-augment --reduce-dtype bf16 --metrics "$WORK/bf16.jsonl" >"$WORK/bf16.txt" 2>&1 || { cat "$WORK/bf16.txt"; fail "bf16-reduced training exited non-zero"; }
grep -q "non-blocking collectives) in bf16" "$WORK/bf16.txt" || { cat "$WORK/bf16.txt"; fail "the start line does not say gradients travel in bf16"; }
acc=$(json_field "$WORK/bf16.jsonl" summary val_acc)
"$PY" -c "import sys; a=float('$acc'); sys.exit(0 if a > 0.9 else 1)" || fail "bf16-reduced val_acc $acc <= 0.9"
# --profile-layers (Note [Layer profile]): rank 0 alone prints the table, over the steps after
# the 5 warm-up steps (10 steps in one epoch -> 5), with the layers and the trainer's phases.
# With DDPV_LOG_LEVEL=debug, rank 0 also lists the model's layers and what each fused.
mpirun_np 2 -x DDPV_LOG_LEVEL=debug "$BIN/ddpv-train" --data "$WORK/tiny.h5" --model lenet --epochs 1 --batch-size 32 \
  --lr 0.05 --no-augment --profile-layers >"$WORK/prof.txt" 2>&1 || { cat "$WORK/prof.txt"; fail "profiled training exited non-zero"; }
[ "$(grep -c 'debug: layers:' "$WORK/prof.txt")" = 1 ] || { cat "$WORK/prof.txt"; fail "expected one layer list, from rank 0"; }
grep -q '^  conv2: conv 5x5/1 pad 2, (14, 14, 32) -> (14, 14, 64) (winograd F(4x4,5x5), + relu, + maxpool)$' "$WORK/prof.txt" || { cat "$WORK/prof.txt"; fail "the layer list does not describe conv2"; }
[ "$(grep -c '^layer profile: ' "$WORK/prof.txt")" = 1 ] || { cat "$WORK/prof.txt"; fail "expected one layer profile, from rank 0"; }
grep -q '^layer profile: 5 steps, ' "$WORK/prof.txt" || { cat "$WORK/prof.txt"; fail "the profile should cover steps 6-10"; }
for row in conv1 conv2 fc1 fc2 data loss optimizer "step agreement"; do
  grep -q "^  $row  *[a-z]" "$WORK/prof.txt" || { cat "$WORK/prof.txt"; fail "no profile row for $row"; }
done
# Note [Tuning options]: the backend switches, from a config file as from the command line,
# reach the layers (conv2 on oneDNN's direct kernels, nothing fused), rank 0's start line lists
# them, and the model learns as it does on the fast paths.
printf 'cpu-conv = direct\nno-fuse = true\n' >"$WORK/tune.cfg"
mpirun_np 2 -x DDPV_LOG_LEVEL=debug "$BIN/ddpv-train" --data "$WORK/tiny.h5" --model lenet --epochs 3 --batch-size 32 \
  --lr 0.05 --no-augment --config "$WORK/tune.cfg" --metrics "$WORK/tune.jsonl" >"$WORK/tune.txt" 2>&1 || { cat "$WORK/tune.txt"; fail "training with tuning options exited non-zero"; }
grep -q 'info: lenet on cpu (.*, conv direct, no fusion)' "$WORK/tune.txt" || { cat "$WORK/tune.txt"; fail "the start line does not list the tuning options"; }
conv2=$(grep '^  conv2: ' "$WORK/tune.txt")
[ -n "$conv2" ] || { cat "$WORK/tune.txt"; fail "no conv2 in the layer list"; }
case $conv2 in *winograd*|*"+ relu"*|*maxpool*) fail "conv2 should run direct and unfused: $conv2" ;; esac
acc=$(json_field "$WORK/tune.jsonl" summary val_acc)
"$PY" -c "import sys; a=float('$acc'); sys.exit(0 if a > 0.9 else 1)" || fail "val_acc $acc <= 0.9 with --cpu-conv direct --no-fuse"
echo "PASS"
