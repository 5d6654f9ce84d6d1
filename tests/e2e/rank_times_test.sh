#!/usr/bin/env bash
# Note [Rank times] end to end (mpirun, CPU), on injected busy times (Note [Injected busy
# time]): --test-busy-per-image gives one rank seconds of work per image that its timers count
# and nothing runs, so which rank is the busiest, and whether it is a straggler, are the
# test's choice, not the machine's load. Each rank's injected seconds (its images x its value)
# dwarf what it measures (milliseconds per lenet step), so every figure below holds on a busy
# machine too. The slow rank must be named, with its host, in the `ranks:` line and in the
# metrics summary, and warned about as a straggler; four ranks with the shared update, two
# with the allreduce (--no-shared-update) and the slow rank first, equal ranks, a run too short
# to call anyone a straggler, and two epochs, each with its own figures and warning.
source "$(dirname "$0")/lib.sh"
BATCH=32
common=(--synthetic --model lenet --device cpu --threads 1 --batch-size $BATCH --val-split none
        --no-progress --log-every 1000)
steps=(--synthetic-size 2048 --epochs 100)
# run NAME NP BUSY [args]: NP ranks with --test-busy-per-image BUSY; output in
# $WORK/NAME.{out,err}, metrics in $WORK/NAME.jsonl
run() {
  local name=$1 np=$2 busy=$3; shift 3
  timeout 300 "${DDPV_MPIRUN:-mpirun}" -np "$np" "${MPIRUN_ARGS[@]}" "$BIN/ddpv-train" \
    "${common[@]}" --test-busy-per-image "$busy" --metrics "$WORK/$name.jsonl" "$@" \
    >"$WORK/$name.out" 2>"$WORK/$name.err" ||
    { cat "$WORK/$name.out" "$WORK/$name.err"; fail "run $name failed"; }
}
# check NAME BUSY STEPS SLOW STRAGGLER: the summary of a run of STEPS steps with
# --test-busy-per-image BUSY names rank SLOW (none: no rank was given more), with figures that
# hold the injected seconds.
check() {
  "$PY" - "$WORK/$1.jsonl" "$2" "$3" "$4" "$5" "$BATCH" <<'PYEOF' || { cat "$WORK/$1.out" "$WORK/$1.err"; fail "$1: the summary"; }
import json, sys
path, per_image, steps, slow, straggler, batch = sys.argv[1:]
per_image = [float(v) for v in per_image.split("/")]
steps, batch, straggler = int(steps), int(batch), straggler == "yes"
s = [json.loads(l) for l in open(path) if l.strip()]
s = [r for r in s if r.get("event") == "summary"][-1]
busy, comm, data = s["rank_busy_s"], s["rank_comm_wait_s"], s["rank_data_wait_s"]
world = len(per_image)
assert len(busy) == len(comm) == len(data) == world and s["steps"] == steps, s
assert s["straggler"] is straggler, s
assert s["busiest_host"] and busy[s["busiest_rank"]] == max(busy), s
# Each rank trained batch x steps images; its busy time is what it measured plus those images
# times its value, and what it measured is the loop less its waits: for rank 0, whose figures
# are also the summary's own, busy + waits = the loop's time + the injected seconds.
injected = [v * batch * steps for v in per_image]
for r in range(world):
    assert busy[r] >= injected[r], (r, busy, injected)
assert comm[0] == s["comm_wait_s"] and data[0] == s["data_wait_s"], s
total = s["train_s"] + injected[0]
assert abs(busy[0] + comm[0] + data[0] - total) <= 1e-6 * total, (s, injected)
if slow != "none":
    slow = int(slow)
    assert s["busiest_rank"] == slow, s
PYEOF
  [ "$4" = none ] && return
  grep -q "^ranks: busy .* the busiest, rank $4 on [^ ,]\+, [0-9.]\+% above the others' median" \
    "$WORK/$1.out" || { cat "$WORK/$1.out"; fail "$1: no ranks line naming rank $4"; }
}

# 60 steps x 32 images x 0.05 s: 96 s of work injected into rank 3, none into the others.
run four 4 0/0/0/0.05 "${steps[@]}" --max-steps 60
check four 0/0/0/0.05 60 3 yes
# --val-split none: the epoch and summary lines say nothing of validation, not "val_acc nan".
grep -q "^epoch 1/100 train_loss [0-9.]* train_acc [0-9.]* lr " "$WORK/four.out" &&
  grep -q "^done: 3 epochs, 60 steps in .*; no evaluation; [0-9]* img/s" "$WORK/four.out" &&
  ! grep -qi "nan" "$WORK/four.out" || { cat "$WORK/four.out"; fail "four: no validation figures"; }
