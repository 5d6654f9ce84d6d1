#!/usr/bin/env bash
# ddpv-convert's failure paths, for idx, cifar and folder: an --out that is a directory or one
# of the inputs (exit 2, the input untouched); broken links in a folder tree (skipped and
# counted, fatal with --strict); a file-size limit and a full disk (exit 1, one line, no crash,
# no OUT and no OUT.tmp, a previous OUT untouched). The full disk is a 1 MiB tmpfs, mounted
# when the test runs as root and the machine allows it (CI does), skipped with a message
# otherwise.
source "$(dirname "$0")/lib.sh"
C="$BIN/ddpv-convert"
MNT="$WORK/full"
trap 'umount "$MNT" 2>/dev/null || true; kill -9 $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

# expect CODE TEXT -- COMMAND...: the exit code, TEXT (fixed string) in a one-line stderr.
expect() {
  local code=$1 text=$2; shift 3
  local rc=0
  timeout 120 "$@" >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
  [ "$rc" = "$code" ] || { cat "$WORK/err.txt"; fail "exit $rc, expected $code: $*"; }
  [ "$(wc -l <"$WORK/err.txt")" = 1 ] || { cat "$WORK/err.txt"; fail "not one line of error: $*"; }
  grep -qF -- "$text" "$WORK/err.txt" || { cat "$WORK/err.txt"; fail "no '$text' from: $*"; }
}
# nothing_left OUT: neither OUT nor OUT.tmp exists.
nothing_left() { [ ! -e "$1" ] && [ ! -e "$1.tmp" ] || fail "$1 or $1.tmp left behind"; }

# Inputs, each over 1 MiB of output: 2000 28x28 IDX images (1.5 MiB); 400 CIFAR records
# (1.2 MiB); 120 small PNGs in two classes, resized to 64x64x3 (1.4 MiB).
"$PY" "$SRC/tests/e2e/make_tiny_store.py" "$WORK/idx" --train 2000 --test 10 >/dev/null
IDX=(idx --train-images "$WORK/idx/train-images" --train-labels "$WORK/idx/train-labels")
"$PY" - "$WORK" <<'PYEOF'
import os, random, struct, sys, zlib
work = sys.argv[1]
rng = random.Random(3)
with open(f"{work}/cifar.bin", "wb") as f:
    for _ in range(400):
        f.write(bytes([rng.randrange(10)]) + rng.randbytes(3072))
def png(path, w, h):
    raw = b"".join(b"\0" + rng.randbytes(3 * w) for _ in range(h))
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
for c in ("cat", "dog"):
    os.makedirs(f"{work}/root/{c}")
    for i in range(60):
        png(f"{work}/root/{c}/{i}.png", 8, 8)
PYEOF
CIFAR=(cifar --train "$WORK/cifar.bin")
FOLDER=(folder --root "$WORK/root" --size 64)

# --out an existing directory, or one of the inputs under another name: usage errors, inputs kept.
mkdir -p "$WORK/outdir"
touch "$WORK/outdir/keep"
for conv in IDX CIFAR FOLDER; do
  declare -n args=$conv
  expect 2 "--out $WORK/outdir is an existing directory" -- "$C" "${args[@]}" --out "$WORK/outdir"
  [ "$(ls "$WORK/outdir")" = keep ] || fail "$conv wrote into the --out directory"
done
cp "$WORK/idx/train-labels" "$WORK/labels.copy"
expect 2 "is the input $WORK/idx/train-labels" -- "$C" "${IDX[@]}" --out "$WORK/idx/../idx/train-labels"
cmp -s "$WORK/idx/train-labels" "$WORK/labels.copy" || fail "idx overwrote its input"
ln "$WORK/cifar.bin" "$WORK/hardlink.h5"
expect 2 "--out $WORK/hardlink.h5 is the input $WORK/cifar.bin" -- "$C" "${CIFAR[@]}" --out "$WORK/hardlink.h5"
[ "$(stat -c %s "$WORK/cifar.bin")" = $((400 * 3073)) ] || fail "cifar overwrote its input"
ln -s "$WORK/root/cat/7.png" "$WORK/alias.h5"
expect 2 "--out $WORK/alias.h5 is the input $WORK/root/cat/7.png" -- "$C" "${FOLDER[@]}" --out "$WORK/alias.h5"
cp "$WORK/idx/train-labels" "$WORK/lab.tmp"
expect 2 "(its temporary $WORK/lab.tmp, written first) is the input" -- "$C" idx --train-images "$WORK/idx/train-images" --train-labels "$WORK/lab.tmp" --out "$WORK/lab"
cmp -s "$WORK/lab.tmp" "$WORK/labels.copy" || fail "idx overwrote the input named like its temporary"
expect 1 "$WORK/outdir: not an HDF5 file" -- "$C" inspect "$WORK/outdir"

