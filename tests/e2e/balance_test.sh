#!/usr/bin/env bash
# Note [Balanced batches] end to end (mpirun, CPU).
# 1. Uneven splits learn what one rank with the whole global batch learns: 1 rank x 128 is the
#    reference; 2 ranks split 88/40 (allreduce) and 4 ranks split 16/48/24/40 (shared update)
#    must give its step losses, across an epoch's short last step (600 samples: steps of 128,
#    then 88) and into the next epoch; and 48/16 with --accum-steps 2 those of 1 rank x 64 x 2.
#    One update apart, the runs differ only in the order of float sums (<= 1e-5 on the loss);
#    later, a max-pool window whose two largest values swap under that rounding routes one
#    gradient elsewhere and the runs drift apart slowly (about 2e-5 by step 10 here, measured).
#    Averaging the ranks' mean gradients instead of taking the global batch's mean (the plain
#    1 / n loss scale) is off by 7e-4 after one update and by 1e-2 at step 10, so the bounds
#    below tell the two apart.
# 2. A checkpoint taken under one split resumes exactly under another.
# 3. Bad splits: one line naming the option, non-zero exit, no hang.
# 4. --balance: with one rank's busy time made longer per image (injected), the split moves
#    samples away from it, settles where the busy times are even, and stays there.
source "$(dirname "$0")/lib.sh"
make_store "$WORK" --train 600 --test 100
# Each epoch ends with an evaluation of the test split, which stays one unpadded shard per rank.
common=(--data "$WORK/tiny.h5" --model lenet --device cpu --threads 1
        --no-progress --lr 0.02 --lr-schedule constant --log-every 1 --seed 3 --epochs 100)
train() {  # name ranks args...: output in $WORK/name.log, metrics in $WORK/name.jsonl
  local name=$1 np=$2; shift 2
  timeout 300 "${DDPV_MPIRUN:-mpirun}" -np "$np" "${MPIRUN_ARGS[@]}" "$BIN/ddpv-train" "${common[@]}" \
    --metrics "$WORK/$name.jsonl" "$@" >"$WORK/$name.log" 2>&1 ||
    { cat "$WORK/$name.log"; fail "run $name failed"; }
}
# same_losses NAME FIRST [REF]: NAME's step losses from step FIRST on against REF's (ref).
same_losses() {
  "$PY" - "$WORK/${3:-ref}.jsonl" "$WORK/$1.jsonl" "$2" <<'PYEOF' || fail "$1: step losses differ from one rank's global batch"
import json, sys
def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path)) if r.get("event") == "step"}
ref, got, first = losses(sys.argv[1]), losses(sys.argv[2]), int(sys.argv[3])
steps = [k for k in sorted(ref) if k >= first]
assert steps and all(k in got for k in steps), (sorted(ref), sorted(got))
for k in steps:
    bound = 1e-5 if k <= first + 1 else 2e-4
    assert abs(got[k] - ref[k]) <= bound, f"step {k}: {got[k]} against {ref[k]} (bound {bound})"
print(sys.argv[2], "max diff", max(abs(got[k] - ref[k]) for k in steps))
PYEOF
}

train ref 1 --batch-size 128 --max-steps 10
train two 2 --batch-size 64 --batch-split 88/40 --no-shared-update --max-steps 10
same_losses two 1
[ "$(json_field "$WORK/two.jsonl" epoch val_acc)" = "$(json_field "$WORK/ref.jsonl" epoch val_acc)" ] ||
  fail "two: the evaluation after epoch 2 differs from one rank's"
train four 4 --batch-size 32 --batch-split 16/48/24/40 --max-steps 10
same_losses four 1
grep -q "batch 32 (balanced)" "$WORK/four.log" || { cat "$WORK/four.log"; fail "four: not balanced"; }
grep -q "^balance: the global batch split 16/48/24/40 by rank at the end, after 0 changes" \
  "$WORK/four.log" || { cat "$WORK/four.log"; fail "four: no balance line"; }
