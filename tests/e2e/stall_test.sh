#!/usr/bin/env bash
# The stall watchdog and one message per fault, under real mpirun (Note [Stall watchdog],
# Note [One abort], Note [Agreed failures]):
#  - one rank of ddpv-train stopped with SIGSTOP (4 ranks: shared update, allreduce, the
#    communication thread; 2 ranks of resnet20 with rank 0 stopped): the job ends with exit
#    code 75 within --comm-timeout + 10 s, one line names the stopped rank, and the live ranks
#    sleep meanwhile instead of spinning;
#  - a rank alive but stuck waiting for its batch is named with where it is;
#  - the same fault on every rank prints one line and ends the job through one MPI_Abort; two
#    different faults print two lines and still one MPI_Abort;
#  - a set-up error on every rank (a missing store) or on rank 0 alone (a bad --resume) prints
#    one line and ends every rank without MPI_Abort.
source "$(dirname "$0")/lib.sh"
make_store "$WORK" --train 4000 --test 64
timeout_s=5
host=$(hostname)

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }

# stop_one NP VICTIM MODEL CPU ARGS...: trains, stops rank VICTIM, checks how the job ends,
# and with CPU=cpu that the live ranks sleep meanwhile. That holds wherever every wait is a
# non-blocking one (the shared update's); a rank stopped in the middle of a blocking transfer
# (the allreduce path's last bucket, the communication thread's collectives) leaves the others
# spinning inside MPI until the watchdog ends the job (Note [Waiting without spinning]).
stop_one() {
  local np=$1 victim=$2 model=$3 cpu=$4; shift 4
  local name="np $np, rank $victim stopped, $model $*"
  local out="$WORK/stop.out" metrics="$WORK/stop.jsonl"
  rm -f "$metrics"
  "${DDPV_MPIRUN:-mpirun}" -np "$np" "${MPIRUN_ARGS[@]}" "$BIN/ddpv-train" --data "$WORK/tiny.h5" \
    --model "$model" --epochs 1000 --batch-size 16 --lr 0.01 --no-progress --val-split none \
    --log-every 1 --metrics "$metrics" --comm-timeout "$timeout_s" "$@" >"$out" 2>&1 &
  local pid=$!
  wait_for_steps "$metrics"
  local ranks=() r
  for r in $(seq 0 $((np - 1))); do ranks+=("$(rank_pid "$pid" "$r")"); done
  local stopped=${ranks[$victim]}
  local start
  start=$(date +%s.%N)
  kill -STOP "$stopped"
  # Once the live ranks' waits have gone to sleep (Note [Waiting without spinning]), they use
  # next to no CPU: measure 2 s of it, from 1.5 s after the stop.
  sleep 1.5
  declare -A before
  for r in "${ranks[@]}"; do before[$r]=$(cpu_ticks "$r"); done
  sleep 2
  local hz
  hz=$(getconf CLK_TCK)
  for r in "${ranks[@]}"; do
    [ "$r" = "$stopped" ] || [ "$cpu" != cpu ] && continue
    local used=$(( $(cpu_ticks "$r") - ${before[$r]} ))
    # A quarter of a core over 2 s; spinning ranks used all of it.
    [ "$used" -le $((hz / 2)) ] || { cat "$out"; fail "$name: a waiting rank used $used of $((2 * hz)) CPU ticks in 2 s"; }
  done
  local rc=0
  timeout 60 tail --pid="$pid" -f /dev/null || fail "$name: the job was still running 60 s after the stop"
  wait "$pid" || rc=$?
  local took
  took=$(echo "$(date +%s.%N) - $start" | bc)
  cat "$out"
  [ "$rc" = 75 ] || fail "$name: exit code $rc, expected 75 (the watchdog's)"
  echo "$took <= $timeout_s + 10" | bc | grep -q 1 || fail "$name: the job took $took s to end after the stop"
  local line="stall: no progress for $timeout_s s (--comm-timeout) in the "
  [ "$(grep -c -- "$line" "$out")" = 1 ] || fail "$name: expected exactly one stall line"
  grep -- "$line" "$out" | grep -q "rank $victim on $host does not answer" ||
    fail "$name: the stall line does not name rank $victim"
  for r in "${ranks[@]}"; do  # gone, or a zombie about to be reaped
    for _ in $(seq 1 50); do
      [ "$(awk '{print $3}' "/proc/$r/stat" 2>/dev/null || echo Z)" = Z ] && break
      sleep 0.1
    done
    [ "$(awk '{print $3}' "/proc/$r/stat" 2>/dev/null || echo Z)" = Z ] || fail "$name: rank pid $r outlived the job"
  done
  echo "ok ($name): exit 75 ${took} s after the stop"
}

