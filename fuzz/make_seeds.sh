#!/usr/bin/env bash
# fuzz/make_seeds.sh [BIN_DIR]: writes fuzz/corpus/ anew, the seed inputs of every fuzz target,
# with the built tools (default build/bin) and h5py. The corpus is committed: run this only
# when a format changes, then commit what it wrote.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-build/bin}")
out=fuzz/corpus
py=/usr/bin/python3
rm -rf "$out"
"$bin/ddpv-fuzz-seeds" "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Stores: tiny IDX pairs through ddpv-convert, plain, compressed with checksums, one image a
# chunk; and one written by h5py alone.
"$py" - "$work" <<'PY'
import struct, sys
d = sys.argv[1]
def idx(path, dims, data):
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", x) for x in dims) + bytes(data))
idx(d + "/img", [5, 4, 4], [(i * 37) % 256 for i in range(80)])
idx(d + "/lab", [5], [0, 1, 2, 1, 0])
idx(d + "/timg", [2, 4, 4], [(i * 11) % 256 for i in range(32)])
idx(d + "/tlab", [2], [2, 0])
PY
mkdir -p "$out/store_raw" "$out/store_struct"
convert() {
  "$bin/ddpv-convert" idx --train-images "$work/img" --train-labels "$work/lab" \
    --test-images "$work/timg" --test-labels "$work/tlab" --out "$out/store_raw/$1.h5" "${@:2}" >/dev/null
}
convert plain --chunk-images 4
convert gzip-fletcher32 --compress gzip --checksum
convert chunk1 --chunk-images 1
"$py" tests/fixtures/make_h5py_store.py "$out/store_raw/h5py.h5"
# store_struct: the input is a string of choices (targets/store_struct.cpp); these describe
# a valid store, one with a chunked split claiming 2^40 rows, and one of NaN statistics.
printf '\x01\x00\x00\x00\x03\x00\x00\x00\x00\x00\x03\x03\x01\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x00\x01\x00\x01\x00\x02\x01\x00\x01\x02\x01\x00' > "$out/store_struct/small"
printf '\x01\x00\x00\x00\x02\x00\x00\x00\x00\x00\x02\x02\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x00\x00\x02\x28\x01\x00\x00\x00\x00\x01' > "$out/store_struct/claim"
printf '\x01\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x03\x03\x00\x00\x00\x01\x03\x00\x01\x03\x00\x01\x00\x00\x00\x00' > "$out/store_struct/nan"

# Checkpoints: lenet on the 4x4 store above (the smallest checkpoint a model of ours makes,
# the model targets/checkpoint.cpp loads into), one epoch, saved; the seeds are it re-signed
# and loaded (choice byte 3), and an h5py copy without our header (as format 1 files are),
# loaded (2). The fuzzer's mutations of the choice byte reach the other modes.
OMP_NUM_THREADS=1 "$bin/ddpv-train" --data "$out/store_raw/plain.h5" --model lenet --epochs 1 \
  --batch-size 2 --threads 1 --checkpoint-dir "$work/ckpt" --no-progress >/dev/null
ckpt=$(ls "$work"/ckpt/ckpt-*.h5 | head -1)
mkdir -p "$out/checkpoint"
{ printf '\x03'; cat "$ckpt"; } > "$out/checkpoint/lenet-resign-load"
"$py" - "$ckpt" "$work/plain.h5" <<'PY'
import h5py, sys
with h5py.File(sys.argv[1], "r") as src, h5py.File(sys.argv[2], "w") as dst:
    for k, v in src.attrs.items():
        dst.attrs[k] = v
    for g in src:
        src.copy(g, dst)
PY
{ printf '\x02'; cat "$work/plain.h5"; } > "$out/checkpoint/h5py-load"
du -sh "$out"/*
