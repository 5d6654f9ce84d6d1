#!/usr/bin/env bash
# Damaged checkpoints under real mpirun (docs/checkpoint-format.md): flipped tensor bytes are
# refused naming the tensor, and `--resume auto` falls back to the older good checkpoint and
# says so; a truncated newest checkpoint and a missing `latest` fall back the same way; stale
# temporaries are removed at start; when no checkpoint verifies the run stops with one line;
# another --model is not damage; a changed --batch-size, --accum-steps or --lr is refused unless
# --resume-changed; and seeded random corruptions of the newest checkpoint all fall back.
source "$(dirname "$0")/lib.sh"
make_store "$WORK" --train 256 --test 32
base=(--data "$WORK/tiny.h5" --lr-schedule cosine --val-split none --no-progress)
common=("${base[@]}" --model lenet --epochs 3 --batch-size 16 --lr 0.05)
E1=ckpt-e0001-s00000008.h5 E2=ckpt-e0002-s00000016.h5 E3=ckpt-e0003-s00000024.h5
"${MPI2[@]}" "$BIN/ddpv-train" "${common[@]}" --checkpoint-dir "$WORK/pristine" >"$WORK/base.txt" 2>&1 ||
  { cat "$WORK/base.txt"; fail "the base run failed"; }
[ "$(cat "$WORK/pristine/latest")" = "$E3" ] || fail "the base run did not end at $E3"

fresh() { rm -rf "${WORK:?}/$1"; cp -r "$WORK/pristine" "$WORK/$1"; echo "$WORK/$1"; }
expect() {  # expect CODE PATTERN -- command...: exit code, and the pattern said once
  local code=$1 pattern=$2; shift 3
  local rc=0
  timeout 120 "$@" >"$WORK/out.txt" 2>&1 || rc=$?
  [ "$rc" != 124 ] || fail "hung: $*"
  [ "$rc" = "$code" ] || { cat "$WORK/out.txt"; fail "exit $rc, expected $code: $*"; }
  grep -q -- "$pattern" "$WORK/out.txt" || { cat "$WORK/out.txt"; fail "no '$pattern' in the output of: $*"; }
  [ "$(grep -c -- "$pattern" "$WORK/out.txt")" = 1 ] || { cat "$WORK/out.txt"; fail "'$pattern' said more than once: $*"; }
}
said() { grep -q -- "$1" "$WORK/out.txt" || { cat "$WORK/out.txt"; fail "no '$1' in the output"; }; }
TRAIN=("${MPI2[@]}" "$BIN/ddpv-train" "${common[@]}")
RAW=("${MPI2[@]}" "$BIN/ddpv-train" "${base[@]}" --model lenet)  # --epochs, --batch-size, --lr given
# flip FILE DATASET: 100 bytes inside DATASET's data, found by libhdf5 (not our header)
flip() {
  "$PY" - "$1" "$2" <<'PYEOF'
import sys, h5py
path, name = sys.argv[1:]
with h5py.File(path, "r") as f:
    at = f[name].id.get_offset() + 1000
with open(path, "r+b") as f:
    f.seek(at); b = f.read(100); f.seek(at); f.write(bytes(x ^ 0xFF for x in b))
PYEOF
}

# 1. Flipped tensor bytes: --resume FILE refuses naming the tensor; auto falls back to E2.
d=$(fresh flipped)
flip "$d/$E3" /params/fc1.weight
expect 1 "tensor /params/fc1.weight fails its checksum" -- "${TRAIN[@]}" --checkpoint-dir "$d" --resume "$d/$E3"
expect 0 "skipping $d/$E3, which is damaged: tensor /params/fc1.weight fails its checksum" -- \
  "${TRAIN[@]}" --checkpoint-dir "$d" --resume auto
said "resuming from $d/$E2, the newest checkpoint that verifies"
said "resumed from $d/$E2 at epoch 2 step 16"
# The run redid epoch 3 and wrote a good E3 over the damaged one: it resumes without a word.
expect 0 "resumed from $d/$E3 at epoch 3 step 24" -- "${TRAIN[@]}" --checkpoint-dir "$d" --resume auto
! grep -q "skipping" "$WORK/out.txt" || fail "the rewritten $E3 does not verify"
for f in "$E1" "$E2"; do [ -e "$d/$f" ] || fail "the good checkpoint $f was pruned"; done

# 2. A truncated newest checkpoint falls back.
d=$(fresh truncated)
size=$(stat -c %s "$d/$E3")
truncate -s $((size / 3)) "$d/$E3"
expect 0 "skipping $d/$E3, which is truncated: $((size / 3)) of $size bytes" -- \
  "${TRAIN[@]}" --checkpoint-dir "$d" --resume auto
said "resumed from $d/$E2 at epoch 2 step 16"

# 3. `latest` missing (its write hit a full disk): the newest complete checkpoint, then older.
d=$(fresh nolatest)
rm "$d/latest"
expect 0 "resumed from $d/$E3 at epoch 3 step 24" -- "${TRAIN[@]}" --checkpoint-dir "$d" --resume auto
said "$d/latest is missing"
d=$(fresh nolatest-cut)
rm "$d/latest"
truncate -s 5000 "$d/$E3"
expect 0 "resumed from $d/$E2 at epoch 2 step 16" -- "${TRAIN[@]}" --checkpoint-dir "$d" --resume auto
said "skipping $d/$E3, which is truncated"

