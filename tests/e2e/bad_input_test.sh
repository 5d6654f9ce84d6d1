#!/usr/bin/env bash
# Bad options exit 2 with one message before any training; a missing or invalid store exits
# non-zero with a message naming the path; a diverging loss stops all ranks with exit 1.
# No case may leave a rank running (every mpirun here is bounded by `timeout`).
source "$(dirname "$0")/lib.sh"
make_store "$WORK" --train 64 --test 32

expect() {  # expect CODE PATTERN -- command...
  local code=$1 pattern=$2; shift 3
  local rc=0
  timeout 60 "$@" >"$WORK/out.txt" 2>&1 || rc=$?
  [ "$rc" != 124 ] || fail "hung: $*"
  if [ "$code" = nonzero ]; then [ "$rc" != 0 ] || fail "exit 0, expected failure: $*"
  else [ "$rc" = "$code" ] || { cat "$WORK/out.txt"; fail "exit $rc, expected $code: $*"; }; fi
  grep -q -- "$pattern" "$WORK/out.txt" || { cat "$WORK/out.txt"; fail "no '$pattern' in the output of: $*"; }
  [ "$(grep -c -- "$pattern" "$WORK/out.txt")" -le 2 ] || fail "message repeated by every rank: $*"
}
T=("$BIN/ddpv-train")
expect 2 "unrecognised option\|unrecognized option" -- "${MPI2[@]}" "${T[@]}" --data "$WORK/tiny.h5" --bogus
expect 2 "lr must be positive" -- "${MPI2[@]}" "${T[@]}" --data "$WORK/tiny.h5" --lr -1
expect 2 "runs on CUDA devices only" -- "${MPI2[@]}" "${T[@]}" --data "$WORK/tiny.h5" --precision bf16 --device cpu
expect 2 "--data is required" -- "${MPI2[@]}" "${T[@]}" --model lenet
expect 2 "is not in the zoo" -- "${MPI2[@]}" "${T[@]}" --data "$WORK/tiny.h5" --model vgg
expect 2 "resume auto needs --checkpoint-dir" -- "${MPI2[@]}" "${T[@]}" --data "$WORK/tiny.h5" --resume auto
expect 2 "cannot read the file" -- "${MPI2[@]}" "${T[@]}" --config "$WORK/nope.cfg"
expect nonzero "$WORK/missing.h5" -- "${MPI2[@]}" "${T[@]}" --data "$WORK/missing.h5"
echo "not hdf5" >"$WORK/bad.h5"
expect nonzero "$WORK/bad.h5" -- "${MPI2[@]}" "${T[@]}" --data "$WORK/bad.h5"
expect nonzero "checkpoint-dir /proc/ddpv-nope: cannot create it" -- "${MPI2[@]}" "${T[@]}" --data "$WORK/tiny.h5" --checkpoint-dir /proc/ddpv-nope
expect nonzero "cannot open metrics file" -- "${MPI2[@]}" "${T[@]}" --data "$WORK/tiny.h5" --metrics /proc/ddpv-nope/m.jsonl
expect nonzero "not a ddpvision checkpoint" -- "${MPI2[@]}" "${T[@]}" --data "$WORK/tiny.h5" --resume "$WORK/tiny.h5"
expect nonzero "no such split" -- "${MPI2[@]}" "${T[@]}" --data "$WORK/tiny.h5" --val-split val
# A config file supplies options; the command line wins over it.
printf 'model = lenet\nepochs = 1\nbatch-size = 16\nlr = 5\n' >"$WORK/run.cfg"
expect 0 "^done: 1 epochs" -- "${MPI2[@]}" "${T[@]}" --config "$WORK/run.cfg" --data "$WORK/tiny.h5" --lr 0.01 --no-progress
# Divergence: every rank stops after the same step, one message, exit 1, no checkpoint.
expect 1 "training diverged" -- "${MPI2[@]}" "${T[@]}" --data "$WORK/tiny.h5" --lr 1e30 --epochs 3 --checkpoint-dir "$WORK/ck" --checkpoint-every 0 --no-progress
[ ! -e "$WORK/ck/latest" ] || fail "a checkpoint was written for a diverged run"
echo "PASS"
