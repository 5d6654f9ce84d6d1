#!/usr/bin/env bash
# `make bench`: ddpvision against PyTorch DDP (bench/peer/torch_ddp.py) on this machine, in one
# run: synthetic training throughput of lenet and resnet20 at 1 and 2 ranks x 1 thread (and
# of two independent 1-rank runs at once: the machine's ceiling for scaling; and of our step
# on 2 ranks with a barrier after each, against 1: the step-synchronous ceiling; and of
# arithmetic in registers as long as that step, the same way: the arithmetic ceiling), the sgemm
# peak for the roofline, the wall time to 91% test accuracy on Fashion-MNIST, and the
# precision rows: fp32 and bf16 side by side (below, "precision").
# Ours and PyTorch's alternate, ROUNDS times; bench/peer/report.py prints medians and ratios,
# writes bench/results/latest.md and latest.png, and appends the run's figures to
# bench/results/history.jsonl (bench/plot_history.py draws them). Method: docs/performance.md.
#   ROUNDS=3           rounds of the throughput runs (medians over rounds)
#   QUICK=1            smoke test: 1 round, a few steps, 1 epoch on a 6000-image subset;
#                      results go to $BUILD_DIR/bench-run/quick, not bench/results
#   TTA_EPOCHS=6       epochs of the time-to-accuracy runs (cosine schedule over them)
#   TTA_ROUNDS=2       rounds of the time-to-accuracy runs, ours and PyTorch's in the order
#                      A B B A... (medians over rounds)
#   SKIP_TTA=1         no time-to-accuracy runs
#   RESULTS_DIR=DIR    where latest.md and latest.png go
#   HISTORY=FILE       the run-by-run record a full run is appended to (default
#                      $RESULTS_DIR/history.jsonl; HISTORY= appends nothing; QUICK and
#                      SKIP_TTA runs are never appended)
#   UPDATE_DOCS=1      also put the table into docs/performance.md (between its bench markers)
#   SKIP_PRECISION=1   no precision rows
#   TORCH_CURRENT=SPEC the current PyTorch for the precision rows, a pip requirement
#                      (default: torch, the latest release), in $BUILD_DIR/bench-run/torch-venv;
#                      TORCH_CURRENT= skips it
#   COMPILE=0          no torch.compile runs in the precision rows
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
BIN=$BUILD_DIR/bin
PY=/usr/bin/python3
FMNIST=/usr/share/datasets/fashion-mnist
QUICK=${QUICK:-0}
SKIP_TTA=${SKIP_TTA:-0}
TTA_EPOCHS=${TTA_EPOCHS:-6}
TTA_LR=0.05     # the demo's hyperparameters: batch 64 per rank, momentum 0.9, decay 5e-4, cosine
BATCH=64
SYN_LR=0.01     # random labels: a small rate keeps both sides finite; speed does not depend on it
if [ "$QUICK" = 1 ]; then
  ROUNDS=${ROUNDS:-1}
  TTA_ROUNDS=${TTA_ROUNDS:-1}
  TTA_EPOCHS=${TTA_EPOCHS_QUICK:-1}
  WORK=$BUILD_DIR/bench-run/quick
  RESULTS_DIR=${RESULTS_DIR:-$WORK}
  # warm-up steps / timed steps (a multiple of warm-up: ours logs every warm-up steps)
  declare -A WARMUP=([lenet]=2 [resnet20]=1) TIMED=([lenet]=6 [resnet20]=2)
else
  ROUNDS=${ROUNDS:-3}
  TTA_ROUNDS=${TTA_ROUNDS:-2}
  WORK=$BUILD_DIR/bench-run
  RESULTS_DIR=${RESULTS_DIR:-bench/results}
  declare -A WARMUP=([lenet]=10 [resnet20]=3) TIMED=([lenet]=80 [resnet20]=24)
fi
RAW=$WORK/raw
HISTORY=${HISTORY-$RESULTS_DIR/history.jsonl}
for v in ROUNDS TTA_ROUNDS; do
  if ! [[ ${!v} =~ ^[1-9][0-9]*$ ]]; then
    echo "bench.sh: $v must be a positive integer, got '${!v}'" >&2
    exit 2
  fi
done
for tool in "$BIN/ddpv-train" "$BIN/ddpv-convert" "$BIN/model_bench"; do
  [ -x "$tool" ] || { echo "bench.sh: $tool is missing: build first (make build)" >&2; exit 1; }
done
"$PY" -c "import torch, h5py, matplotlib" 2>/dev/null ||
  { echo "bench.sh: $PY lacks torch, h5py or matplotlib: run scripts/install-deps.sh --bench" >&2; exit 1; }