grep -q "warning: rank 3 on [^ ]\+ was busy [0-9]\+% longer than the other ranks' median" \
  "$WORK/four.err" || { cat "$WORK/four.err"; fail "four: no straggler warning"; }
grep -q "node? (--balance would give it a smaller share of each batch)$" "$WORK/four.err" ||
  { cat "$WORK/four.err"; fail "four: the run's warning does not point at --balance"; }

run two 2 0.05/0 "${steps[@]}" --max-steps 60 --no-shared-update
grep -q "; mpi (" "$WORK/two.err" || { cat "$WORK/two.err"; fail "two: not on the allreduce path"; }
check two 0.05/0 60 0 yes

# Equal ranks: 96 s each, so what the ranks measured (seconds at most) cannot make one of them
# a tenth busier than the others: no straggler, no warning.
run equal 4 0.05/0.05/0.05/0.05 "${steps[@]}" --max-steps 60
check equal 0.05/0.05/0.05/0.05 60 none no
! grep -q "warning: rank" "$WORK/equal.err" || { cat "$WORK/equal.err"; fail "equal: a warning"; }

# 20 steps: start-up could decide it, so the ranks line names the slow rank but calls it no
# straggler, and nothing warns.
run short 2 0/0.05 "${steps[@]}" --max-steps 20
check short 0/0.05 20 1 no
! grep -q "warning: rank" "$WORK/short.err" || { cat "$WORK/short.err"; fail "short: a warning"; }

# Two epochs of 128 steps (8192 samples, 2 ranks x 32): each epoch record has its own figures,
# which add up to the run's, and each epoch warns about the slow rank as it ends.
run epochs 2 0/0.05 --synthetic-size 8192 --epochs 2
check epochs 0/0.05 256 1 yes
"$PY" - "$WORK/epochs.jsonl" "$BATCH" <<'PYEOF' || { cat "$WORK/epochs.out" "$WORK/epochs.err"; fail "epochs: the records"; }
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
batch = int(sys.argv[2])
epochs = [r for r in recs if r.get("event") == "epoch"]
summary = [r for r in recs if r.get("event") == "summary"][-1]
assert [e["epoch"] for e in epochs] == [1, 2], epochs
for e in epochs:
    assert e["busiest_rank"] == 1 and e["straggler"] is True, e
    # 128 steps' injected seconds in each epoch, none carried into the next.
    assert 0.05 * batch * 128 <= e["rank_busy_s"][1] < 2 * 0.05 * batch * 128, e
for key in ("rank_busy_s", "rank_comm_wait_s", "rank_data_wait_s"):
    for r in range(2):
        total = sum(e[key][r] for e in epochs)
        assert abs(total - summary[key][r]) <= 1e-6 + 1e-6 * summary[key][r], (key, r, total, summary)
PYEOF
for e in 1 2; do
  grep -q "warning: epoch $e: rank 1 on [^ ]\+ was busy [0-9]\+% longer than the other ranks' median" \
    "$WORK/epochs.err" || { cat "$WORK/epochs.err"; fail "epochs: no warning for epoch $e"; }
done

# Bad values: one line naming the option, exit 2 (or 1 for a count that does not match the
# world size, which only the ranks know), no hang.
bad() {  # expected-exit pattern np value
  local want=$1 pattern=$2 np=$3 rc=0
  timeout 120 "${DDPV_MPIRUN:-mpirun}" -np "$np" "${MPIRUN_ARGS[@]}" "$BIN/ddpv-train" \
    "${common[@]}" --max-steps 2 --test-busy-per-image "$4" >"$WORK/bad.log" 2>&1 || rc=$?
  [ $rc = "$want" ] || { cat "$WORK/bad.log"; fail "$4: exit $rc, not $want"; }
  [ "$(grep -c "$pattern" "$WORK/bad.log")" = 1 ] ||
    { cat "$WORK/bad.log"; fail "$4: not one message '$pattern'"; }
}
bad 2 "^ddpv-train: --test-busy-per-image 0.01/-1: give one finite number of seconds >= 0 per rank" 2 0.01/-1
bad 1 "^ddpv-train: --test-busy-per-image 0.01/0/0: give one value per rank (2)" 2 0.01/0/0
echo "rank times: the slow rank named in the ranks line, the summary, each epoch and warnings"
