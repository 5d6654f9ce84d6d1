#!/usr/bin/env bash
# A checkpoint directory on a full file system (a 6 MiB tmpfs: lenet's checkpoint is 3.5 MiB,
# so the first fits and the second does not): the job ends with one line naming the file and
# the full disk, exit 1, no temporary left, and the first checkpoint intact, still named by
# `latest`, and resumable. Needs root and a mountable tmpfs; skipped otherwise.
source "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || { echo "skip: mounting a tmpfs needs root"; exit 77; }
full="$WORK/full"
mkdir -p "$full"
mount -t tmpfs -o size=6m tmpfs "$full" 2>/dev/null || { echo "skip: cannot mount a tmpfs here"; exit 77; }
trap 'umount "$full" 2>/dev/null; kill -9 $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
make_store "$WORK" --train 256 --test 32
args=(--data "$WORK/tiny.h5" --model lenet --batch-size 16 --lr 0.05 --no-progress --val-split none)
E1=ckpt-e0001-s00000008.h5 E2=ckpt-e0002-s00000016.h5

rc=0
timeout 120 "${MPI2[@]}" "$BIN/ddpv-train" "${args[@]}" --epochs 3 --checkpoint-dir "$full/ck" \
  >"$WORK/out.txt" 2>&1 || rc=$?
cat "$WORK/out.txt"
[ "$rc" = 1 ] || fail "exit code $rc, expected 1"
pattern="no space left for $full/ck/$E2.tmp"
[ "$(grep -c -- "$pattern" "$WORK/out.txt")" = 1 ] || fail "expected one line '$pattern...'"
grep -q "No space left on device" "$WORK/out.txt" || fail "the line does not say the disk is full"
[ "$(cat "$full/ck/latest")" = "$E1" ] || fail "latest no longer names $E1"
[ -z "$(find "$full/ck" -name '*.tmp')" ] || fail "a temporary file was left: $(ls "$full/ck")"
[ ! -e "$full/ck/$E2" ] || fail "a partial $E2 was left"

# The first checkpoint is whole: a run resumes from it (writing elsewhere).
"${MPI2[@]}" "$BIN/ddpv-train" "${args[@]}" --epochs 3 --resume "$full/ck/$E1" \
  --checkpoint-dir "$WORK/more" --run-steps 1 >"$WORK/resume.txt" 2>&1 ||
  { cat "$WORK/resume.txt"; fail "resuming from $E1 failed"; }
grep -q "resumed from $full/ck/$E1 at epoch 1 step 8" "$WORK/resume.txt" ||
  { cat "$WORK/resume.txt"; fail "did not resume from $E1"; }
echo "PASS"
