#!/usr/bin/env bash
# The GPU device check, for a machine with one NVIDIA GPU (an H100 or H200), CUDA, cuDNN and
# NCCL, PyTorch, and no package registry. Such a machine is lent to some tasks by chance, for
# about 15 minutes of device time in all, starts included, so this script is built to use one
# run well and never to hang it. Within its budget (BUDGET_S, 330 s) it
#   1. finds the binaries: carried prebuilt ones (.devlibs/, made here by
#      scripts/pack-device-libs.sh), or a CUDA build there (CUDA_ARCHS=90) when that machine
#      has our build dependencies (DDPV_DEVICE_BUILD=1 forces the build; DDPV_DEVICE_BIN=DIR
#      uses the binaries in DIR);
#   2. installs the carried shared libraries the device lacks (never replacing a file);
#   3. runs the GPU tests (scripts/gpu-tests.sh: the tests with CUDA cases), failed cases again
#      under CUDA_LAUNCH_BLOCKING=1 and compute-sanitizer, and a few training steps of each
#      model in both precisions;
#   4. measures resnet50 224x224 --synthetic training throughput at batch 256, fp32 and bf16,
#      with ddpv-train, and PyTorch's for the same model (channels_last, AMP bf16), and prints
#      both and the ratio;
#   5. profiles both: ddpv-train --profile-layers (with the cuDNN algorithm choices from the
#      debug log) and PyTorch's profiler (PROFILE=0 skips it).
#
# Note [One device run]: every program runs under `timeout -k` (ddpv-train turns SIGTERM into
# "stop after this step", so a hang in its setup outlives a plain timeout; the KILL comes
# KILL_S later), and each step's timeout is capped by what is left of BUDGET_S, so the whole
# script ends within BUDGET_S + KILL_S + a few seconds whatever hangs. Logs go to LOGS
# (outside $OUT), and an EXIT trap, which runs however the script ends, leaves exactly three
# files in $OUT (the device tool brings back at most 8): summary.txt (the report, small),
# performance-entry.md (the dated entry for docs/performance.md) and device-check-logs.tar.gz
# (every log; cut to each file's last 512 KiB if the archive would pass 15 MiB).
#
#   device tool: run(command="scripts/device-check.sh", carry=[".devlibs"], timeout_s=420)
#   knobs (environment): BUDGET_S=330 KILL_S=10 STEPS=30 WARMUP=10 BATCH=256
#                        DDPV_DEVICE_BUILD=auto|1 DDPV_DEVICE_BIN=DIR SKIP_TESTS=1
#                        TESTS="cuda_parity_test ..." (a subset) MODELS="lenet resnet20 resnet18"
#                        PROFILE=1 PROFILE_STEPS=6 RATES=1 (0: skip part 4)
#                        OUT=DIR (default ./device-check-out) LOGS=DIR (default a fresh
#                        /tmp/ddpv-device-check.XXXX)
# Exit status 0: every test passed and all four rates were measured (with RATES=0: every test
# passed); 1 otherwise; 2: no setup.
set -uo pipefail

START=$(date +%s)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT_DIR=${OUT:-$ROOT/device-check-out}
mkdir -p "$OUT_DIR"
LOGS=${LOGS:-$(mktemp -d /tmp/ddpv-device-check.XXXX)}
mkdir -p "$LOGS"
REPORT=$LOGS/device-check.txt
ENTRY=$LOGS/performance-entry.md
: >"$REPORT"
STEPS=${STEPS:-30}    # timed steps per run
WARMUP=${WARMUP:-10}  # steps before timing: cuDNN algorithm search, allocator growth
BATCH=${BATCH:-256}
BUDGET_S=${BUDGET_S:-330}  # every step ends by then; then the summary and the pack
KILL_S=${KILL_S:-10}       # from a step's SIGTERM to its SIGKILL
ORIG_LD=${LD_LIBRARY_PATH:-}
PY=${PYTHON:-python3}

