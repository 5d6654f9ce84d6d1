#!/usr/bin/env bash
# SIGUSR1 (what Slurm sends before a time limit; mpirun forwards it to the ranks) and SIGTERM
# (sent to the ranks themselves): the job finishes its step, checkpoints, exits 0 and says how
# to resume; the resumed run continues from that step.
source "$(dirname "$0")/lib.sh"
make_store "$WORK" --train 2000 --test 100
args=(--data "$WORK/tiny.h5" --model lenet --epochs 50 --batch-size 8 --lr 0.02 --no-progress
      --log-every 1 --val-split none)

wait_for_steps() {  # wait until the metrics file shows a step record (training has begun)
  for _ in $(seq 1 300); do grep -q '"event": "step"' "$1" 2>/dev/null && return 0; sleep 0.1; done
  fail "training did not start within 30 s"
}

for sig in USR1 TERM; do
  dir="$WORK/$sig"
  "${MPI2[@]}" "$BIN/ddpv-train" "${args[@]}" --checkpoint-dir "$dir" --metrics "$dir.jsonl" \
    >"$dir.out" 2>&1 &
  pid=$!
  wait_for_steps "$dir.jsonl"
  if [ "$sig" = USR1 ]; then kill -USR1 "$pid"; else pkill -TERM -P "$pid" -f ddpv-train; fi  # TERM: the ranks themselves
  start=$(date +%s)
  rc=0; wait "$pid" || rc=$?
  cat "$dir.out"
  [ "$rc" = 0 ] || fail "SIG$sig: exit code $rc, expected 0"
  [ $(( $(date +%s) - start )) -le 30 ] || fail "SIG$sig: took more than 30 s to stop"
  grep -q "stopped by SIG$sig after step" "$dir.out" || fail "SIG$sig: no stop message"
  grep -q -- "--resume auto" "$dir.out" || fail "SIG$sig: the message does not say how to resume"
  [ -f "$dir/latest" ] || fail "SIG$sig: no checkpoint written"
  stopped=$(json_field "$dir.jsonl" summary steps)
  # Resume for 3 more steps: the run continues at the saved step.
  "${MPI2[@]}" "$BIN/ddpv-train" "${args[@]}" --checkpoint-dir "$dir" --metrics "$dir.jsonl" \
    --resume auto --run-steps 3 >"$dir.resume.out" 2>&1 || { cat "$dir.resume.out"; fail "resume failed"; }
  grep -q "resumed from" "$dir.resume.out" || fail "SIG$sig: did not resume"
  [ "$(json_field "$dir.jsonl" summary steps)" = $((stopped + 3)) ] || fail "SIG$sig: resumed run did not continue from step $stopped"
done
echo "PASS"
