#!/usr/bin/env bash
# JPEG stores (format version 2, encoded splits) end to end, every expected value computed here
# with PIL and h5py from the inputs, never taken from our own output:
# 1. `ddpv-convert folder --encode jpeg` on a train/val tree with hostile inputs in it: a
#    truncated JPEG, a text file named .jpg, a JPEG whose header claims 60000x60000 (over the
#    default --max-pixels), a symlink loop (all skipped, each counted and named); a CMYK JPEG,
#    a 16-bit PNG, an 8-bit PNG and an RGBA PNG (re-encoded, their pixels checked); a grayscale
#    JPEG (kept as it was, decoding to 3 channels). The layout (offsets, shapes, labels,
#    attributes, the train mean and std) is read back with h5py; kept images are the source
#    files byte for byte; the store is the same whatever --threads; --max-side shrinks and
#    re-encodes exactly the larger images; `inspect --read-all` passes; --strict fails on the
#    same tree leaving no OUT or OUT.tmp.
# 2. The ImageNet layout's errors: an empty class folder (train or val), a train class whose
#    every file is skipped, a val class that is not a train class; a flat val folder with
#    --val-labels (classes by name and by index, an unlisted file skipped as "unlabelled val
#    image", a listed file that is missing an error).
# 3. A store written by h5py alone (as docs/data-format.md shows) passes `inspect --read-all`
#    and trains one epoch (2 steps, then val) under mpirun -np 2 with resnet20 --crop 32.
# 4. A store damaged after writing (the middle of one image's bytes overwritten): `inspect
#    --read-all` fails naming the image; training under mpirun -np 2 stops, neither hanging nor
#    skipping it, with one line naming the store, the split and the image (train, and val).
source "$(dirname "$0")/lib.sh"
C="$BIN/ddpv-convert"
"$PY" -c "import h5py, numpy, PIL" 2>/dev/null || { echo "skip: $PY lacks h5py, numpy or PIL"; exit 77; }
D="$WORK/tree"

# nothing_left OUT: neither OUT nor OUT.tmp exists.
nothing_left() { [ ! -e "$1" ] && [ ! -e "$1.tmp" ] || fail "$1 or $1.tmp left behind"; }
# convert_fails TEXT OUT ARGS...: `ddpv-convert folder ARGS --out OUT` exits 1 with one line on
# stderr holding TEXT (fixed string), leaving nothing behind.
convert_fails() {
  local text=$1 out=$2 rc=0; shift 2
  timeout 120 "$C" folder "$@" --out "$out" >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
  [ "$rc" = 1 ] || { cat "$WORK/out.txt" "$WORK/err.txt"; fail "exit $rc, expected 1: folder $*"; }
  [ "$(grep -vc '^ddpv warning' "$WORK/err.txt")" = 1 ] || { cat "$WORK/err.txt"; fail "not one line of error: folder $*"; }
  grep -qF -- "$text" "$WORK/err.txt" || { cat "$WORK/err.txt"; fail "no '$text' from: folder $*"; }
  nothing_left "$out"
}

# ---- 1. Conversion of a tree with hostile inputs ---------------------------------------------
# The generator writes the tree and $D/expect.json: per split the images that must be stored, in
# store order (classes sorted, files sorted within a class), each with its label and whether its
# bytes must be kept or re-encoded, and for re-encoded ones the pixels it must decode to.
"$PY" - "$D" <<'PYEOF'
import json, os, sys
import numpy as np
from PIL import Image
root = sys.argv[1]
rng = np.random.default_rng(7)

def textured(h, w, seed, noise=40):  # gradients, a sawtooth, noise
    r = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // (w - 1), y * 255 // (h - 1), (x + y) * 3 % 256], -1)
    return np.clip(base + r.integers(0, noise + 1, size=(h, w, 3)), 0, 255).astype(np.uint8)

def smooth(h, w, seed):  # gradients in all three channels, a little noise
    r = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 220 // (w - 1), y * 220 // (h - 1), (x + y) * 220 // (h + w - 2)], -1)
    return (base + r.integers(0, 5, size=(h, w, 3))).astype(np.uint8)

