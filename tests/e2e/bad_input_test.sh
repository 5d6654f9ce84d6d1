#!/usr/bin/env bash
# Bad options exit 2 with one message before any training; a missing, invalid or impossible
# store exits non-zero with a message naming the path; a diverging loss stops all ranks with
# exit 1.
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
expect 2 "--precision fp16 is not implemented" -- "${MPI2[@]}" "${T[@]}" --data "$WORK/tiny.h5" --precision fp16 --device cpu
expect 2 "add --precision bf16" -- "${MPI2[@]}" "${T[@]}" --data "$WORK/tiny.h5" --cpu-bf16 onednn
# --cpu-bf16 onednn where oneDNN 2.6 has no bf16 kernels (no AVX-512) stops every rank.
if ! grep -qw avx512f /proc/cpuinfo; then
  expect nonzero "has no bf16 convolution on this CPU" -- "${MPI2[@]}" "${T[@]}" --data "$WORK/tiny.h5" --precision bf16 --cpu-bf16 onednn
fi
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
# inf and nan parse as numbers; no option takes them. More threads than the CPUs a rank may run
# on (its affinity mask) are refused, with the limit named.
for opt in lr momentum weight-decay warmup-epochs comm-timeout cache-mb bucket-mb; do
  for v in inf nan; do
    expect 2 "--$opt must be a finite number, got $v" -- "${MPI2[@]}" "${T[@]}" --data "$WORK/tiny.h5" --$opt $v
  done
done
cpus=$("$PY" -c 'import os; print(len(os.sched_getaffinity(0)))')
expect 2 "--threads 1000 is more than the $cpus CPUs this rank may run on (its affinity mask" -- "${MPI2[@]}" "${T[@]}" --data "$WORK/tiny.h5" --threads 1000
# Stores whose dims claim more than the file holds (Note [Claimed rows]) fail at open, naming
# the file and the dataset, in ddpv-train and ddpv-convert inspect; an empty split is named.
"$PY" - "$WORK" <<'PYEOF'
import sys, h5py, numpy as np
work = sys.argv[1]
def store(name):
    f = h5py.File(f"{work}/{name}.h5", "w")
    f.attrs.update(format="ddpvision-image-store", format_version=1, num_classes=10,
                   class_names=[str(c) for c in range(10)], height=28, width=28, channels=1,
                   mean=[0.5], std=[0.25])
    return f
def images(f, split, n):
    f[f"{split}/images"] = np.random.default_rng(0).integers(0, 255, (n, 28, 28, 1), np.uint8)
    f[f"{split}/labels"] = (np.arange(n) % 10).astype("<i4")
n = 2**40
with store("huge") as f:  # 64 images, 2^40 labels declared: chunked, nothing written
    f.create_dataset("train/images", data=np.zeros((64, 28, 28, 1), np.uint8))
    f.create_dataset("train/labels", shape=(n,), dtype="<i4", chunks=(4096,), maxshape=(None,))
with store("huge_gzip") as f:  # compressed, as is legal: only the first and last chunks written
    for name, row in (("images", (28, 28, 1)), ("labels", ())):
        d = f.create_dataset(f"train/{name}", shape=(n,) + row, dtype="u1" if row else "<i4",
                             chunks=(4096,) + row, maxshape=(None,) + row, compression="gzip")
        d[0] = d[n - 1] = 1
with store("empty_test") as f:
    images(f, "train", 64)
    f.create_dataset("test/images", shape=(0, 28, 28, 1), dtype="u1", maxshape=(None, 28, 28, 1), chunks=(64, 28, 28, 1))
    f.create_dataset("test/labels", shape=(0,), dtype="<i4", maxshape=(None,), chunks=(4096,))
PYEOF
expect 1 "$WORK/huge.h5: /train/labels claims 1099511627776 rows" -- "$BIN/ddpv-convert" inspect "$WORK/huge.h5"
[ "$(wc -l <"$WORK/out.txt")" = 1 ] || { cat "$WORK/out.txt"; fail "inspect of a huge store: not one line"; }
expect nonzero "$WORK/huge.h5: /train/labels claims 1099511627776 rows" -- "${MPI2[@]}" "${T[@]}" --data "$WORK/huge.h5"
! grep -q "bad_alloc" "$WORK/out.txt" || fail "a huge store reached an allocation"
expect 1 "$WORK/huge_gzip.h5: /train/labels claims 1099511627776 rows" -- "$BIN/ddpv-convert" inspect "$WORK/huge_gzip.h5"
grep -q "only 2 of the 268435456 chunks" "$WORK/out.txt" || { cat "$WORK/out.txt"; fail "compressed huge store: no chunk count"; }
expect nonzero "store $WORK/empty_test.h5: split 'test' is empty: nothing to evaluate" -- "${MPI2[@]}" "${T[@]}" --data "$WORK/empty_test.h5" --val-split test --epochs 1 --no-progress
expect nonzero "store $WORK/empty_test.h5: split 'test' is empty: nothing to train on" -- "${MPI2[@]}" "${T[@]}" --data "$WORK/empty_test.h5" --train-split test --val-split none --no-progress
# A config file supplies options; the command line wins over it.
printf 'model = lenet\nepochs = 1\nbatch-size = 16\nlr = 5\n' >"$WORK/run.cfg"
expect 0 "^done: 1 epochs" -- "${MPI2[@]}" "${T[@]}" --config "$WORK/run.cfg" --data "$WORK/tiny.h5" --lr 0.01 --no-progress
# Divergence: every rank stops after the same step, one message, exit 1, no checkpoint.
expect 1 "training diverged" -- "${MPI2[@]}" "${T[@]}" --data "$WORK/tiny.h5" --lr 1e30 --epochs 3 --checkpoint-dir "$WORK/ck" --checkpoint-every 0 --no-progress
[ ! -e "$WORK/ck/latest" ] || fail "a checkpoint was written for a diverged run"
echo "PASS"