# Broken links in the tree: skipped and counted (the summary says why), fatal with --strict.
ln -s loop.png "$WORK/root/cat/loop.png"
ln -s nowhere.png "$WORK/root/dog/gone.png"
ln -s nowhere "$WORK/root/ghost"
timeout 120 "$C" "${FOLDER[@]}" --val-fraction 0 --out "$WORK/links.h5" >"$WORK/out.txt" 2>"$WORK/err.txt" ||
  { cat "$WORK/err.txt"; fail "folder with broken links failed without --strict"; }
grep -qF "ddpv-convert: skipped 3 files: 2 dangling symlinks, 1 symlink loop (see the warnings" "$WORK/out.txt" ||
  { cat "$WORK/out.txt"; fail "no count of the skipped links"; }
for p in cat/loop.png dog/gone.png ghost; do
  grep -qF "skipping $WORK/root/$p" "$WORK/err.txt" || { cat "$WORK/err.txt"; fail "no warning about $p"; }
done
grep -qF "train 120 images" "$WORK/out.txt" || { cat "$WORK/out.txt"; fail "not all 120 images stored"; }
expect 1 "$WORK/root/ghost: dangling symlink (its target does not exist) (without --strict" -- "$C" "${FOLDER[@]}" --strict --out "$WORK/strict.h5"
nothing_left "$WORK/strict.h5"
rm "$WORK/root/ghost"
expect 1 "$WORK/root/cat/loop.png: symlink loop (without --strict" -- "$C" "${FOLDER[@]}" --strict --out "$WORK/strict.h5"
nothing_left "$WORK/strict.h5"
rm "$WORK/root/cat/loop.png" "$WORK/root/dog/gone.png"

# fails_cleanly DIR TEXT: each converter fails with TEXT writing DIR/OUT.h5, leaving DIR/OUT.h5
# as it was (a few bytes standing for a previous store) and no OUT.h5.tmp.
fails_cleanly() {
  local dir=$1 text=$2 conv
  for conv in IDX CIFAR FOLDER; do
    declare -n args=$conv
    echo old >"$dir/OUT.h5"
    expect 1 "$text" -- "${LIMIT[@]}" "$C" "${args[@]}" --out "$dir/OUT.h5"
    [ "$(cat "$dir/OUT.h5")" = old ] || fail "$conv: the previous store was changed"
    [ ! -e "$dir/OUT.h5.tmp" ] || fail "$conv: OUT.h5.tmp left behind"
    [ ! -s "$WORK/out.txt" ] || { cat "$WORK/out.txt"; fail "$conv: a summary after a failure"; }
  done
}

# A file-size limit (ulimit -f, in KiB) below the store: the writer stops before passing it.
mkdir -p "$WORK/limited"
LIMIT=(bash -c 'ulimit -f 700 && exec "$@"' limit)
fails_cleanly "$WORK/limited" "file-size limit of 716800 bytes (ulimit -f)"

# A full disk: a 1 MiB tmpfs.
LIMIT=()
mkdir -p "$MNT"
if [ "$(id -u)" != 0 ]; then
  echo "SKIP: the full-disk cases need root to mount a tmpfs"
elif ! mount -t tmpfs -o size=1m tmpfs "$MNT" 2>"$WORK/mount.txt"; then
  echo "SKIP: the full-disk cases: cannot mount a tmpfs here ($(cat "$WORK/mount.txt"))"
else
  fails_cleanly "$MNT" "No space left on device"
  # Stores of growing size, plain and compressed, fill the disk at different points of the
  # writer (a chunk, the labels, the reservation before the last flush): each ends in a whole
  # store or in one clean line, never a crash.
  rm -f "$MNT"/*
  failed=0
  for opts in "--chunk-images 7" "--compress gzip"; do
    for n in $(seq 240 8 400); do
      head -c $((n * 3073)) "$WORK/cifar.bin" >"$WORK/part.bin"
      rc=0
      # shellcheck disable=SC2086
      "$C" cifar --train "$WORK/part.bin" $opts --out "$MNT/s.h5" >"$WORK/out.txt" 2>"$WORK/err.txt" || rc=$?
      if [ "$rc" = 0 ]; then
        "$C" inspect "$MNT/s.h5" --read-all >/dev/null || fail "$n records, $opts: an invalid store"
      else
        [ "$rc" = 1 ] && [ "$(wc -l <"$WORK/err.txt")" = 1 ] ||
          { cat "$WORK/err.txt"; fail "$n records, $opts: exit $rc"; }
        nothing_left "$MNT/s.h5"
        failed=$((failed + 1))
        sed 's/ (.*//; s/[0-9]* bytes/N bytes/' "$WORK/err.txt" >>"$WORK/points.txt"
      fi
      rm -f "$MNT/s.h5"
    done
  done
  [ "$failed" -ge 4 ] || fail "only $failed of the growing stores failed: the tmpfs was not filled"
  echo "full disk, failure points seen:"
  sort "$WORK/points.txt" | uniq -c
  umount "$MNT"
fi
echo "PASS"
