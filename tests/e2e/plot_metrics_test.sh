#!/bin/bash
# scripts/plot_metrics.py on a hand-written metrics file: a PNG comes out, bad lines and missing
# fields are tolerated, and errors exit 1 with one line. Skips (77) without matplotlib.
set -u
PY=${DDPV_PYTHON3:-/usr/bin/python3}
SRC=${DDPV_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
"$PY" -c 'import matplotlib' 2>/dev/null || { echo "skip: matplotlib not importable by $PY"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

cat > "$tmp/run.jsonl" <<'JSON'
{"event": "step", "step": 10, "epoch": 0.5, "loss": 2.1, "lr": 0.1, "images_per_s": 900}
{"event": "step", "step": 20, "epoch": 1, "loss": 1.7, "lr": 0.1, "images_per_s": 950}
{"event": "epoch", "epoch": 1, "step": 20, "train_loss": 1.8, "val_loss": 1.6, "val_acc": 0.61, "images_per_s": 930, "elapsed_s": 4.2}
{"event": "checkpoint", "path": "ckpt-e0001-s00000020.h5", "step": 20, "epoch": 1, "reason": "epoch"}
{"event": "step", "step": 30, "epoch": 1.5, "loss": null, "lr": 0.1}
{"event": "epoch", "epoch": 2, "train_loss": 1.2, "val_acc": 0.72}
{"event": "summary", "model": "lenet", "images_per_s": 940, "val_acc": 0.72, "world_size": 2}
{"event": "step", "st
JSON
out=$("$PY" "$SRC/scripts/plot_metrics.py" "$tmp/run.jsonl" -o "$tmp/run.png") || fail "plot failed: $out"
echo "$out"
[[ $(head -c 8 "$tmp/run.png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] || fail "not a PNG"
[[ $out == *"1 unreadable lines skipped"* ]] || fail "the torn last line was not reported"

# Only an epoch record without numbers: still a (mostly empty) plot.
echo '{"event": "epoch", "epoch": 1}' > "$tmp/sparse.jsonl"
"$PY" "$SRC/scripts/plot_metrics.py" "$tmp/sparse.jsonl" -o "$tmp/sparse.png" >/dev/null || fail "sparse file"

# Errors: one line on stderr, exit 1; usage: exit 2.
: > "$tmp/empty.jsonl"
err=$("$PY" "$SRC/scripts/plot_metrics.py" "$tmp/empty.jsonl" 2>&1); rc=$?
[[ $rc == 1 && $err == *"holds no JSON records"* && $(wc -l <<< "$err") == 1 ]] || fail "empty: rc=$rc $err"
err=$("$PY" "$SRC/scripts/plot_metrics.py" "$tmp/absent.jsonl" 2>&1); rc=$?
[[ $rc == 1 && $err == *"absent.jsonl"* ]] || fail "absent: rc=$rc $err"
"$PY" "$SRC/scripts/plot_metrics.py" >/dev/null 2>&1; rc=$?
[[ $rc == 2 ]] || fail "usage: rc=$rc"
echo "plot_metrics: ok"