rm -rf "$RAW"
mkdir -p "$RAW" "$RESULTS_DIR"

# One thread per rank on both sides (Note [Peer fairness] in bench/peer/torch_ddp.py).
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# Debian's torch calls whatever libblas.so.3 the alternatives system points at; the reference
# netlib BLAS would make PyTorch's linear layers ~15x slower than they are with OpenBLAS
# (installed by install-deps.sh --bench), so the peer loads OpenBLAS whatever the default is.
OPENBLAS_DIR=/usr/lib/x86_64-linux-gnu/openblas-pthread
if [ ! -e "$OPENBLAS_DIR/libblas.so.3" ]; then
  echo "bench.sh: WARNING: no OpenBLAS ($OPENBLAS_DIR): PyTorch runs on the default BLAS and its" \
    "figures may be far from its best (scripts/install-deps.sh --bench installs it)" >&2
fi
peer() {
  LD_LIBRARY_PATH=$OPENBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$PY" bench/peer/torch_ddp.py "$@"
}
mpirun_args=(--oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none)
[ "$(id -u)" = 0 ] && mpirun_args+=(--allow-run-as-root)
logged() {  # name, then a command whose output goes to $RAW/name.log (shown when it fails)
  local name=$1 rc=0
  shift
  "$@" >"$RAW/$name.log" 2>&1 || rc=$?
  if [ $rc != 0 ]; then
    echo "bench.sh: $name failed (exit $rc): $*" >&2
    tail -n 20 "$RAW/$name.log" >&2
    exit 1
  fi
}
run_ours() {  # ranks, then ddpv-train's arguments
  local np=$1
  shift
  ${MPIRUN:-mpirun} -np "$np" "${mpirun_args[@]}" -x OMP_NUM_THREADS "$BIN/ddpv-train" \
    --threads 1 --no-progress "$@"
}
started=$(date +%s)
t0=$(date -u '+%Y-%m-%d %H:%M UTC')
load0=$(cut -d' ' -f1-3 /proc/loadavg)
if awk '{exit !($1 > 1.0)}' /proc/loadavg; then
  echo "bench.sh: WARNING: load average $load0 before the start: other work shares the cores," \
    "so the figures will be noisy and low (latest.md records the load)" >&2
fi

ours_synthetic() {  # model ranks round
  local m=$1 np=$2 r=$3 w=${WARMUP[$1]} t=${TIMED[$1]}
  # Every `warm-up` steps a step record with that stretch's images/s; the report drops the
  # first record (the warm-up) and takes the images/s of the others together.
  logged "ours-$m-w$np-r$r" run_ours "$np" --synthetic --model "$m" --batch-size $BATCH \
    --lr $SYN_LR --lr-schedule constant --max-steps $((w + t)) --log-every "$w" \
    --metrics "$RAW/ours-$m-w$np-r$r.jsonl"
}
# The machine's own ceiling for two processes: two independent 1-rank runs at once, no
# communication at all (the scaling row's reference, measured in the same run). They run 3x
# the timed steps, and the report takes the middle half of each one's records, which both
# cover whatever the few tenths of a second between their starts.
ours_pair() {  # model round
  local m=$1 r=$2 w=${WARMUP[$1]} t=${TIMED[$1]} k pids=() rc=0
  for k in a b; do
    logged "ours-$m-pair-r$r-$k" run_ours 1 --synthetic --model "$m" --batch-size $BATCH \
      --lr $SYN_LR --lr-schedule constant --max-steps $((w + 3 * t)) --log-every "$w" \
      --metrics "$RAW/ours-$m-pair-r$r-$k.jsonl" &
    pids+=($!)
  done
  for k in "${pids[@]}"; do wait "$k" || rc=1; done  # both end (finite runs) before any exit
  [ $rc = 0 ] || exit 1
}
# Note [The step-synchronous ceiling] (bench/model_bench.cpp): our training step on every rank,
# a barrier after each, no gradient exchanged, and in between the same steps on each rank
# alone; the same warm-up and timed steps as the trainer.
# With arith, Note [The arithmetic ceiling]: the same with arithmetic in registers as long as
# our step instead of it, which leaves only what the machine costs a synchronous step.
probe_sync() {  # model round [arith]
  local m=$1 r=$2 name=probe-$1-w2-r$2 extra=()
  [ "${3:-}" = arith ] && { name=probe-arith-$m-w2-r$r; extra=(--sync-arith); }
  logged "$name" ${MPIRUN:-mpirun} -np 2 "${mpirun_args[@]}" -x OMP_NUM_THREADS \
    "$BIN/model_bench" --model "$m" --batch $BATCH --threads 1 --sgd 1 \
    --sync-warmup "${WARMUP[$m]}" --sync-steps "${TIMED[$m]}" "${extra[@]}"
}
torch_synthetic() {  # model ranks round
  local m=$1 np=$2 r=$3 formats=nchw,channels_last
  [ $((r % 2)) = 0 ] && formats=channels_last,nchw  # neither format always goes first
  logged "torch-$m-w$np-r$r" peer --model "$m" --world-size "$np" \
    --threads 1 --batch-size $BATCH --lr $SYN_LR --warmup "${WARMUP[$m]}" --steps "${TIMED[$m]}" \
    --formats "$formats" --json "$RAW/torch-$m-w$np-r$r.json"
}