elapsed() { echo $(($(date +%s) - START)); }
say() { echo "[device-check +$(elapsed)s] $*" | tee -a "$REPORT"; }
die() { say "FAILED: $*"; exit 2; }
left() { echo $((BUDGET_S - $(elapsed))); }
time_left() { (($(left) >= 5)); }
capped() { # a step's timeout in seconds: N, or what is left of the budget when that is less
  local n=$1 l
  l=$(left)
  ((l < n)) && n=$l
  ((n < 1)) && n=1
  echo "$n"
}
# run_capped N CMD...: CMD under timeout -k, for at most N seconds and never past the budget.
# Its exit status is CMD's, or 124 (ended by SIGTERM) or 137 (killed).
run_capped() {
  local n
  n=$(capped "$1")
  shift
  timeout -k "$KILL_S" "$n" "$@"
}
status_word() { # an exit status as the report says it
  case $1 in
    0) echo "ok" ;;
    124) echo "timed out (rc 124)" ;;
    137) echo "timed out, killed (rc 137)" ;;
    *) echo "rc $1" ;;
  esac
}

pack_out() { # the EXIT trap: summary, entry and one archive of the logs in $OUT
  local rc=$? limit=$((15 * 1024 * 1024)) archive=$OUT_DIR/device-check-logs.tar.gz cut
  trap - EXIT
  say "exit status $rc; packing the logs into $archive"
  tail -c 262144 "$REPORT" >"$OUT_DIR/summary.txt"
  [[ -f $ENTRY ]] && cp "$ENTRY" "$OUT_DIR/performance-entry.md"
  tar -C "$LOGS" -czf "$archive" . 2>/dev/null
  if (($(stat -c %s "$archive" 2>/dev/null || echo 0) > limit)); then
    cut=$(mktemp -d /tmp/ddpv-device-check-cut.XXXX)
    (cd "$LOGS" && find . -type f -print0 | while IFS= read -r -d '' f; do
      mkdir -p "$cut/$(dirname "$f")" && tail -c 524288 "$f" >"$cut/$f"
    done)
    tar -C "$cut" -czf "$archive" . 2>/dev/null
    rm -rf "$cut"
    echo "(logs cut to their last 512 KiB each: the archive was over 15 MiB)" >>"$OUT_DIR/summary.txt"
  fi
  exit "$rc"
}
trap pack_out EXIT

say "host $(hostname), $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
GPU=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
[[ -n $GPU ]] || die "nvidia-smi sees no GPU"
say "GPU: $GPU"
say "nvcc: $(nvcc --version 2>/dev/null | tail -1 || echo 'not on PATH')"
say "torch: $(LD_LIBRARY_PATH=$ORIG_LD $PY -c 'import torch; print(torch.__version__, torch.version.cuda, "cudnn", torch.backends.cudnn.version())' 2>&1 | tail -1)"

# ---- CUDA libraries: the toolkit's, the system's, or the ones PyTorch's wheels bring ----------
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
WHEEL_DIR=$(LD_LIBRARY_PATH=$ORIG_LD $PY -c 'import nvidia, os; print(list(nvidia.__path__)[0])' 2>/dev/null || true)
lib_dir() {  # folder holding the soname $1, or nothing
  local d
  for d in "$CUDA_HOME/lib64" "$CUDA_HOME/lib" "$CUDA_HOME/targets/x86_64-linux/lib"; do
    [[ -e $d/$1 ]] && { echo "$d"; return; }
  done
  ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n { print $NF; exit }' | xargs -r dirname
  [[ -n $WHEEL_DIR ]] && find "$WHEEL_DIR" -maxdepth 4 -name "$1" -printf '%h\n' 2>/dev/null | head -1
}
DDPV_LD=""
for so in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2; do
  d=$(lib_dir "$so" | head -1)
  if [[ -z $d ]]; then say "warning: $so not found (toolkit, ldconfig, or PyTorch's nvidia wheels)"; continue; fi
  [[ :$DDPV_LD: == *:$d:* ]] || DDPV_LD=${DDPV_LD:+$DDPV_LD:}$d