stop_one 4 2 lenet cpu
stop_one 4 1 lenet any --no-shared-update
stop_one 4 3 lenet any --no-shared-update --mpi-progress thread
stop_one 2 0 resnet20 cpu

# A live rank that has not arrived: named, with its phase and step.
out="$WORK/tool.out"
rc=0
timeout 60 "${DDPV_MPIRUN:-mpirun}" -np 4 "${MPIRUN_ARGS[@]}" "$BIN/stall_tool" late 2 >"$out" 2>&1 || rc=$?
cat "$out"
[ "$rc" = 75 ] || fail "late rank: exit code $rc, expected 75"
grep -q "rank 2 on $host is still in the wait for a batch of step 5" "$out" ||
  fail "late rank: the line does not say where rank 2 is"

# One fault on every rank: one line, one MPI_Abort. Two different faults: two lines, one abort.
rc=0
timeout 60 "${DDPV_MPIRUN:-mpirun}" -np 4 "${MPIRUN_ARGS[@]}" "$BIN/stall_tool" fail-all >"$out" 2>&1 || rc=$?
cat "$out"
[ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "fail-all: exit code $rc"
[ "$(grep -c "injected failure on every rank" "$out")" = 1 ] || fail "fail-all: expected one line"
[ "$(grep -c "MPI_ABORT was invoked" "$out")" -le 1 ] || fail "fail-all: more than one MPI_Abort"
rc=0
timeout 60 "${DDPV_MPIRUN:-mpirun}" -np 4 "${MPIRUN_ARGS[@]}" "$BIN/stall_tool" fail-two >"$out" 2>&1 || rc=$?
cat "$out"
[ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "fail-two: exit code $rc"
[ "$(grep -c "injected failure number 0" "$out")" = 1 ] || fail "fail-two: rank 0's line missing or repeated"
[ "$(grep -c "injected failure number 1" "$out")" = 1 ] || fail "fail-two: rank 1's line missing or repeated"
[ "$(grep -c "MPI_ABORT was invoked" "$out")" -le 1 ] || fail "fail-two: more than one MPI_Abort"

# Set-up errors: agreed, printed once, no MPI_Abort, non-zero exit.
setup_fails() {  # setup_fails PATTERN ARGS...
  local pattern=$1; shift
  rc=0
  timeout 60 "${DDPV_MPIRUN:-mpirun}" -np 4 "${MPIRUN_ARGS[@]}" "$BIN/ddpv-train" --no-progress "$@" >"$out" 2>&1 || rc=$?
  cat "$out"
  [ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "set-up error ($*): exit code $rc"
  [ "$(grep -c -- "$pattern" "$out")" = 1 ] || fail "set-up error ($*): expected one line with '$pattern'"
  grep -q "MPI_ABORT" "$out" && fail "set-up error ($*): ended through MPI_Abort"
  return 0
}
setup_fails "$WORK/missing.h5" --data "$WORK/missing.h5"
grep -q "^ddpv-train: .*$WORK/missing.h5" "$out" || fail "missing store: the line is not the program's"
grep "$WORK/missing.h5" "$out" | grep -q "rank [0-9]" && fail "missing store: every rank failed alike, yet a rank is named"
setup_fails "not a ddpvision checkpoint" --data "$WORK/tiny.h5" --resume "$WORK/tiny.h5"
echo "PASS"