for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r/$ROUNDS: sgemm peak, then lenet and resnet20 at 1 and 2 ranks ($(date -u +%H:%M:%S))"
  logged "sgemm-t1-r$r" "$BIN/model_bench" --sgemm-only --threads 1
  OMP_NUM_THREADS=2 logged "sgemm-t2-r$r" "$BIN/model_bench" --sgemm-only --threads 2
  for m in lenet resnet20; do
    for np in 1 2; do
      if [ $((r % 2)) = 1 ]; then  # alternate who goes first, so drift hits both alike
        ours_synthetic $m $np "$r"
        torch_synthetic $m $np "$r"
      else
        torch_synthetic $m $np "$r"
        ours_synthetic $m $np "$r"
      fi
      echo "   $m x$np done"
    done
    ours_pair $m "$r"
    echo "   $m: two independent 1-rank runs done"
    probe_sync $m "$r"
    echo "   $m: our step on 2 ranks synchronised without communication, and alone, done"
    probe_sync $m "$r" arith
    echo "   $m: arithmetic as long as our step, the same way, done"
  done
done

# ---- precision: fp32 and bf16 side by side ---------------------------------------------
# Ours in fp32 and bf16, PyTorch 1.13 (Debian's) and the current release (PyPI, a virtual
# environment made here) in fp32 and with CPU autocast to bf16, each in its faster memory
# format (resnet50: channels_last), the current one also through torch.compile at 1 rank;
# lenet and resnet20 at 1 and 2 ranks, resnet50 at 224x224 with batch 16 on 1 rank. Every run
# also logs which convolution implementations oneDNN chose (their names carry the ISA).
# A run that is refused or fails is recorded as such, not fatal. Where the CPU has no native
# bf16 (AMX or AVX512-BF16) and no AVX-512 to emulate it on, oneDNN has no bf16 convolution
# and PyTorch falls back to loops about 20x slower than its fp32: no bf16 run is made there,
# and bench/peer/precision.py says so instead of a ratio.
prec_ok() {  # name, then a command: its output to $RAW/name.log, its exit status to name.rc
  local name=$1 rc=0
  shift
  "$@" >"$RAW/$name.log" 2>&1 || rc=$?
  echo "$rc" >"$RAW/$name.rc"
  [ "$rc" = 0 ] || echo "   $name: exit $rc (recorded): $(grep -v '^\s*$' "$RAW/$name.log" | tail -1 | cut -c1-150)"
}
if [ "${SKIP_PRECISION:-0}" != 1 ]; then
  flags=$(grep -m1 '^flags' /proc/cpuinfo)
  bf16_runs=1
  case " $flags " in
    *" amx_bf16 "* | *" avx512_bf16 "* | *" avx512f "*) ;;
    *) bf16_runs=0 ;;
  esac
  TORCH_CURRENT=${TORCH_CURRENT-torch}
  VENV=$BUILD_DIR/bench-run/torch-venv
  CURPY=""
  if [ -n "$TORCH_CURRENT" ]; then
    echo "== precision: current PyTorch ($TORCH_CURRENT) into $VENV ($(date -u +%H:%M:%S))"
    if { [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"; } &&
      timeout 1200 "$VENV/bin/pip" install -q --upgrade "$TORCH_CURRENT" numpy >"$RAW/prec-venv.log" 2>&1 &&
      "$VENV/bin/python" -c "import torch" >>"$RAW/prec-venv.log" 2>&1; then
      CURPY=$VENV/bin/python
    else
      echo "   could not install $TORCH_CURRENT from PyPI (see $RAW/prec-venv.log): not measured"
    fi
  fi
  prec_peer() {  # python label model ranks precision formats batch warmup timed [--compile]
    local py=$1 label=$2 m=$3 np=$4 p=$5 f=$6 b=$7 w=$8 t=$9 c=${10:-} name
    name=prec-$label-$m-w$np-$p${c:+-compile}
    LD_LIBRARY_PATH=$OPENBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} prec_ok "$name" \
      timeout 900 "$py" bench/peer/torch_ddp.py --model "$m" --world-size "$np" --threads 1 \
      --batch-size "$b" --lr $SYN_LR --warmup "$w" --steps "$t" --formats "$f" \
      --precision "$p" --isa --json "$RAW/$name.json" $c
  }
  prec_ours() {  # model ranks precision batch warmup timed
    local m=$1 np=$2 p=$3 b=$4 w=$5 t=$6 name=prec-ours-$1-w$2-$3
    prec_ok "$name" run_ours "$np" --synthetic --model "$m" --batch-size "$b" --precision "$p" \
      --lr $SYN_LR --lr-schedule constant --max-steps $((w + t)) --log-every "$w" \
      --metrics "$RAW/$name.jsonl"
    # Which convolutions oneDNN ran for us: two more steps with its verbose log on.
    [ "$(cat "$RAW/$name.rc")" = 0 ] && DNNL_VERBOSE=1 run_ours 1 --synthetic --model "$m" \
      --batch-size "$b" --precision "$p" --max-steps 2 --log-every 1 >"$RAW/$name.verbose" 2>&1
    return 0
  }
  R50_W=$([ "$QUICK" = 1 ] && echo 1 || echo 2) R50_T=$([ "$QUICK" = 1 ] && echo 1 || echo 4)
  for m in lenet resnet20 resnet50; do
    for np in 1 2; do
      [ $m = resnet50 ] && [ $np = 2 ] && continue
      b=$BATCH w=${WARMUP[$m]:-$R50_W} t=${TIMED[$m]:-$R50_T} fmts=nchw,channels_last
      [ $m = resnet50 ] && { b=16; fmts=channels_last; }
      echo "== precision: $m x$np, batch $b ($(date -u +%H:%M:%S))"
      for p in fp32 bf16; do
        if [ $p = bf16 ] && [ $bf16_runs = 0 ]; then continue; fi
        prec_ours $m $np $p $b "$w" "$t"
        prec_peer "$PY" torch113 $m $np $p $fmts $b "$w" "$t"
        [ -n "$CURPY" ] && prec_peer "$CURPY" torchcur $m $np $p $fmts $b "$w" "$t"
        if [ -n "$CURPY" ] && [ "${COMPILE:-1}" = 1 ] && [ $np = 1 ] && [ $m != resnet50 ]; then
          prec_peer "$CURPY" torchcur $m $np $p channels_last $b "$w" "$t" --compile
        fi
      done
    done
  done
  echo "$bf16_runs" >"$RAW/prec-bf16-runs"
fi

if [ "$SKIP_TTA" != 1 ]; then
  store=$BUILD_DIR/bench-run/fashion-mnist.h5  # converted once, kept between runs
  if ! "$BIN/ddpv-convert" inspect "$store" >/dev/null 2>&1; then
    echo "== converting Fashion-MNIST ($FMNIST) into $store"
    mkdir -p "$(dirname "$store")"
    "$BIN/ddpv-convert" idx --preset fashion-mnist \
      --train-images "$FMNIST/train-images-idx3-ubyte.gz" --train-labels "$FMNIST/train-labels-idx1-ubyte.gz" \
      --test-images "$FMNIST/t10k-images-idx3-ubyte.gz" --test-labels "$FMNIST/t10k-labels-idx1-ubyte.gz" \
      --out "$store" >/dev/null
  fi
  if [ "$QUICK" = 1 ]; then  # the first 6000 / 1000 images, every attribute kept
    "$PY" - "$store" "$WORK/fashion-mnist-small.h5" <<'EOF'
import sys, h5py
with h5py.File(sys.argv[1], "r") as src, h5py.File(sys.argv[2], "w") as dst:
    for k, v in src.attrs.items():
        dst.attrs[k] = v
    for split, n in (("train", 6000), ("test", 1000)):
        dst.create_dataset(f"{split}/images", data=src[split]["images"][:n])
        dst.create_dataset(f"{split}/labels", data=src[split]["labels"][:n])
EOF
    store=$WORK/fashion-mnist-small.h5
  fi
  # PyTorch trains in the memory format that won its lenet 2-rank race above.
  fmt=$("$PY" - "$RAW" <<'EOF'
import collections, glob, json, sys
wins = collections.Counter(json.load(open(f))["best_format"]
                           for f in glob.glob(f"{sys.argv[1]}/torch-lenet-w2-r*.json"))
print(wins.most_common(1)[0][0])
EOF
)
  ours_tta() {  # round [--balance]
    local name=ours-fmnist-r$1
    [ "${2:-}" = --balance ] && name=ours-balanced-fmnist-r$1
    echo "== time to 91% on Fashion-MNIST, lenet, 2 ranks, $TTA_EPOCHS epochs at most, round" \
      "$1/$TTA_ROUNDS: ours${2:+ with $2} ($(date -u +%H:%M:%S))"
    logged "$name" run_ours 2 --data "$store" --model lenet --epochs "$TTA_EPOCHS" \
      --batch-size $BATCH --lr $TTA_LR --momentum 0.9 --weight-decay 5e-4 --lr-schedule cosine \
      --no-augment --log-every 100000 --metrics "$RAW/$name.jsonl" ${2:+"$2"}
    sed -n 's/^epoch/   epoch/p' "$RAW/$name.log"
  }
  torch_tta() {  # round
    echo "== the same for PyTorch ($fmt, stops at 91%), round $1/$TTA_ROUNDS" \
      "($(date -u +%H:%M:%S))"
    logged "torch-fmnist-r$1" peer --fashion-mnist "$store" --world-size 2 \
      --threads 1 --batch-size $BATCH --lr $TTA_LR --momentum 0.9 --weight-decay 5e-4 \
      --epochs "$TTA_EPOCHS" --target 0.91 --formats "$fmt" --json "$RAW/torch-fmnist-r$1.json"
    sed -n 's/^torch_ddp: /   /p' "$RAW/torch-fmnist-r$1.log"
  }
  # A load that comes or goes during the runs (this machine's usual noise) hits both sides
  # alike in the order ours, PyTorch, PyTorch, ours, ...
  # Our --balance runs (Note [Balanced batches]: the global batch split by the ranks' speed)
  # sit next to our default ones, the target judged on the default.
  for r in $(seq 1 "$TTA_ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then
      ours_tta "$r"
      ours_tta "$r" --balance
      torch_tta "$r"
    else
      torch_tta "$r"
      ours_tta "$r" --balance
      ours_tta "$r"
    fi
  done
fi

# What the report prints about the machine and the run.
"$PY" - "$RAW/meta.json" <<EOF
import json, platform, subprocess, sys, torch
def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""
meta = {
    "date": "$t0", "quick": "$QUICK" == "1", "rounds": $ROUNDS, "tta_epochs": $TTA_EPOCHS,
    "tta_rounds": $TTA_ROUNDS,
    "skip_tta": "$SKIP_TTA" == "1", "batch": $BATCH, "tta_lr": $TTA_LR, "syn_lr": $SYN_LR,
    "warmup": {"lenet": ${WARMUP[lenet]}, "resnet20": ${WARMUP[resnet20]}},
    "timed": {"lenet": ${TIMED[lenet]}, "resnet20": ${TIMED[resnet20]}},
    "cpu": sh("lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1"),
    "cores": sh("getconf _NPROCESSORS_ONLN"), "kernel": platform.release(),
    "simd": ("avx512" if sh("grep -m1 -ow avx512f /proc/cpuinfo") else
             "avx2" if sh("grep -m1 -ow avx2 /proc/cpuinfo") else ""),
    "commit": sh("git rev-parse --short=12 HEAD 2>/dev/null"),
    "dirty": bool(sh("git status --porcelain --untracked-files=no 2>/dev/null")),
    "ddpv": sh("$BIN/ddpv-train --version"), "torch": torch.__version__,
    "onednn": sh("dpkg-query -W -f='\${Version}' libdnnl-dev"),
    "mpi": sh("${MPIRUN:-mpirun} --version | head -1"), "cxx": sh("c++ --version | head -1"),
    "python": platform.python_version(),
    "load_start": "$load0", "load_end": sh("cut -d' ' -f1-3 /proc/loadavg"),
    "wall_s": $(date +%s) - $started,
}
json.dump(meta, open(sys.argv[1], "w"), indent=1)
EOF
"$PY" bench/peer/report.py "$RAW" --md "$RESULTS_DIR/latest.md" --png "$RESULTS_DIR/latest.png" \
  $([ "${UPDATE_DOCS:-0}" = 1 ] && echo --docs docs/performance.md) \
  ${HISTORY:+--history "$HISTORY"}