done
# cuDNN 9 loads its engine libraries (libcudnn_cnn, _ops, ...) from its own folder at run time.
export LD_LIBRARY_PATH=$DDPV_LD${ORIG_LD:+:$ORIG_LD}
say "CUDA libraries from: ${DDPV_LD:-system default}"

# ---- 1. binaries ---------------------------------------------------------------------------
build_here() {
  local missing=()
  command -v cmake >/dev/null || missing+=(cmake)
  command -v nvcc >/dev/null || [[ -x $CUDA_HOME/bin/nvcc ]] || missing+=(nvcc)
  command -v mpicc >/dev/null || missing+=("Open MPI (mpicc, libopenmpi-dev)")
  command -v h5cc >/dev/null || [[ -e /usr/include/hdf5/serial/hdf5.h || -e /usr/include/hdf5.h ]] ||
    missing+=("HDF5 (libhdf5-dev)")
  [[ -e /usr/include/boost/program_options.hpp ]] || missing+=("Boost.Program_options")
  [[ -e /usr/include/oneapi/dnnl/dnnl.hpp || -e /usr/include/dnnl.hpp ]] || missing+=("oneDNN (libdnnl-dev)")
  [[ -e /usr/include/gtest/gtest.h ]] || missing+=("GoogleTest (libgtest-dev)")
  if ((${#missing[@]})); then
    say "cannot build here, missing: ${missing[*]}"
    die "no binaries: run scripts/pack-device-libs.sh on the build machine and carry .devlibs"
  fi
  local gen=() tests
  command -v ninja >/dev/null && gen=(-G Ninja)
  say "building with CUDA (CUDA_ARCHS=90) in build-device"
  run_capped 120 cmake -S "$ROOT" -B "$ROOT/build-device" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DDDPV_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCUDAToolkit_ROOT="$CUDA_HOME" \
    -DDDPV_BUILD_BENCH=OFF >"$LOGS/build.log" 2>&1 || die "configure failed: see build.log"
  tests=$("$ROOT/scripts/gpu-tests.sh")
  # shellcheck disable=SC2086
  run_capped "$BUDGET_S" cmake --build "$ROOT/build-device" -j "$(nproc)" --target ddpv-train $tests \
    >>"$LOGS/build.log" 2>&1 || { tail -30 "$LOGS/build.log"; die "build failed: see build.log"; }
  BIN=$ROOT/build-device/bin
}
if [[ -n ${DDPV_DEVICE_BIN:-} ]]; then
  [[ -x $DDPV_DEVICE_BIN/ddpv-train ]] || die "DDPV_DEVICE_BIN=$DDPV_DEVICE_BIN holds no ddpv-train"
  BIN=$(cd "$DDPV_DEVICE_BIN" && pwd)
  say "using the binaries in $BIN"
elif [[ ${DDPV_DEVICE_BUILD:-auto} != 1 && -x $ROOT/.devlibs/bin/ddpv-train ]]; then
  BIN=$ROOT/.devlibs/bin
  say "using the carried binaries: $(tr '\n' ';' <"$ROOT/.devlibs/MANIFEST" 2>/dev/null)"
else
  build_here
fi
say "binaries: $(ls "$BIN" | tr '\n' ' ')"

# ---- 2. shared libraries the device lacks --------------------------------------------------
missing_libs() {
  local b
  for b in "$BIN"/ddpv-train "$BIN"/*_test; do
    [[ -x $b ]] && ldd "$b" 2>/dev/null | awk '/not found/ { print $1 }'
  done | sort -u | tr '\n' ' '
}
MISSING=$(missing_libs)
if [[ -n $MISSING ]]; then
  say "libraries missing here: $MISSING"
  TARBALL=$ROOT/.devlibs/devroot.tar.xz
  [[ -f $TARBALL ]] || die "carry .devlibs (scripts/pack-device-libs.sh) or install these libraries"
  [[ $(id -u) == 0 ]] || die "installing the carried libraries needs root"
  STAGE=$(mktemp -d /tmp/ddpv-devroot.XXXX)
  tar -C "$STAGE" -xJf "$TARBALL" || die "cannot unpack $TARBALL"
  # Only files the device does not have: its own libraries, newer or not, stay untouched.
  added=0
  while IFS= read -r -d '' f; do
    rel=${f#"$STAGE"}
    if [[ ! -e $rel && ! -L $rel ]]; then
      mkdir -p "$(dirname "$rel")" && cp -a "$f" "$rel" && added=$((added + 1))
    fi
  done < <(find "$STAGE" \( -type f -o -type l \) -print0)
  ldconfig 2>/dev/null || true
  say "installed $added carried files"
  MISSING=$(missing_libs)
  [[ -z $MISSING ]] || die "still missing after installing the carried libraries: $MISSING"
fi

# One process, one GPU: an MPI singleton without mpirun, as root, with no helper daemon.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_ess_singleton_isolated=1 OMPI_MCA_mca_base_component_show_load_errors=0
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
export DDPV_SOURCE_DIR=$ROOT DDPV_BIN_DIR=$BIN OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

# ---- 3. GPU tests --------------------------------------------------------------------------
# A test that fails runs its failed cases again, one at a time: with CUDA_LAUNCH_BLOCKING=1
# (an asynchronous kernel fault then surfaces at the call that launched it, with our file and
# line) and under compute-sanitizer's memcheck where the toolkit has it (it names the kernel
# and the bad address), into tests/NAME.rerun.log; the first lines of each go to the report.
SANITIZER=$(command -v compute-sanitizer || ls "$CUDA_HOME"/bin/compute-sanitizer 2>/dev/null || true)
rerun_failed() {  # binary name
  local t=$1 name=$2 case log sanitize=1
  for case in $(sed -n 's/^\[  FAILED  \] \([^ ,]*\).*/\1/p' "$LOGS/tests/$name.log" | sort -u); do
    [[ $case == *.* ]] || continue
    time_left || return
    log=$LOGS/tests/$name.${case//\//_}.rerun.log
    {
      echo "== $case, CUDA_LAUNCH_BLOCKING=1"
      CUDA_LAUNCH_BLOCKING=1 run_capped 60 "$t" --gtest_color=no --gtest_filter="$case" 2>&1 | tail -25
      if [[ -n $SANITIZER ]] && ((sanitize)); then  # the first case only: it is slow
        sanitize=0
        echo "== $case, compute-sanitizer --tool memcheck"
        run_capped 90 "$SANITIZER" --tool memcheck --print-limit 4 "$t" --gtest_color=no \
          --gtest_filter="$case" 2>&1 | grep -v '^\[ \|^Running main\|^$' | head -60
      fi
    } >"$log" 2>&1
    say "rerun of $case (tests/$(basename "$log")):"
    grep -E '^==|rror|Invalid|thrown|Address|\.cpp:' "$log" | grep -v 'Host Frame' | head -16 |
      tee -a "$REPORT"
  done
}

TEST_SUMMARY=""
TESTS_OK=1
if [[ ${SKIP_TESTS:-0} != 1 ]]; then
  mkdir -p "$LOGS/tests"
  for name in $("$ROOT/scripts/gpu-tests.sh"); do
    t=$BIN/$name
    [[ -z ${TESTS:-} || " $TESTS " == *" $name "* ]] || continue
    [[ -x $t ]] || { say "test $name: not among the binaries"; TESTS_OK=0; continue; }
    time_left || { say "time budget reached: skipping the remaining tests"; TESTS_OK=0; break; }
    run_capped 90 "$t" --gtest_color=no >"$LOGS/tests/$name.log" 2>&1
    rc=$?
    passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$LOGS/tests/$name.log" | tail -1)
    skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$LOGS/tests/$name.log" | tail -1)
    failed=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$LOGS/tests/$name.log" | tail -1)
    line="$name: $(status_word $rc), passed ${passed:-0}, skipped ${skipped:-0}, failed ${failed:-0}"
    ((rc == 0)) || TESTS_OK=0
    say "test $line"
    TEST_SUMMARY+="$line"$'\n'
    if ((rc != 0)); then
      grep -E '^\[  FAILED  \]|Failure|error|what\(\)' "$LOGS/tests/$name.log" | head -12 | tee -a "$REPORT"
      rerun_failed "$t" "$name"
    fi
  done
fi

# ---- 3b. every model trains: a few steps of each, both precisions, small batches ------------
# The op tests cover each op's shapes; this covers the models' own (lenet's single input
# channel, resnet20's 32x32 stages) and the trainer around them.
if [[ ${SKIP_TESTS:-0} != 1 ]]; then
  for model in ${MODELS:-lenet resnet20 resnet18}; do
    for prec in fp32 bf16; do
      time_left || break 2
      log=$LOGS/tests/train-$model-$prec.log
      run_capped 90 "$BIN/ddpv-train" --model "$model" --synthetic --device cuda --batch-size 16 \
        --synthetic-size 64 --max-steps 4 --precision "$prec" >"$log" 2>&1
      rc=$?
      ((rc == 0)) || TESTS_OK=0
      line="train $model $prec: $(status_word $rc)"
      say "$line: $(grep -E '^done|rror' "$log" | tail -1)"
      TEST_SUMMARY+="$line"$'\n'
    done
  done
fi

# ---- 4. throughput: ddpv-train --------------------------------------------------------------
# Each metrics step record covers --log-every steps; the first WARMUP steps are left out and the
# rest combined as total images / total time (a harmonic mean of the records' rates).
LOG_EVERY=5
ddpv_rate() {  # precision -> images/s, or "failed"
  local prec=$1 metrics=$LOGS/ddpv-resnet50-$1.jsonl total=$((STEPS + WARMUP))
  rm -f "$metrics"
  run_capped 150 "$BIN/ddpv-train" --model resnet50 --synthetic --device cuda \
    --batch-size "$BATCH" --synthetic-size $((BATCH * total)) --max-steps "$total" \
    --precision "$prec" --log-every "$LOG_EVERY" --metrics "$metrics" \
    >"$LOGS/ddpv-resnet50-$prec.log" 2>&1
  local rc=$?
  if ((rc != 0)); then
    say "  ddpv-train resnet50 $prec: $(status_word $rc)" >&2
    tail -5 "$LOGS/ddpv-resnet50-$prec.log" | sed 's/^/    /' | tee -a "$REPORT" >&2
    echo failed
    return
  fi
  LD_LIBRARY_PATH=$ORIG_LD $PY - "$metrics" "$WARMUP" "$LOG_EVERY" <<'EOF'
import json, sys
path, warmup, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
recs = [json.loads(l) for l in open(path) if l.strip()]
steps = [r for r in recs if r.get("event") == "step" and r.get("step", 0) > warmup]
if not steps:
    print("failed")
else:
    print("%.1f" % (len(steps) / sum(1.0 / r["images_per_s"] for r in steps)))
EOF
}

# ---- 4b. throughput: PyTorch, the same model (scripts/ddpv_torch.py's twin of our resnet50) --
# With PROFILE=1 it then runs PyTorch's profiler over PROFILE_STEPS more steps of each model,
# into profile-torch.txt (part 5).
torch_rates() {  # prints "fp32 RATE" and "bf16 RATE" lines
  LD_LIBRARY_PATH=$ORIG_LD PYTHONUNBUFFERED=1 run_capped 240 $PY - "$ROOT" "$BATCH" "$WARMUP" "$STEPS" \
    "$TORCH_PROFILE_STEPS" "$LOGS/profile-torch.txt" <<'EOF'
import os, sys, time
import torch
import torch.nn as nn
import torch.nn.functional as F

root, batch, warmup, steps, profile_steps = sys.argv[1], *map(int, sys.argv[2:6])
profile_file = sys.argv[6]
sys.path.insert(0, os.path.join(root, "scripts"))

def resnet50_inline():
    # torchvision's resnet50 (v1.5: stride in the 3x3), for when ddpv_torch.py is absent.
    class Bottleneck(nn.Module):
        def __init__(self, cin, planes, stride):
            super().__init__()
            cout = planes * 4
            self.c1, self.b1 = nn.Conv2d(cin, planes, 1, bias=False), nn.BatchNorm2d(planes)
            self.c2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
            self.b2 = nn.BatchNorm2d(planes)
            self.c3, self.b3 = nn.Conv2d(planes, cout, 1, bias=False), nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))
        def forward(self, x):
            y = F.relu(self.b1(self.c1(x)))
            y = F.relu(self.b2(self.c2(y)))
            y = self.b3(self.c3(y))
            return F.relu(y + (x if self.down is None else self.down(x)))
    layers, cin = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                   nn.MaxPool2d(3, 2, 1)], 64
    for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, planes, stride if i == 0 else 1))
            cin = planes * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
    return nn.Sequential(*layers)

