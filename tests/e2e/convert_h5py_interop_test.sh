#!/usr/bin/env bash
# Interoperability with h5py: a store written by h5py alone (tests/fixtures/make_h5py_store.py)
# passes `ddpv-convert inspect`, and a store written by ddpv-convert reads back in h5py with the
# same pixels and labels that went into the IDX files.
set -uo pipefail
convert="${DDPV_BIN_DIR:?}/ddpv-convert"
py="${DDPV_PYTHON3:-/usr/bin/python3}"
[[ -x "$convert" ]] || { echo "skip: $convert not built"; exit 77; }
"$py" -c "import h5py, numpy" 2>/dev/null || { echo "skip: $py lacks h5py/numpy"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$py" "${DDPV_SOURCE_DIR:?}/tests/fixtures/make_h5py_store.py" "$work/foreign.h5" || fail "fixture"
"$convert" inspect "$work/foreign.h5" --read-all >"$work/inspect.txt" || fail "inspect rejected the h5py store"
cat "$work/inspect.txt"
grep -q "per class red: 4, green: 4, blue: 4" "$work/inspect.txt" || fail "class counts"

# IDX files written by numpy, converted by us, read back by h5py.
"$py" - "$work" <<'PY' || fail "writing IDX files"
import gzip, sys
import numpy as np
w = sys.argv[1]
rng = np.random.default_rng(5)
img = rng.integers(0, 256, size=(25, 7, 9), dtype=np.uint8)
lab = rng.integers(0, 10, size=25, dtype=np.uint8)
hdr = lambda magic, dims: bytes([0, 0, 8, magic]) + b"".join(int(d).to_bytes(4, "big") for d in dims)
with gzip.open(f"{w}/img.gz", "wb") as f: f.write(hdr(3, img.shape) + img.tobytes())
with open(f"{w}/lab", "wb") as f: f.write(hdr(1, lab.shape) + lab.tobytes())
np.save(f"{w}/img.npy", img); np.save(f"{w}/lab.npy", lab)
PY
"$convert" idx --train-images "$work/img.gz" --train-labels "$work/lab" --compress gzip \
  --out "$work/ours.h5" || fail "conversion"
"$py" - "$work" <<'PY' || fail "h5py could not read our store back"
import sys
import h5py, numpy as np
w = sys.argv[1]
with h5py.File(f"{w}/ours.h5", "r") as f:
    assert f.attrs["format"] == "ddpvision-image-store", f.attrs["format"]
    assert int(f.attrs["format_version"]) == 1
    img, lab = np.load(f"{w}/img.npy"), np.load(f"{w}/lab.npy")
    got = f["train/images"][...]
    assert got.shape == (25, 7, 9, 1) and got.dtype == np.uint8, (got.shape, got.dtype)
    assert (got[..., 0] == img).all()
    assert (f["train/labels"][...] == lab).all() and f["train/labels"].dtype == np.int32
    mean = img.astype(np.float64).mean() / 255
    assert abs(float(f.attrs["mean"][0]) - mean) < 1e-6, (f.attrs["mean"], mean)
    assert len(f.attrs["class_names"]) == int(f.attrs["num_classes"]) == int(lab.max()) + 1
print("h5py read our store: ok")
PY
echo "ok"
