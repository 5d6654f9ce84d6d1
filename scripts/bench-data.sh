#!/usr/bin/env bash
# `make bench-data`: the JPEG input pipeline against torchvision's on this machine, in one run.
# An ImageNet-like folder of synthetic JPEGs (bench/data/make_jpeg_folder.py: ~500x375,
# quality 90, 4:2:0, textured) is converted into a JPEG store by ddpv-convert (timed: its
# images/s per core), and then our Loader (bench/data_bench.cpp, over the store) and
# torchvision's ImageFolder + DataLoader (bench/peer/torchvision_data.py, over the folder)
# deliver batches of 64 224x224 crops with the train transform (RandomResizedCrop + flip +
# normalise) and the val one (resize to 256 + centre crop + normalise), at 1 and 2 decode
# threads / worker processes of one thread each (Note [Peer data fairness] in the peer).
# Ours and torchvision's alternate, ROUNDS times, who goes first swapping each round; the
# table gives medians over rounds. Every timed run has the page cache warm (the folder and the
# store were just written); where the page cache can be dropped (root, a writable
# /proc/sys/vm/drop_caches) ours also runs once cold, with data_bench --cold. Also one run of
# bench/data/store_layout.py: two HDF5 layouts of the same JPEG bytes, read in random batches
# with h5py, and the same through our reader (data_bench --layouts).
# The table goes to $BUILD_DIR/bench-data/latest.md and, in a full run, to
# $RESULTS_DIR/data-latest.md, and a full run appends one record to $HISTORY (the fields of
# bench/peer/history.py's records, "kind": "data", figures data_* and store_*).
#   ROUNDS=3           rounds (medians over rounds)
#   BATCHES=40         timed batches of each run (2 untimed ones before them)
#   THREADS="1 2"      decode threads / DataLoader workers measured
#   QUICK=1            smoke test: 200 train / 60 val images, 1 round, 3 batches, 1 thread;
#                      nothing goes to bench/results
#   RESULTS_DIR=DIR    where data-latest.md goes (default bench/results)
#   HISTORY=FILE       the record a full run is appended to (default $RESULTS_DIR/history.jsonl;
#                      HISTORY= appends nothing)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
BIN=$BUILD_DIR/bin
PY=/usr/bin/python3
QUICK=${QUICK:-0}
WORK=$BUILD_DIR/bench-data
JPEGS=$WORK/jpegs
STORE=$WORK/store.h5
RAW=$WORK/raw
BATCH=64
CROP=224
WARMUP=2
if [ "$QUICK" = 1 ]; then
  ROUNDS=${ROUNDS:-1}
  BATCHES=${BATCHES:-3}
  THREADS=${THREADS:-1}
  N_TRAIN=200 N_VAL=60
  LAYOUT_ARGS=(--reads 5 --batch 64)
else
  ROUNDS=${ROUNDS:-3}
  BATCHES=${BATCHES:-40}
  THREADS=${THREADS:-1 2}
  N_TRAIN=2000 N_VAL=500
  LAYOUT_ARGS=(--reads 50 --batch 256)
fi
RESULTS_DIR=${RESULTS_DIR:-bench/results}
HISTORY=${HISTORY-$RESULTS_DIR/history.jsonl}
for v in ROUNDS BATCHES; do
  if ! [[ ${!v} =~ ^[1-9][0-9]*$ ]]; then
    echo "bench-data.sh: $v must be a positive integer, got '${!v}'" >&2
    exit 2
  fi
done
for t in $THREADS; do
  [[ $t =~ ^[1-9][0-9]*$ ]] ||
    { echo "bench-data.sh: THREADS must list positive integers, got '$THREADS'" >&2; exit 2; }
done
for tool in "$BIN/ddpv-convert" "$BIN/data_bench"; do
  [ -x "$tool" ] || { echo "bench-data.sh: $tool is missing: build first (make build)" >&2; exit 1; }
done
"$PY" -c "import numpy, PIL, h5py, torch, torchvision" 2>/dev/null ||
  { echo "bench-data.sh: $PY lacks numpy, PIL, h5py, torch or torchvision:" \
      "run scripts/install-deps.sh --bench" >&2; exit 1; }
rm -rf "$RAW"
mkdir -p "$RAW"

