#!/usr/bin/env bash
# SIGUSR1 (what Slurm sends before a time limit; mpirun forwards it to the ranks), SIGTERM
# (sent to the ranks themselves) and SIGUSR1 sent to rank 1 alone (rank 0, which reports, never
# receives it; so does a rank that mpirun has not reached yet): the job finishes its step,
# checkpoints, exits 0, names the signal and says how to resume; the resumed run continues
# from that step.
source "$(dirname "$0")/lib.sh"
make_store "$WORK" --train 2000 --test 100
args=(--data "$WORK/tiny.h5" --model lenet --epochs 50 --batch-size 8 --lr 0.02 --no-progress
      --log-every 1 --val-split none)

for mode in USR1 TERM USR1-rank1; do
  sig=${mode%%-*}
  dir="$WORK/$mode"
  "${MPI2[@]}" "$BIN/ddpv-train" "${args[@]}" --checkpoint-dir "$dir" --metrics "$dir.jsonl" \
    >"$dir.out" 2>&1 &
  pid=$!
  wait_for_steps "$dir.jsonl"
  case $mode in
    USR1) kill -USR1 "$pid" ;;
    TERM) pkill -TERM -P "$pid" -f ddpv-train ;;  # the ranks themselves
    USR1-rank1) kill -USR1 "$(rank_pid "$pid" 1)" ;;
  esac
  start=$(date +%s)
  rc=0; wait "$pid" || rc=$?
  cat "$dir.out"
  [ "$rc" = 0 ] || fail "$mode: exit code $rc, expected 0"
  [ $(( $(date +%s) - start )) -le 30 ] || fail "$mode: took more than 30 s to stop"
  grep -q "stopped by SIG$sig after step" "$dir.out" || fail "$mode: no stop message"
  grep -q "checkpoint (SIG$sig)" "$dir.out" || fail "$mode: the checkpoint is not named after the signal"
  grep -q -- "--resume auto" "$dir.out" || fail "$mode: the message does not say how to resume"
  [ -f "$dir/latest" ] || fail "$mode: no checkpoint written"
  stopped=$(json_field "$dir.jsonl" summary steps)
  # Resume for 3 more steps: the run continues at the saved step.
  "${MPI2[@]}" "$BIN/ddpv-train" "${args[@]}" --checkpoint-dir "$dir" --metrics "$dir.jsonl" \
    --resume auto --run-steps 3 >"$dir.resume.out" 2>&1 || { cat "$dir.resume.out"; fail "resume failed"; }
  grep -q "resumed from" "$dir.resume.out" || fail "$mode: did not resume"
  [ "$(json_field "$dir.jsonl" summary steps)" = $((stopped + 3)) ] || fail "$mode: resumed run did not continue from step $stopped"
done
echo "PASS"