[ "$(json_field "$WORK/four.jsonl" summary batch_split)" = "[16, 48, 24, 40]" ] ||
  fail "four: the summary's batch_split"

# With gradient accumulation each micro-batch is split: 2 x 64 on one rank against 48/16 twice.
train ref-accum 1 --batch-size 64 --accum-steps 2 --max-steps 6
train accum 2 --batch-size 32 --accum-steps 2 --batch-split 48/16 --max-steps 6
same_losses accum 1 ref-accum

# 2. Three steps under 40/88, then the rest under 88/40 from the checkpoint.
train part 2 --batch-size 64 --batch-split 40/88 --max-steps 10 --run-steps 3 \
  --checkpoint-dir "$WORK/ckpt"
train rest 2 --batch-size 64 --batch-split 88/40 --max-steps 10 --checkpoint-dir "$WORK/ckpt" \
  --resume auto
same_losses rest 4

# 3. Bad input.
bad() {  # expected-exit message-pattern args...
  local want=$1 pattern=$2 rc=0; shift 2
  timeout 120 "${DDPV_MPIRUN:-mpirun}" -np 2 "${MPIRUN_ARGS[@]}" "$BIN/ddpv-train" "${common[@]}" \
    --max-steps 2 "$@" >"$WORK/bad.log" 2>&1 || rc=$?
  [ $rc = "$want" ] || { cat "$WORK/bad.log"; fail "$*: exit $rc, not $want"; }
  grep -q "$pattern" "$WORK/bad.log" || { cat "$WORK/bad.log"; fail "$*: no message '$pattern'"; }
  [ "$(grep -c "$pattern" "$WORK/bad.log")" = 1 ] || fail "$*: the message is repeated"
}
# Every rank meets a bad split alike: one line, without a rank (Note [Agreed failures]).
bad 1 "^ddpv-train: --batch-split 88/41: give one size per rank (2), each at least 1, summing to 128" \
  --batch-size 64 --batch-split 88/41
bad 1 "^ddpv-train: --batch-split 40/40/48: give one size per rank (2)" \
  --batch-size 64 --batch-split 40/40/48