# One thread per decode thread or worker on both sides (Note [Peer data fairness]).
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
logged() {  # name, then a command: stdout to $RAW/name.out, stderr to $RAW/name.err
  local name=$1 rc=0
  shift
  "$@" >"$RAW/$name.out" 2>"$RAW/$name.err" || rc=$?
  if [ $rc != 0 ]; then
    echo "bench-data.sh: $name failed (exit $rc): $*" >&2
    tail -n 20 "$RAW/$name.out" "$RAW/$name.err" >&2
    exit 1
  fi
}
json_line() {  # name: that run's last stdout line, which must be a JSON object with images_per_s
  local name=$1
  tail -n 1 "$RAW/$name.out" >"$RAW/$name.json"
  "$PY" -c 'import json, sys; r = json.load(open(sys.argv[1])); float(r["images_per_s"])' \
    "$RAW/$name.json" 2>/dev/null ||
    { echo "bench-data.sh: $name: its last line of output is not JSON with images_per_s:" >&2
      tail -n 3 "$RAW/$name.out" >&2; exit 1; }
}
now() { date +%s.%N; }
started=$(date +%s)
t0=$(date -u '+%Y-%m-%d %H:%M UTC')
load0=$(cut -d' ' -f1-3 /proc/loadavg)
if awk '{exit !($1 > 1.0)}' /proc/loadavg; then
  echo "bench-data.sh: WARNING: load average $load0 before the start: other work shares the cores," \
    "so the figures will be noisy and low (latest.md records the load)" >&2
fi

echo "== the JPEG folder: $N_TRAIN train, $N_VAL val images in $JPEGS"
"$PY" bench/data/make_jpeg_folder.py "$JPEGS" --train "$N_TRAIN" --val "$N_VAL"

cores=$(getconf _NPROCESSORS_ONLN)
echo "== converting it into $STORE with $cores threads ($(date -u +%H:%M:%S))"
rm -f "$STORE"
c0=$(now)
logged convert "$BIN/ddpv-convert" folder --train-root "$JPEGS/train" --val-root "$JPEGS/val" \
  --encode jpeg --size $CROP --threads "$cores" --out "$STORE"
c1=$(now)
awk -v n=$((N_TRAIN + N_VAL)) -v t="$cores" -v a="$c0" -v b="$c1" \
  'BEGIN { printf "{\"images\": %d, \"threads\": %d, \"seconds\": %.3f}\n", n, t, b - a }' \
  >"$RAW/convert.json"

ours() {  # split threads round [--cold]
  logged "ours-$1-t$2-r$3${4:+-cold}" "$BIN/data_bench" --store "$STORE" --split "$1" \
    --threads "$2" --batch $BATCH --crop $CROP --batches "$BATCHES" --warmup $WARMUP ${4:+"$4"}
  json_line "ours-$1-t$2-r$3${4:+-cold}"
}
peer() {  # split workers round
  logged "peer-$1-t$2-r$3" "$PY" bench/peer/torchvision_data.py --root "$JPEGS" --split "$1" \
    --workers "$2" --batch $BATCH --crop $CROP --batches "$BATCHES" --warmup $WARMUP
  json_line "peer-$1-t$2-r$3"
}
for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r/$ROUNDS: train and val at threads $THREADS, ours and torchvision" \
    "($(date -u +%H:%M:%S))"
  for t in $THREADS; do
    for split in train val; do
      if [ $((r % 2)) = 1 ]; then  # alternate who goes first, so drift hits both alike
        ours $split "$t" "$r"
        peer $split "$t" "$r"
      else
        peer $split "$t" "$r"
        ours $split "$t" "$r"
      fi
      echo "   $split x$t done"
    done
  done
done

# Cold: the store's bytes come from the disk, not the page cache (nor our byte cache).
cold_note=""
t_cold=${THREADS%% *}
if [ "$(id -u)" = 0 ] && [ -w /proc/sys/vm/drop_caches ] &&
   (sync && echo 3 >/proc/sys/vm/drop_caches) 2>/dev/null; then
  echo "== page cache dropped: ours once cold, train, $t_cold thread(s)"
  ours train "$t_cold" 1 --cold
else
  cold_note="not measured: the page cache could not be dropped (that needs root and a writable"
  cold_note+=" /proc/sys/vm/drop_caches, which containers usually lack)"
  echo "== cold run $cold_note"
fi

# Resizing: ours against OpenCV's imgproc (from PyPI, in a virtual environment of the bench's
# own: the project does not depend on OpenCV; the comparison says whether it should).
echo "== resize: ours and OpenCV's ($(date -u +%H:%M:%S))"
logged resize_ours "$BIN/data_bench" --resize
VENV=$WORK/venv
if ! "$VENV/bin/python" -c "import cv2" 2>/dev/null; then
  { "$PY" -m venv "$VENV" && timeout 600 "$VENV/bin/pip" install -q opencv-python-headless numpy; } \
    >"$RAW/venv.out" 2>&1 || true