def make():
    try:
        from ddpv_torch import make_model
        return make_model("resnet50", (224, 224, 3), 1000), "ddpv_torch twin"
    except Exception as e:  # noqa: BLE001 - any import problem: use the inline definition
        return resnet50_inline(), "inline (ddpv_torch: %s)" % e

torch.backends.cudnn.benchmark = True
# fp32 means fp32, as in ddpv (no TF32), so that the fp32 ratio compares like with like.
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
for prec in ("fp32", "bf16"):
    model, src = make()
    model = model.cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device="cuda")
    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=prec == "bf16"):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    if steps > 0:
        print(prec, "%.1f" % (steps * batch / (time.perf_counter() - t0)), src, flush=True)
    if profile_steps > 0:
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(profile_steps):
                step()
            torch.cuda.synchronize()
        with open(profile_file, "a") as f:
            f.write("== torch %s, %d steps (%s)\n" % (prec, profile_steps, src))
            f.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=22,
                                              max_name_column_width=70) + "\n")
    del model, opt, x, y
    torch.cuda.empty_cache()
EOF
}

declare -A OURS THEIRS
for prec in fp32 bf16; do
  if [[ ${RATES:-1} != 1 ]]; then
    OURS[$prec]=skipped
  elif time_left; then
    say "ddpv-train resnet50 $prec, batch $BATCH, $WARMUP + $STEPS steps"
    OURS[$prec]=$(ddpv_rate "$prec")
    say "  ddpv $prec: ${OURS[$prec]}$([[ ${OURS[$prec]} == failed ]] || echo ' img/s')"
  else
    OURS[$prec]=skipped
  fi
