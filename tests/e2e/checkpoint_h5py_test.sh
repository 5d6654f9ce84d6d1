#!/usr/bin/env bash
# A format 2 checkpoint as other tools see it (docs/checkpoint-format.md): h5py reads it as
# before (the header lives in the HDF5 user block), every tensor's crc32c attribute is the
# CRC32C of its values (computed here in plain Python) and the header's table names the
# offsets and sizes libhdf5 reports. Copies without the header load, checked through the
# attributes: an h5py rewrite, and h5repack's output once h5unjam strips the header it kept;
# a tensor changed in such a copy is refused, and a copy without attributes loads with a
# warning that it is unverified.
source "$(dirname "$0")/lib.sh"
make_store "$WORK" --train 128 --test 32
common=(--data "$WORK/tiny.h5" --model lenet --epochs 1 --batch-size 16 --lr 0.05
        --val-split none --no-progress)
mpirun_np 2 "$BIN/ddpv-train" "${common[@]}" --checkpoint-dir "$WORK/ck" >"$WORK/train.txt" 2>&1 ||
  { cat "$WORK/train.txt"; fail "training failed"; }
ck="$WORK/ck/$(cat "$WORK/ck/latest")"

"$PY" - "$ck" "$WORK" <<'PYEOF' || fail "the checkpoint does not read as documented"
import sys, h5py, numpy as np
path, work = sys.argv[1:]

def crc32c(data, crc=0):  # bitwise table CRC32C (Castagnoli, reflected 0x82F63B78)
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF

assert crc32c(b"123456789") == 0xE3069283
raw = open(path, "rb").read()
with h5py.File(path, "r") as f:
    a = f.attrs
    # The docs' snippet, without torch.
    assert a["format"] in ("ddpvision-checkpoint", b"ddpvision-checkpoint"), a["format"]
    assert a["format_version"] == 2 and a["model"] in ("lenet", b"lenet")
    assert (a["height"], a["width"], a["channels"], a["num_classes"]) == (28, 28, 1, 10)
    assert a["batch_size"] == 16 and a["accum_steps"] == 1 and a["global_batch"] == 32
    state = {k: v[()] for g in ("params", "buffers") for k, v in f[g].items()}
    assert sorted(state) == sorted(f["params"]) and "fc1.weight" in state, sorted(state)
    ub = f.userblock_size
    header = raw[:ub].split(b"\0")[0].decode()
    lines = header.splitlines()
    assert lines[0] == "ddpvision-checkpoint 2", lines[0]
    assert lines[1] == f"userblock {ub}" and lines[2] == f"file-bytes {len(raw)}", lines[:3]
    assert lines[3] == "payload-crc32c %08x" % crc32c(raw[ub:]), lines[3]
    assert lines[-1] == "header-crc32c %08x" % crc32c(header[: header.rindex("header-crc32c")].encode())
    table = {l.split()[3]: l.split()[:3] for l in lines[6:-1]}
    n = 0
    for g in ("params", "optimizer", "buffers"):
        for k, ds in f[g].items():
            want = "<i8" if k.endswith("num_batches_tracked") else "<f4"
            crc = crc32c(np.asarray(ds[()], dtype=want).tobytes())
            assert ds.attrs["crc32c"] == crc, (g, k, ds.attrs["crc32c"], crc)
            assert table[f"/{g}/{k}"] == ["%08x" % crc, str(ds.id.get_offset()),
                                          str(ds.id.get_storage_size())], (g, k)
            n += 1
    assert n == len(table) == int(lines[4].split()[1]), (n, len(table))
    # Copies without the header: all attributes, one tensor changed, no attributes.
    for name, change, keep_crc in (("copy", None, True), ("changed", "conv1.weight", True),
                                   ("bare", None, False)):
        with h5py.File(f"{work}/{name}.h5", "w") as out:
            for k, v in a.items():
                out.attrs[k] = v
            for g in ("params", "optimizer", "buffers"):
                f.copy(f[g], out, name=g)
                if not keep_crc:
                    for ds in out[g].values():
                        del ds.attrs["crc32c"]
            if change:
                out["params"][change][...] = out["params"][change][()] * 1.5
print("h5py reads the checkpoint, its header and its crc32c attributes as documented")
PYEOF

expect() {  # expect CODE PATTERN -- command...
  local code=$1 pattern=$2; shift 3
  local rc=0
  timeout 120 "$@" >"$WORK/out.txt" 2>&1 || rc=$?
  [ "$rc" = "$code" ] || { cat "$WORK/out.txt"; fail "exit $rc, expected $code: $*"; }
  grep -q -- "$pattern" "$WORK/out.txt" || { cat "$WORK/out.txt"; fail "no '$pattern' in the output of: $*"; }
}
resume=("${MPI2[@]}" "$BIN/ddpv-train" "${common[@]}" --resume)
expect 0 "resumed from $WORK/copy.h5 at epoch 1" -- "${resume[@]}" "$WORK/copy.h5"
! grep -q "unverified" "$WORK/out.txt" || fail "a copy with every crc32c attribute was called unverified"
expect 1 "tensor /params/conv1.weight fails its crc32c attribute" -- "${resume[@]}" "$WORK/changed.h5"
expect 0 "loaded unverified: it has no checksums" -- "${resume[@]}" "$WORK/bare.h5"
# h5repack keeps the user block, so its output no longer matches the header: refused, with a
# pointer to the remedy; without the stale header it loads.
h5repack "$ck" "$WORK/repacked.h5"
expect 1 "rewritten by a tool that kept the header" -- "${resume[@]}" "$WORK/repacked.h5"
h5unjam -i "$WORK/repacked.h5" -o "$WORK/unjammed.h5" --delete >/dev/null
expect 0 "resumed from $WORK/unjammed.h5 at epoch 1" -- "${resume[@]}" "$WORK/unjammed.h5"
! grep -q "unverified" "$WORK/out.txt" || fail "h5repack dropped the crc32c attributes"
echo "PASS"