fi
if "$VENV/bin/python" -c "import cv2" 2>/dev/null; then
  logged resize_peer "$VENV/bin/python" bench/data/resize_peer.py
else
  echo "OpenCV could not be installed from PyPI (see $RAW/venv.out): not measured" >"$RAW/resize_peer.out"
  echo "{}" >>"$RAW/resize_peer.out"
fi

echo "== store_layout.py over the train images ($(date -u +%H:%M:%S))"
logged store_layout "$PY" bench/data/store_layout.py --folder "$JPEGS/train" --images "$N_TRAIN" \
  "${LAYOUT_ARGS[@]}"
tail -n 1 "$RAW/store_layout.out" >"$RAW/store_layout.json"
# The same comparison through our reader in C++ (h5py's slice per image is Python's cost, not
# the layout's).
logged layouts_cpp "$BIN/data_bench" --layouts --store "$STORE" --split train \
  --batch "${LAYOUT_ARGS[-1]}" --batches "${LAYOUT_ARGS[1]}"
tail -n 1 "$RAW/layouts_cpp.out" >"$RAW/layouts_cpp.json"

md=$WORK/latest.md
"$PY" - "$RAW" "$md" <<EOF
import glob, json, os, platform, statistics, subprocess, sys
sys.path.insert(0, "bench/peer")
import history

raw, md_path = sys.argv[1], sys.argv[2]
def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""
def runs(pattern):
    return [json.load(open(f)) for f in sorted(glob.glob(os.path.join(raw, pattern)))]
def cell(vals):
    m = statistics.median(vals)
    return f"{m:.0f}" if len(vals) == 1 else f"{m:.0f} ({min(vals):.0f}-{max(vals):.0f})"

threads = [int(t) for t in "$THREADS".split()]
names = {"train": f"train: RandomResizedCrop {$CROP} + flip",
         "val": f"val: Resize {int($CROP / 0.875)} + CenterCrop {$CROP}"}
rows, figures = [], {}
for t in threads:
    for split in ("train", "val"):
        ours = [r["images_per_s"] for r in runs(f"ours-{split}-t{t}-r*[0-9].json")]
        peer = [r["images_per_s"] for r in runs(f"peer-{split}-t{t}-r*.json")]
        o, p = statistics.median(ours), statistics.median(peer)
        ratio = round(o / p, 2)
        rows.append([names[split], str(t), cell(ours), f"{o / t:.0f}", cell(peer), f"{ratio:.2f}x"])
        figures[f"data_{split}_t{t}_ips"] = {"ours": round(o), "peer": round(p), "ratio": ratio}
conv = json.load(open(os.path.join(raw, "convert.json")))
per_core = conv["images"] / conv["seconds"] / conv["threads"]
figures["data_convert_ips_per_core"] = {"ours": round(per_core, 1)}
cold = runs("ours-train-t*-cold.json")
if cold:
    c = cold[0]
    cold_text = (f"{c['images_per_s']:.0f} img/s, train, {c['threads']} thread(s), page cache "
                 "dropped before it (data_bench --cold: no byte cache either)")
    figures[f"data_cold_train_t{c['threads']}_ips"] = {"ours": round(c["images_per_s"])}
else:
    cold_text = "$cold_note"
layout_line = open(os.path.join(raw, "store_layout.out")).read().strip().splitlines()[0]
layout = json.load(open(os.path.join(raw, "store_layout.json")))
for k in ("flat", "vlen"):
    figures[f"store_{k}_batch_ms"] = {"ours": layout[k]["batch_ms"]}
layout_cpp_line = open(os.path.join(raw, "layouts_cpp.out")).read().strip().splitlines()[0]
layout_cpp = json.load(open(os.path.join(raw, "layouts_cpp.json")))
for k in ("flat", "vlen"):
    figures[f"store_cpp_{k}_batch_ms"] = {"ours": layout_cpp[f"{k}_ms"]}
peer_run = runs("peer-*.json")[0]
ours_rs = json.loads(open(os.path.join(raw, "resize_ours.out")).read().strip().splitlines()[-1])
peer_lines = open(os.path.join(raw, "resize_peer.out")).read().strip().splitlines()
peer_rs = json.loads(peer_lines[-1])
parts = []
for case in ("328x328", "300x400", "160x200"):
    us = ours_rs[f"{case}_us"]
    figures[f"resize_{case}_us"] = {"ours": round(us, 1)}
    if peer_rs:
        figures[f"resize_{case}_us"]["peer"] = peer_rs[f"{case}_area_us"]
        parts.append(f"{case}: ours {us:.0f} us, OpenCV INTER_AREA {peer_rs[case + '_area_us']:.0f}, "
                     f"INTER_LINEAR {peer_rs[case + '_linear_us']:.0f}")
    else:
        parts.append(f"{case}: ours {us:.0f} us")