done
PROFILE_STEPS=${PROFILE_STEPS:-6}
TORCH_PROFILE_STEPS=$([[ ${PROFILE:-1} == 1 ]] && echo "$PROFILE_STEPS" || echo 0)
if [[ ${RATES:-1} == 1 || $TORCH_PROFILE_STEPS != 0 ]] && time_left; then
  [[ ${RATES:-1} == 1 ]] || STEPS=0
  say "PyTorch resnet50 (channels_last; bf16 = AMP autocast), batch $BATCH, $WARMUP + $STEPS steps, then $TORCH_PROFILE_STEPS profiled"
  while read -r prec rate src; do
    [[ $prec == fp32 || $prec == bf16 ]] || continue
    THEIRS[$prec]=$rate
    say "  torch $prec: $rate img/s ($src)"
  done < <(torch_rates 2>"$LOGS/torch.log")
  [[ ${RATES:-1} != 1 || -n ${THEIRS[bf16]:-} ]] || tail -5 "$LOGS/torch.log" | tee -a "$REPORT"
fi

# ---- 5. where the time goes: our layer profile and PyTorch's, resnet50 fp32 and bf16 ----------
# ddpv-train --profile-layers (Note [Layer profile]) with the debug log, which names the cuDNN
# algorithm each convolution chose and what cudnnFind timed it at; PyTorch's profile of its
# twin came from part 4. PROFILE=0 skips this part.
ddpv_profile() {  # precision [batchnorm path] -> $LOGS/profile-ddpv-PREC[-PATH].txt
  local prec=$1 bn=${2:-} total=$((PROFILE_STEPS + 5))
  local file=$LOGS/profile-ddpv-$prec${bn:+-$bn}.txt
  DDPV_LOG_LEVEL=debug run_capped 120 "$BIN/ddpv-train" ${bn:+--cuda-bn "$bn"} --model resnet50 \
    --synthetic --device cuda --batch-size "$BATCH" --synthetic-size $((BATCH * total)) \
    --max-steps "$total" --precision "$prec" --profile-layers --no-progress >"$file" 2>&1 ||
    say "  ddpv profile $prec ${bn:-}: $(status_word $?)"
  sed -n '/^layer profile/,/^  by kind/p' "$file" | head -25 | tee -a "$REPORT"
  sed -n '/^  by kind/,/^done/p' "$file" | tee -a "$REPORT"
}
if [[ ${PROFILE:-1} == 1 ]]; then
  for prec in fp32 bf16; do
    if time_left; then say "profile: ddpv-train resnet50 $prec, 5 + $PROFILE_STEPS steps"; ddpv_profile "$prec"; fi
  done
  # BatchNorm through cuDNN's plain functions, as before the first GPU run (Note [BatchNorm on
  # cuDNN]): the comparison that says whether the Ex functions paid.
  if time_left; then say "profile: the same, fp32, --cuda-bn legacy"; ddpv_profile fp32 legacy; fi
  if [[ -s $LOGS/profile-torch.txt ]]; then  # written in part 4
    grep -A14 '^== torch' "$LOGS/profile-torch.txt" | cut -c1-150 | tee -a "$REPORT"
  fi