classes = ["ant", "bee", "cat"]
expect = {"train": [], "val": [], "classes": classes}
for split, n in (("train", 8), ("val", 3)):
    for c, name in enumerate(classes):
        os.makedirs(f"{root}/{split}/{name}")
        for i in range(n):
            h, w = (int(v) for v in rng.integers(60, 121, size=2))
            path = f"{root}/{split}/{name}/img{i:02d}.jpg"
            Image.fromarray(textured(h, w, 100 * c + i + 1000 * (split == "val"))).save(path, quality=90)
            expect[split].append({"path": path, "label": c, "kept": True, "hw": [h, w]})

t = f"{root}/train"
good = open(f"{t}/ant/img00.jpg", "rb").read()
# Skipped, 3 "corrupt or unreadable images" and 1 "symlink loop":
open(f"{t}/ant/trunc.jpg", "wb").write(good[: len(good) // 2])   # cut in the entropy data
open(f"{t}/bee/x.jpg", "w").write("this is a text file, not a JPEG\n")
huge = bytearray(good)                                             # SOF0 claims 60000x60000
i = 2
while huge[i + 1] != 0xC0:
    i += 2 + (huge[i + 2] << 8 | huge[i + 3])
huge[i + 5:i + 9] = (60000).to_bytes(2, "big") * 2                # 3.6e9 pixels > 2^26
open(f"{t}/cat/huge.jpg", "wb").write(bytes(huge))
os.symlink("loop.jpg", f"{t}/bee/loop.jpg")
# Stored. Smooth pictures (little noise) for the re-encoded ones, so that a quality-90 encode
# stays within a few levels of the source and a wrong colour conversion stands out.
rgb = smooth(70, 90, 5)
Image.fromarray(rgb).convert("CMYK").save(f"{t}/ant/cmyk.jpg", quality=95)
# A grayscale JPEG is kept as it is and decodes to RGB (3 channels in shapes).
Image.fromarray(textured(80, 64, 6)).convert("L").save(f"{t}/bee/gray.jpg", quality=90)
# 16-bit grayscale PNG (PIL writes mode I;16 as bit depth 16, colour type 0): the 8-bit value of
# sample v is v / 257 (the PNG spec's sample depth rescaling, what PIL, OpenCV and torchvision
# give); there is no gAMA chunk, so no transfer curve applies.
v16 = (np.mgrid[0:50, 0:75][1] * 800 + 1000).astype(np.uint16)
Image.frombytes("I;16", (75, 50), v16.astype("<u2").tobytes()).save(f"{t}/cat/deep.png")
plain = smooth(66, 99, 8)
Image.fromarray(plain).save(f"{t}/cat/plain.png")
np.save(f"{root}/ref_cmyk.npy", np.asarray(Image.open(f"{t}/ant/cmyk.jpg").convert("RGB")))
np.save(f"{root}/ref_deep.npy", np.repeat(np.round(v16 / 257.0).astype(np.uint8)[..., None], 3, -1))
np.save(f"{root}/ref_plain.npy", plain)
# RGBA PNG: PIL's convert("RGB") (torchvision's loader) drops the alpha channel; composing onto
# black would darken every pixel below full opacity.
alpha = (np.mgrid[0:60, 0:80][1] * 3).astype(np.uint8)
rgba = np.dstack([smooth(60, 80, 9), alpha])
Image.fromarray(rgba, "RGBA").save(f"{t}/cat/rgba.png")
np.save(f"{root}/ref_rgba.npy", np.asarray(Image.open(f"{t}/cat/rgba.png").convert("RGB")))
extra = {"ant": [("cmyk.jpg", False, "ref_cmyk.npy", [70, 90])],
         "bee": [("gray.jpg", True, None, [80, 64])],
         "cat": [("deep.png", False, "ref_deep.npy", [50, 75]), ("plain.png", False, "ref_plain.npy", [66, 99]),
                 ("rgba.png", False, "ref_rgba.npy", [60, 80])]}
for c, name in enumerate(classes):
    for f, kept, ref, hw in extra[name]:
        expect["train"].append({"path": f"{t}/{name}/{f}", "label": c, "kept": kept,
                                "ref": ref and f"{root}/{ref}", "hw": hw})
for s in ("train", "val"):
    expect[s].sort(key=lambda e: (e["label"], os.path.basename(e["path"])))
json.dump(expect, open(f"{root}/expect.json", "w"), indent=1)
PYEOF

read -r n_train n_val n_kept n_reenc < <("$PY" -c "
import json; e = json.load(open('$D/expect.json'))
k = sum(x['kept'] for s in ('train', 'val') for x in e[s])
print(len(e['train']), len(e['val']), k, len(e['train']) + len(e['val']) - k)")

"$C" folder --train-root "$D/train" --val-root "$D/val" --encode jpeg --size 48 --threads 2 \
  --out "$WORK/s.h5" >"$WORK/conv.txt" 2>"$WORK/conv.err" || { cat "$WORK/conv.txt" "$WORK/conv.err"; fail "conversion of the hostile tree failed"; }
cat "$WORK/conv.txt"
grep -qF "train $n_train, val $n_val JPEG images" "$WORK/conv.txt" || fail "expected train $n_train, val $n_val images"
grep -qF "ddpv-convert: JPEG store: $n_kept images kept as they were, $n_reenc re-encoded (quality 90)" "$WORK/conv.txt" ||
  fail "expected $n_kept images kept and $n_reenc re-encoded"
grep -q "^ddpv-convert: skipped 4 files: .* (see the warnings" "$WORK/conv.txt" || fail "expected a summary of 4 skipped files"
grep -qF "3 corrupt or unreadable images" "$WORK/conv.txt" || fail "expected 3 corrupt or unreadable images (truncated, text, huge)"
grep -qF "1 symlink loop" "$WORK/conv.txt" || fail "expected 1 symlink loop"
for w in "ant/trunc.jpg: corrupt JPEG" "bee/x.jpg: " "cat/huge.jpg: JPEG declares 60000x60000 pixels, over the cap of 67108864 (--max-pixels)" \
         "bee/loop.jpg: symlink loop"; do
  grep -qF "skipping $D/train/$w" "$WORK/conv.err" || { cat "$WORK/conv.err"; fail "no warning: skipping $w"; }
done
[ "$(grep -c 'skipping' "$WORK/conv.err")" = 4 ] || { cat "$WORK/conv.err"; fail "expected 4 skip warnings"; }

# check_store STORE EXPECT.json SIZE: the layout and the contents, read with h5py and PIL.
check_store() {
  "$PY" - "$@" <<'PYEOF'
import io, json, sys
import h5py, numpy as np
from PIL import Image
store, expect, size = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3])
errors = []
with h5py.File(store, "r") as f:
    a = f.attrs
    assert a["format"] == "ddpvision-image-store", a["format"]
    assert int(a["format_version"]) == 2, a["format_version"]
    assert int(a["num_classes"]) == len(expect["classes"]), a["num_classes"]
    names = [n.decode() if isinstance(n, bytes) else n for n in a["class_names"]]
    assert names == expect["classes"], names
    assert int(a["height"]) == int(a["width"]) == size, (a["height"], a["width"])
    assert int(a["channels"]) == 3
    assert a["mean"].dtype == np.float32 and a["std"].dtype == np.float32
    assert a["mean"].shape == a["std"].shape == (3,) and (a["std"] > 0).all(), (a["mean"], a["std"])
    for split in ("train", "val"):
        g, want = f[split], expect[split]
        assert g.attrs["encoding"] == "jpeg", dict(g.attrs)
        data, off, shp, lab = g["data"][...], g["offsets"][...], g["shapes"][...], g["labels"][...]
        assert data.dtype == np.uint8 and data.ndim == 1
        assert off.dtype == np.int64 and shp.dtype == np.int32 and lab.dtype == np.int32
        n = len(want)
        assert off.shape == (n + 1,) and shp.shape == (n, 3) and lab.shape == (n,), (split, off.shape, shp.shape, lab.shape, n)
        assert off[0] == 0 and (np.diff(off) > 0).all() and off[-1] == len(data), (split, off)
        assert lab.tolist() == [e["label"] for e in want], (split, lab.tolist())
        for i, e in enumerate(want):
            b = data[off[i]:off[i + 1]].tobytes()
            where = f"{split}[{i}] {e['path']}"
            assert b[:2] == b"\xff\xd8", where
            if e["kept"]:
                if b != open(e["path"], "rb").read():
                    errors.append(f"{where}: stored bytes differ from the source file")
            else:
                im = Image.open(io.BytesIO(b))
                if im.format != "JPEG" or im.mode != "RGB":
                    errors.append(f"{where}: re-encoded as {im.format} {im.mode}, expected an RGB JPEG")
                got, ref = np.asarray(im.convert("RGB")).astype(int), np.load(e["ref"]).astype(int)
                if got.shape != ref.shape:
                    errors.append(f"{where}: decodes to {got.shape}, expected {ref.shape}")
                else:
                    err = np.abs(got - ref).mean(axis=(0, 1))
                    if (err > 4).any():
                        errors.append(f"{where}: mean abs difference per channel {err.round(1).tolist()} from the "
                                      f"expected pixels (first row {got[0, :6, 0].tolist()}, expected {ref[0, :6, 0].tolist()})")
            h, w = e["hw"]
            if shp[i].tolist() != [h, w, 3]:
                errors.append(f"{where}: shapes {shp[i].tolist()}, expected {[h, w, 3]}")
            with Image.open(io.BytesIO(b)) as im:
                if im.size != (w, h):
                    errors.append(f"{where}: the JPEG is {im.size}, expected {(w, h)}")
    # The train mean and std (0..1 scale): the converter takes them from a full decode of every
    # 8th train image (docs/data-format.md); PIL's decoder may round differently, hence 0.01.
    g = f["train"]
    off, data = g["offsets"][...], g["data"][...]
    px = np.concatenate([np.asarray(Image.open(io.BytesIO(data[off[i]:off[i + 1]].tobytes())).convert("RGB"),
                                    np.float64).reshape(-1, 3) / 255 for i in range(0, len(off) - 1, 8)])
    if np.abs(px.mean(0) - a["mean"]).max() > 0.01 or np.abs(px.std(0) - a["std"]).max() > 0.01:
        errors.append(f"mean {a['mean']} std {a['std']}, expected about {px.mean(0)} {px.std(0)}")
for e in errors:
    print("FAIL:", e)
sys.exit(1 if errors else 0)
PYEOF
}
check_store "$WORK/s.h5" "$D/expect.json" 48 || fail "the JPEG store does not hold what went in (above)"
"$C" inspect "$WORK/s.h5" --read-all >"$WORK/inspect.txt" 2>&1 || { cat "$WORK/inspect.txt"; fail "inspect --read-all rejected the store"; }
grep -qF "OK: $WORK/s.h5 is a valid image store" "$WORK/inspect.txt" || { cat "$WORK/inspect.txt"; fail "no OK from inspect"; }

# The same store whatever the thread count.
"$C" folder --train-root "$D/train" --val-root "$D/val" --encode jpeg --size 48 --threads 1 \
  --out "$WORK/s1.h5" >/dev/null 2>&1 || fail "conversion with --threads 1 failed"
"$PY" - "$WORK/s.h5" "$WORK/s1.h5" <<'PYEOF' || fail "--threads 1 and --threads 2 wrote different stores"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as a, h5py.File(sys.argv[2], "r") as b:
    for s in ("train", "val"):
        for k in ("data", "offsets", "shapes", "labels"):
            assert np.array_equal(a[s][k][...], b[s][k][...]), (s, k)
    assert np.array_equal(a.attrs["mean"], b.attrs["mean"]) and np.array_equal(a.attrs["std"], b.attrs["std"])
PYEOF

# --max-side 100: a JPEG with a side over 100 is shrunk (aspect kept, longer side 100) and
# re-encoded, close to PIL's antialiased bilinear resize of it; the others stay as they are.
"$C" folder --train-root "$D/train" --encode jpeg --max-side 100 --out "$WORK/ms.h5" >"$WORK/ms.txt" 2>/dev/null ||
  { cat "$WORK/ms.txt"; fail "conversion with --max-side 100 failed"; }
"$PY" - "$WORK/ms.h5" "$D/expect.json" "$WORK/ms.txt" <<'PYEOF' || fail "--max-side 100 did not shrink exactly the larger images"
import io, json, sys
import h5py, numpy as np
from PIL import Image
want = json.load(open(sys.argv[2]))["train"]
with h5py.File(sys.argv[1], "r") as f:
    g = f["train"]
    off, data, shp = g["offsets"][...], g["data"][...], g["shapes"][...]
    assert len(off) == len(want) + 1, len(off)
    kept = 0
    for i, e in enumerate(want):
        b = data[off[i]:off[i + 1]].tobytes()
        h, w = e["hw"]
        if max(h, w) <= 100:
            assert (b == open(e["path"], "rb").read()) == e["kept"], e["path"]
            kept += e["kept"]
            assert shp[i].tolist() == [h, w, 3], (e["path"], shp[i])
            continue
        im = Image.open(io.BytesIO(b))
        eh, ew = round(h * 100 / max(h, w)), round(w * 100 / max(h, w))
        assert abs(im.height - eh) <= 1 and abs(im.width - ew) <= 1 and max(im.size) == 100, (e["path"], im.size, (ew, eh))
        assert shp[i].tolist() == [im.height, im.width, 3], (e["path"], shp[i], im.size)
        ref = np.asarray(Image.open(e["path"]).convert("RGB").resize(im.size, Image.BILINEAR), np.float64)
        err = np.abs(np.asarray(im.convert("RGB"), np.float64) - ref).mean()
        assert err < 6, (e["path"], err)
    line = f"{kept} images kept as they were, {len(want) - kept} re-encoded"
    assert line in open(sys.argv[3]).read(), line
PYEOF

# --strict: the first bad file is fatal, and nothing is written.
convert_fails "(without --strict it would be skipped)" "$WORK/strict.h5" --train-root "$D/train" --val-root "$D/val" --encode jpeg --strict
grep -qE "$D/train/(ant/trunc|bee/x|bee/loop|cat/huge)\.jpg: " "$WORK/err.txt" || { cat "$WORK/err.txt"; fail "--strict did not name a bad file"; }

# ---- 2. The ImageNet layout's errors and --val-labels ----------------------------------------
E="$WORK/inet"
mkdir -p "$E/train/a" "$E/train/b" "$E/val/a" "$E/val/b" "$E/flat"
cp "$D"/train/ant/img0[0-2].jpg "$E/train/a/"
cp "$D"/train/bee/img0[0-2].jpg "$E/train/b/"
cp "$D/val/ant/img00.jpg" "$E/val/a/"
cp "$D/val/bee/img00.jpg" "$E/val/b/"
mkdir "$E/train/c"
convert_fails "$E/train/c: empty class folder" "$E/o.h5" --train-root "$E/train" --val-root "$E/val" --encode jpeg
echo "notes" >"$E/train/c/readme.txt"   # not an image: the folder is still empty
convert_fails "$E/train/c: empty class folder" "$E/o.h5" --train-root "$E/train" --val-root "$E/val" --encode jpeg
echo "not a picture" >"$E/train/c/x.jpg"   # every file of it skipped: a class without images
convert_fails "class 'c': every train image of it was skipped" "$E/o.h5" --train-root "$E/train" --val-root "$E/val" --encode jpeg
rm -r "$E/train/c"
mv "$E/val/b/img00.jpg" "$E/v.jpg"
convert_fails "$E/val/b: empty class folder" "$E/o.h5" --train-root "$E/train" --val-root "$E/val" --encode jpeg
mv "$E/v.jpg" "$E/val/b/img00.jpg"
mkdir "$E/val/b2"
cp "$D/val/cat/img00.jpg" "$E/val/b2/"
convert_fails "class 'b2' is not a class folder of the train tree" "$E/o.h5" --train-root "$E/train" --val-root "$E/val" --encode jpeg
rm -r "$E/val/b2"
"$C" folder --train-root "$E/train" --val-root "$E/val" --encode jpeg --out "$E/ok.h5" >/dev/null 2>&1 || fail "the fixed val tree was refused"

# A flat val folder: classes by name and by index; an unlisted file is skipped and counted.
cp "$D/val/bee/img01.jpg" "$E/flat/n01.jpg"
cp "$D/val/ant/img01.jpg" "$E/flat/n02.jpg"
cp "$D/val/ant/img02.jpg" "$E/flat/n03.jpg"
cp "$D/val/bee/img02.jpg" "$E/flat/n04.jpg"
cp "$D/val/cat/img01.jpg" "$E/flat/zz_unlisted.jpg"
printf 'n03.jpg a\nn01.jpg b\nn02.jpg 0\nn04.jpg 1\n' >"$E/labels.txt"
"$C" folder --train-root "$E/train" --val-root "$E/flat" --val-labels "$E/labels.txt" --encode jpeg \
  --out "$E/flat.h5" >"$E/out.txt" 2>"$E/err.txt" || { cat "$E/out.txt" "$E/err.txt"; fail "--val-labels conversion failed"; }
grep -qF "ddpv-convert: skipped 1 file: 1 unlabelled val image" "$E/out.txt" || { cat "$E/out.txt"; fail "the unlisted val image was not counted as unlabelled"; }
grep -qF "skipping $E/flat/zz_unlisted.jpg" "$E/err.txt" || { cat "$E/err.txt"; fail "no warning naming the unlisted val image"; }
"$PY" - "$E" <<'PYEOF' || fail "the flat val split does not hold the listed images with their labels"
import sys, h5py
e = sys.argv[1]
with h5py.File(f"{e}/flat.h5", "r") as f:
    g = f["val"]
    assert g.attrs["encoding"] == "jpeg"
    want = [("n01.jpg", 1), ("n02.jpg", 0), ("n03.jpg", 0), ("n04.jpg", 1)]   # files sorted
    assert g["labels"][...].tolist() == [l for _, l in want], g["labels"][...]
    off, data = g["offsets"][...], g["data"][...]
    assert len(off) == len(want) + 1
    for i, (name, _) in enumerate(want):
        assert data[off[i]:off[i + 1]].tobytes() == open(f"{e}/flat/{name}", "rb").read(), name
PYEOF
printf 'n03.jpg a\nn01.jpg b\nn02.jpg 0\nn04.jpg 1\ngone.jpg a\nzz_unlisted.jpg b\n' >"$E/labels2.txt"
convert_fails "lists 'gone.jpg', which is not an image in $E/flat" "$E/o.h5" --train-root "$E/train" --val-root "$E/flat" --val-labels "$E/labels2.txt" --encode jpeg

# ---- 3. A store written by h5py alone trains ---------------------------------------------------
"$PY" - "$WORK/foreign.h5" <<'PYEOF'
import io, sys
import h5py, numpy as np
from PIL import Image
rng = np.random.default_rng(11)
def split(n, k):
    blobs, sizes, labels = [], [], []
    for i in range(n):
        h, w = (int(v) for v in rng.integers(40, 90, size=2))
        c = i % k
        px = rng.integers(0, 60, size=(h, w, 3)) + np.array([160 if j == c else 40 for j in range(3)])
        im = Image.fromarray(px.clip(0, 255).astype(np.uint8))
        if i == 3: im = im.convert("L")            # a grayscale JPEG in an RGB store
        b = io.BytesIO(); im.save(b, "JPEG", quality=85)
        blobs.append(b.getvalue()); sizes.append((h, w)); labels.append(c)
    return blobs, sizes, labels
k = 2
with h5py.File(sys.argv[1], "w") as f:
    f.attrs.update(format="ddpvision-image-store", format_version=2, num_classes=k,
                   height=224, width=224, channels=3, mean=[0.485, 0.456, 0.406],
                   std=[0.229, 0.224, 0.225])
    f.attrs["class_names"] = ["red", "green"]
    for name, n in (("train", 16), ("val", 6)):
        blobs, sizes, labels = split(n, k)
        g = f.create_group(name)
        g.attrs["encoding"] = "jpeg"
        g["data"] = np.frombuffer(b"".join(blobs), np.uint8)
        g["offsets"] = np.concatenate([[0], np.cumsum([len(b) for b in blobs])]).astype(np.int64)
        g["shapes"] = np.array([(h, w, 3) for h, w in sizes], np.int32)
        g["labels"] = np.array(labels, np.int32)
PYEOF
"$C" inspect "$WORK/foreign.h5" --read-all >"$WORK/finspect.txt" 2>&1 || { cat "$WORK/finspect.txt"; fail "inspect --read-all rejected the h5py store"; }
grep -qF "OK: $WORK/foreign.h5 is a valid image store" "$WORK/finspect.txt" || { cat "$WORK/finspect.txt"; fail "no OK from inspect of the h5py store"; }
TRAIN=(--model resnet20 --crop 32 --batch-size 4 --device cpu --no-progress)
# 16 images, 2 ranks x 4: one epoch is 2 steps, then the 6 val images.
timeout 120 "${MPI2[@]}" "$BIN/ddpv-train" --data "$WORK/foreign.h5" "${TRAIN[@]}" --loader-threads 1 --epochs 1 \
  --metrics "$WORK/foreign.jsonl" >"$WORK/foreign.txt" 2>&1 || { cat "$WORK/foreign.txt"; fail "training on the h5py JPEG store exited non-zero"; }
grep -qF "input (32, 32, 3), 2 classes" "$WORK/foreign.txt" || { cat "$WORK/foreign.txt"; fail "--crop 32 did not make the input 32x32x3"; }
[ "$(json_field "$WORK/foreign.jsonl" summary steps)" = 2 ] || fail "expected 2 steps on the h5py store"
for key in train_loss val_loss; do
  v=$(json_field "$WORK/foreign.jsonl" summary $key)
  "$PY" -c "import math,sys; sys.exit(0 if math.isfinite(float('$v')) else 1)" 2>/dev/null || fail "$key on the h5py store is $v"
done

# ---- 4. A store damaged after writing --------------------------------------------------------
# damage STORE SPLIT I: 400 random bytes over the middle of image I's bytes; offsets untouched.
damage() {
  "$PY" - "$@" <<'PYEOF'
import sys, h5py, numpy as np
path, split, i = sys.argv[1], sys.argv[2], int(sys.argv[3])
with h5py.File(path, "r+") as f:
    g = f[split]
    a, b = (int(x) for x in g["offsets"][i:i + 2])
    assert b - a > 1000, b - a
    mid = (a + b) // 2
    g["data"][mid - 200:mid + 200] = np.random.default_rng(1).integers(0, 256, 400, dtype=np.uint8)
PYEOF
}
cp "$WORK/foreign.h5" "$WORK/bad.h5"
damage "$WORK/bad.h5" train 5
rc=0
"$C" inspect "$WORK/bad.h5" --read-all >"$WORK/binspect.txt" 2>&1 || rc=$?
[ "$rc" = 1 ] || { cat "$WORK/binspect.txt"; fail "inspect --read-all of the damaged store: exit $rc, expected 1"; }
grep -qF "split 'train' image 5: corrupt JPEG" "$WORK/binspect.txt" || { cat "$WORK/binspect.txt"; fail "inspect did not name train image 5"; }
grep -qF "(the first is 5)" "$WORK/binspect.txt" || { cat "$WORK/binspect.txt"; fail "inspect's error does not name image 5"; }
[ "$(grep -c "image [0-9]*: corrupt" "$WORK/binspect.txt")" = 1 ] || { cat "$WORK/binspect.txt"; fail "inspect found other images corrupt than 5"; }

# trains_to_error STORE SPLIT I [ARGS...]: training stops (non-zero, no hang), one line naming
# the store, the split and the image, pointing at inspect --read-all.
trains_to_error() {
  local store=$1 split=$2 i=$3 rc=0 out="$WORK/train_$2.txt"; shift 3
  timeout 120 "${MPI2[@]}" "$BIN/ddpv-train" --data "$store" "${TRAIN[@]}" --epochs 2 "$@" >"$out" 2>&1 || rc=$?
  [ "$rc" != 124 ] || { cat "$out"; fail "training on a store with a corrupt $split image hung (killed after 120 s)"; }
  [ "$rc" != 0 ] || { cat "$out"; fail "training on a store with a corrupt $split image exited 0"; }
  [ "$(grep -c "image $i:" "$out")" = 1 ] || { cat "$out"; fail "expected the corrupt $split image $i named exactly once"; }
  grep -q "store $store: split '$split' image $i: corrupt JPEG: .*ddpv-convert inspect --read-all" "$out" ||
    { cat "$out"; fail "no line naming store, split '$split', image $i and inspect --read-all"; }
}
trains_to_error "$WORK/bad.h5" train 5 --val-split none --loader-threads 1
# An evaluation image too, read from the file (no cache) by 2 loader threads.
cp "$WORK/foreign.h5" "$WORK/badval.h5"
damage "$WORK/badval.h5" val 4
trains_to_error "$WORK/badval.h5" val 4 --cache-mb 0 --loader-threads 2
echo "PASS"