resize_text = "; ".join(parts) + (f" (OpenCV {peer_rs['opencv']})" if peer_rs else
                                  " (OpenCV: " + peer_lines[0] + ")")
meta = {
    "date": "$t0", "cpu": sh("lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1"),
    "cores": sh("getconf _NPROCESSORS_ONLN"),
    "simd": ("avx512" if sh("grep -m1 -ow avx512f /proc/cpuinfo") else
             "avx2" if sh("grep -m1 -ow avx2 /proc/cpuinfo") else ""),
    "commit": sh("git rev-parse --short=12 HEAD 2>/dev/null"),
    "dirty": bool(sh("git status --porcelain --untracked-files=no 2>/dev/null")),
    "load_start": "$load0", "load_end": sh("cut -d' ' -f1-3 /proc/loadavg"),
}
wall_s = int(sh("date +%s")) - $started
jpeg_kib = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk("$JPEGS") for f in fs
               if f.endswith(".JPEG")) / ($N_TRAIN + $N_VAL) / 1024
lines = [
    "# make bench-data: the JPEG input pipeline, ours against torchvision",
    "",
    f"{meta['date']}, {meta['cpu']} ({meta['cores']} cores), load {meta['load_start']} at the "
    f"start, {meta['load_end']} at the end, {wall_s / 60:.1f} min; commit {meta['commit'] or '?'}"
    f"{' (dirty)' if meta['dirty'] else ''}; torchvision {peer_run['torchvision']}, Python "
    f"{platform.python_version()}.",
    "",
    f"{$N_TRAIN} train / {$N_VAL} val synthetic JPEGs ({jpeg_kib:.0f} KiB on average, ~500x375, "
    f"quality 90, 4:2:0); batches of {$BATCH}, {$CROP}x{$CROP}, {$BATCHES} timed after {$WARMUP}; "
    f"medians (min-max) over {$ROUNDS} round(s), page cache warm. Threads: our decode threads, "
    "torchvision's DataLoader worker processes (one torch thread each).",
    "",
    "| transform | threads | ours img/s | ours img/s per thread | torchvision img/s | ratio |",
    "|---|---|---|---|---|---|",
] + ["| " + " | ".join(r) + " |" for r in rows] + [
    "",
    f"- converter (ddpv-convert folder --encode jpeg): {conv['images']} images in "
    f"{conv['seconds']:.2f} s on {conv['threads']} threads, {per_core:.0f} images/s per core",
    f"- cold cache, ours: {cold_text}",
    f"- h5py: {layout_line}",
    f"- ImageStore (C++): {layout_cpp_line}",
    "- resize to 224x224, one thread: " + resize_text,
]
text = "\n".join(lines) + "\n"
open(md_path, "w").write(text)
print(text, end="")
rec = {"kind": "data", "when": history.when_iso(meta["date"]), "cpu": meta["cpu"] or None,
       "cores": int(meta["cores"]) if meta["cores"].isdigit() else None,
       "simd": meta["simd"] or None, "rounds": $ROUNDS,
       "load_start": history._first_float(meta["load_start"]),
       "load_end": history._first_float(meta["load_end"]), "wall_min": round(wall_s / 60, 1),
       "commit": meta["commit"] or None, "dirty": meta["dirty"] if meta["commit"] else None,
       "source": "scripts/bench-data.sh", "figures": figures}
json.dump(rec, open(os.path.join(raw, "record.json"), "w"))
EOF
if [ "$QUICK" != 1 ]; then
  mkdir -p "$RESULTS_DIR"
  cp "$md" "$RESULTS_DIR/data-latest.md"
  if [ -n "$HISTORY" ]; then
    "$PY" -c 'import json, sys; sys.path.insert(0, "bench/peer"); import history
history.append(sys.argv[1], json.load(open(sys.argv[2])))' "$HISTORY" "$RAW/record.json"
    echo "bench-data.sh: table in $md and $RESULTS_DIR/data-latest.md; one record appended to $HISTORY"
  else
    echo "bench-data.sh: table in $md and $RESULTS_DIR/data-latest.md"
  fi
else
  echo "bench-data.sh: QUICK run: table in $md only"
fi