bad 2 "ddpv-train: --batch-split 88/4x: give one positive batch size per rank" --batch-split 88/4x
bad 2 "ddpv-train: --batch-split 128/0: give one positive" --batch-split 128/0
bad 2 "ddpv-train: --balance splits each batch by measured speed" --balance --deterministic
[ ! -e "$WORK/ckpt-bad" ] || fail "a failed start left files behind"
# 4. --balance against a slow rank, on synthetic data, with injected busy times (Note [Injected
#    busy time]): the ranks' timers count the given seconds per image as work and nothing runs
#    slower, so the speeds the balancer sees are the test's (the part it measures, well under
#    a millisecond per image, is small beside them) and the split it settles on follows from
#    them: a rank's share of the global batch in proportion to its images per busy second, in
#    multiples of the split's quantum (split_bounds: 4 for a batch of 64, 2 for 32). Tenths
#    of a second per image keep the measured part below 0.5% of the speeds: where a share
#    rounds to a quantum hangs on it.
balanced() {  # name np busy-per-image args...
  local name=$1 np=$2 busy=$3; shift 3
  timeout 300 "${DDPV_MPIRUN:-mpirun}" -np "$np" "${MPIRUN_ARGS[@]}" "$BIN/ddpv-train" \
    --synthetic --model lenet --device cpu --threads 1 --no-progress --log-every 1000 \
    --synthetic-size 100000 --metrics "$WORK/$name.jsonl" --test-busy-per-image "$busy" "$@" \
    >"$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "run $name failed"; }
}
# settled NAME SPLIT CHANGES: the run ended on SPLIT (each entry "n" or "lo-hi") after CHANGES
# changes (or "1+"), each said by rank 0 as it happened, with speeds within 10% of the injected
# ones' 1 / seconds per image.
settled() {
  "$PY" - "$WORK/$1.jsonl" "$WORK/$1.log" "$2" "$3" "$4" <<'PYEOF' || { cat "$WORK/$1.log"; fail "$1: the split did not follow the injected speeds"; }
import json, re, sys
path, log, want, changes, per_image = sys.argv[1:]
s = [r for r in map(json.loads, open(path)) if r.get("event") == "summary"][-1]
split, speed = s["batch_split"], s["rank_speed"]
assert sum(split) == s["global_batch"], s
for got, w in zip(split, want.split("/"), strict=True):
    lo, _, hi = w.partition("-")
    assert int(lo) <= got <= int(hi or lo), (split, want)
if changes.endswith("+"):
    assert s["split_changes"] >= int(changes[:-1]), s
else:
    assert s["split_changes"] == int(changes), s
said = re.findall(r"balance: after step (\d+) the global batch splits ([\d/]+) by rank \(speeds "
                  r"[\d/]+ images per busy second\)", open(log).read())
assert len(said) == s["split_changes"], (said, s["split_changes"])
assert said[-1][1] == "/".join(map(str, split)), (said, split)
for v, sec in zip(speed, per_image.split("/"), strict=True):
    assert 0.9 / float(sec) <= v <= 1 / float(sec), (speed, per_image)
print(path, "split", split, "busy", s["rank_busy_s"], "speed", speed)
PYEOF
}
# Four ranks (shared update, 32 each): rank 3 takes twice as long per image as the others, so
# it gets 1/7 of 128, 18.3 -> 18; the others 36.6 -> 36 or 38 (the one spare quantum goes to
# the largest remainder, which what the ranks measured decides).
balanced four-balanced 4 0.2/0.2/0.2/0.4 --batch-size 32 --max-steps 120 --balance
settled four-balanced 36-38/36-38/36-38/18 1+ 0.2/0.2/0.2/0.4
# Two ranks (allreduce, 64 each), the slow one first at three times the other's time per
# image: 1/4 of 128 is 32, a multiple of 4, so exactly 32/96, reached in one change (two
# windows of ten steps after the warm-up agree) and kept.
balanced two-even 2 0.3/0.1 --batch-size 64 --max-steps 150 --no-shared-update
balanced two-balanced 2 0.3/0.1 --batch-size 64 --max-steps 150 --no-shared-update --balance
settled two-balanced 32/96 1 0.3/0.1
# The even run's straggler warning points at --balance; a balanced run's never does.
grep -q "node? (--balance would give it a smaller share of each batch)$" "$WORK/two-even.log" ||
  { cat "$WORK/two-even.log"; fail "two-even: no straggler warning pointing at --balance"; }
! grep -q "would give it a smaller share" "$WORK/two-balanced.log" ||
  { cat "$WORK/two-balanced.log"; fail "two-balanced: the warning points at --balance, already on"; }
# The slow rank's busy time over the fast one's: 3 with the even split (64 x 0.3 against
# 64 x 0.1 a step). Balanced, the first 25 steps (5 of warm-up, two windows of 10) and the
# batches the loader had queued when the split changed run even, the rest 32 x 0.3 against
# 96 x 0.1, equal: 1.2-1.3 over the run.
"$PY" - "$WORK/two-even.jsonl" "$WORK/two-balanced.jsonl" <<'PYEOF' || fail "--balance did not even out the busy times"
import json, sys
def ratio(path):
    s = [r for r in map(json.loads, open(path)) if r.get("event") == "summary"][-1]
    busy = s["rank_busy_s"]
    return busy[0] / busy[1]
even, bal = ratio(sys.argv[1]), ratio(sys.argv[2])
print(f"slow / fast busy: even {even:.3f}, balanced {bal:.3f}")
assert 2.85 <= even <= 3.0 and 1.15 <= bal <= 1.35, (even, bal)
PYEOF
grep -q "^balance: the global batch split 32/96 by rank at the end, after 1 change; speeds (images per busy second) [0-9]\+/[0-9]\+$" \
  "$WORK/two-balanced.log" || { cat "$WORK/two-balanced.log"; fail "two-balanced: no balance line"; }

echo "balance_test: ok"