fi

# ---- summary -------------------------------------------------------------------------------
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else print "n/a" }'; }
{
  echo
  echo "resnet50 224x224 synthetic, batch $BATCH, one GPU ($GPU)"
  printf '%-6s %14s %14s %8s\n' precision "ddpv img/s" "torch img/s" ratio
  for prec in fp32 bf16; do
    printf '%-6s %14s %14s %8s\n' "$prec" "${OURS[$prec]:-n/a}" "${THEIRS[$prec]:-n/a}" \
      "$(ratio "${OURS[$prec]:-0}" "${THEIRS[$prec]:-0}")"
  done
  echo "target: bf16 ratio >= 1.10 and >= 3000 img/s"
} | tee -a "$REPORT"
{
  echo "### Device check $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo
  echo "GPU: $GPU. Tests:"
  echo
  echo '```'
  printf '%s' "${TEST_SUMMARY:-(not run)}"
  echo '```'
  echo
  echo "| resnet50, batch $BATCH | ddpv img/s | PyTorch img/s | ratio |"
  echo "|---|---|---|---|"
  for prec in fp32 bf16; do
    echo "| $prec | ${OURS[$prec]:-n/a} | ${THEIRS[$prec]:-n/a} | $(ratio "${OURS[$prec]:-0}" "${THEIRS[$prec]:-0}") |"
  done
} >"$ENTRY"
say "done in $(elapsed) s; in $OUT_DIR at exit: summary.txt (this report), performance-entry.md (for docs/performance.md), device-check-logs.tar.gz"
# Exit status: 0 when every test passed and all four rates were measured (none asked for with
# RATES=0, a tests-only rerun).
if [[ ${RATES:-1} == 1 ]]; then
  for v in "${OURS[fp32]:-}" "${OURS[bf16]:-}" "${THEIRS[fp32]:-}" "${THEIRS[bf16]:-}"; do
    [[ $v =~ ^[0-9.]+$ ]] || exit 1
  done
fi
((TESTS_OK)) || exit 1
exit 0