# 4. Stale temporaries of a crashed writer are removed at start, and said so.
d=$(fresh stale)
echo partial >"$d/ckpt-e0004-s00000032.h5.tmp"
echo partial >"$d/latest.tmp"
expect 0 "removed 2 temporary file(s) a stopped run left in $d: ckpt-e0004-s00000032.h5.tmp, latest.tmp" -- \
  "${TRAIN[@]}" --checkpoint-dir "$d" --resume auto
for f in ckpt-e0004-s00000032.h5.tmp latest.tmp; do [ ! -e "$d/$f" ] || fail "stale $f remains"; done

# 5. No checkpoint verifies: one line listing them, exit 1, and nothing new written.
d=$(fresh none)
for f in "$E1" "$E2" "$E3"; do flip "$d/$f" /optimizer/fc1.weight; done
listing=$(ls -l --time-style=full-iso "$d")
expect 1 "none of the 3 checkpoints in $d verifies" -- "${TRAIN[@]}" --checkpoint-dir "$d" --resume auto
said "$E1 is damaged: tensor /optimizer/fc1.weight fails its checksum"
said "to start fresh, move $d aside"
[ "$(grep -c "^ddpv-train:" "$WORK/out.txt")" = 1 ] || fail "the refusal is not one line"
[ "$(ls -l --time-style=full-iso "$d")" = "$listing" ] || fail "a run that found no good checkpoint wrote one"

# 6. Another --model is the user's mistake, not damage: no fallback.
d=$(fresh model)
expect 1 "holds model 'lenet' but this run builds 'resnet20'" -- \
  "${MPI2[@]}" "$BIN/ddpv-train" "${base[@]}" --model resnet20 --epochs 3 --batch-size 16 --lr 0.05 \
  --checkpoint-dir "$d" --resume auto
! grep -q "skipping" "$WORK/out.txt" || fail "a model mismatch was taken for damage"

# 7. Options that change the run are refused (exit 2, every rank, one line), unless
#    --resume-changed says they are meant.
d=$(fresh changed)
expect 2 "global batch 32 -> 64 (2 ranks x --batch-size 16 -> 2 ranks x --batch-size 32)" -- \
  "${RAW[@]}" --checkpoint-dir "$d" --resume auto --epochs 3 --lr 0.05 --batch-size 32
said "add --resume-changed"
expect 2 "the run would change: --accum-steps 1 -> 2" -- \
  "${RAW[@]}" --checkpoint-dir "$d" --resume auto --epochs 3 --lr 0.05 --batch-size 8 --accum-steps 2
expect 2 "the run would change: --lr 0.05 -> 0.1" -- "${RAW[@]}" --checkpoint-dir "$d" --resume auto --epochs 3 --batch-size 16 --lr 0.1
expect 2 "schedule length 24 -> 32 steps" -- "${RAW[@]}" --checkpoint-dir "$d" --resume auto --batch-size 16 --lr 0.05 --epochs 4
[ "$(cat "$d/latest")" = "$E3" ] || fail "a refused resume wrote a checkpoint"
expect 2 "--resume-changed needs --resume" -- "${TRAIN[@]}" --checkpoint-dir "$d" --resume-changed
expect 0 "--resume-changed: continuing $d/$E3 with --lr 0.05 -> 0.1" -- \
  "${RAW[@]}" --checkpoint-dir "$d" --resume auto --epochs 3 --batch-size 16 --lr 0.1 --resume-changed
expect 0 "global batch 32 -> 64" -- \
  "${RAW[@]}" --checkpoint-dir "$(fresh changed2)" --resume auto --epochs 3 --lr 0.05 --batch-size 32 --resume-changed
expect 0 "--accum-steps 1 -> 2" -- \
  "${RAW[@]}" --checkpoint-dir "$(fresh changed3)" --resume auto --epochs 3 --lr 0.05 --batch-size 8 --accum-steps 2 --resume-changed

# 8. Seeded random damage to the newest checkpoint through the real --resume auto: bytes
#    flipped anywhere, or cut at a random length; every one falls back to E2.
for i in 1 2 3 4 5; do
  d=$(fresh random$i)
  what=$("$PY" - "$d/$E3" "$i" <<'PYEOF'
import os, random, sys
path, seed = sys.argv[1], int(sys.argv[2])
rng = random.Random(4200 + seed)
size = os.path.getsize(path)
if seed % 2:
    cut = rng.randrange(size)
    os.truncate(path, cut)
    print(f"cut to {cut} of {size} bytes")
else:
    with open(path, "r+b") as f:
        spots = sorted(rng.randrange(size) for _ in range(rng.randint(1, 16)))
        for at in spots:
            f.seek(at); b = f.read(1); f.seek(at); f.write(bytes([b[0] ^ rng.randint(1, 255)]))
    print(f"{len(spots)} bytes flipped at {spots}")
PYEOF
)
  echo "random damage $i: $what"
  expect 0 "resumed from $d/$E2 at epoch 2 step 16" -- "${TRAIN[@]}" --checkpoint-dir "$d" --resume auto --run-steps 1
  said "skipping $d/$E3"
done
echo "PASS"
