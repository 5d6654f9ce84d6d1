#!/usr/bin/env bash
# scripts/device-check.sh is run on a lent GPU once or twice per task, in a budget of minutes:
# it must end on time whatever hangs, and bring its logs back in the few files the device tool
# returns (Note [One device run] in the script). Here it runs against fake binaries (a GPU
# test that fails, one whose output is larger than an archive may be, a ddpv-train that
# ignores SIGTERM) and a fake nvidia-smi, with a budget of seconds, and the test checks that
#   - the hung ddpv-train was killed when the budget ran out, and the script ended within
#     BUDGET_S + KILL_S (plus setup), leaving no process behind;
#   - $OUT holds exactly summary.txt, performance-entry.md and device-check-logs.tar.gz, the
#     archive under 16 MiB with every log in it (cut to its tail, as too large to keep whole);
#   - the summary names each outcome: the failed test and its rerun, the timeout, the rate
#     measured from the metrics the fake wrote, and the exit status (1).
source "$(dirname "$0")/lib.sh"

FAKE=$WORK/fake
mkdir -p "$FAKE/bin" "$FAKE/path"
MARK=ddpv-device-check-fake-$$

cat >"$FAKE/path/nvidia-smi" <<'EOF'
#!/bin/sh
echo "Fake GPU 80GB, 999.1, 81559 MiB"
EOF

# A GPU test with one failing case, whose log is too large for the archive whole.
cat >"$FAKE/bin/cuda_backend_test" <<'EOF'
#!/bin/bash
if [[ $* == *--gtest_filter=* ]]; then
  echo "[ RUN      ] CudaBackend.Breaks"; echo "cuda_backend_test.cpp:12: Failure"
  echo "[  FAILED  ] CudaBackend.Breaks"; exit 1
fi
echo "[==========] Running 2 tests"
head -c $((17 * 1024 * 1024)) /dev/urandom | base64 -w 0
echo
echo "[  FAILED  ] CudaBackend.Breaks (3 ms)"
echo "[  PASSED  ] 1 test."
echo "[  FAILED  ] 1 test, listed below:"
exit 1
EOF
cat >"$FAKE/bin/op_conv_test" <<'EOF'
#!/bin/sh
echo "[  PASSED  ] 7 tests."
EOF

# ddpv-train: resnet50 writes step records as the real one does; lenet in bf16 hangs in its
# "setup" and turns SIGTERM aside, as a real one stuck before its first step would.
cat >"$FAKE/bin/ddpv-train" <<EOF
#!/bin/bash
args="\$*"
metrics=
while (( \$# )); do [[ \$1 == --metrics ]] && metrics=\$2; shift; done
if [[ \$args == *lenet* && \$args == *bf16* ]]; then
  trap '' TERM
  exec -a $MARK sleep 600
fi
if [[ -n \$metrics ]]; then
  for s in 5 10 15 20; do
    echo "{\"event\": \"step\", \"step\": \$s, \"images_per_s\": 1234.5}" >>"\$metrics"
  done
fi
echo "done: 4 steps"
EOF
chmod +x "$FAKE/path/nvidia-smi" "$FAKE"/bin/*

OUT=$WORK/out
BUDGET=15
KILL=3
t0=$(date +%s)
set +e
PATH=$FAKE/path:$PATH OUT=$OUT LOGS=$WORK/logs DDPV_DEVICE_BIN=$FAKE/bin BUDGET_S=$BUDGET \
  KILL_S=$KILL TESTS="cuda_backend_test op_conv_test" MODELS=lenet STEPS=10 WARMUP=5 \
  PROFILE=0 PYTHON="$PY" timeout -k 5 120 "$SRC/scripts/device-check.sh" >"$WORK/stdout" 2>&1
rc=$?
set -e
took=$(($(date +%s) - t0))
cat "$WORK/stdout"

[[ $rc == 1 ]] || fail "device-check exited $rc (expected 1: a test failed, a run timed out)"
((took <= BUDGET + KILL + 15)) || fail "device-check took $took s, budget $BUDGET s + kill $KILL s"
((took >= BUDGET - 2)) || fail "device-check took only $took s: the hung run was not waited for"
pgrep -f "$MARK" >/dev/null && fail "the hung fake ddpv-train outlived the script"

files=$(cd "$OUT" && find . -type f | sed 's|^\./||' | sort | tr '\n' ' ')
[[ $files == "device-check-logs.tar.gz performance-entry.md summary.txt " ]] ||
  fail "\$OUT holds: $files"
size=$(stat -c %s "$OUT/device-check-logs.tar.gz")
((size < 16 * 1024 * 1024)) || fail "the log archive is $size bytes, over the tool's 16 MiB"

S=$OUT/summary.txt
grep -q "test cuda_backend_test: rc 1, passed 1, skipped 0, failed 1" "$S" || fail "no failed test line"
grep -q "rerun of CudaBackend.Breaks" "$S" || fail "the failed case was not rerun"
grep -q "test op_conv_test: ok, passed 7" "$S" || fail "no passed test line"
grep -q "train lenet fp32: ok" "$S" || fail "no lenet fp32 line"
grep -q "train lenet bf16: timed out, killed (rc 137)" "$S" || fail "the hang is not reported"
grep -q "time budget reached\|exit status 1" "$S" || fail "no exit status in the summary"
grep -q "logs cut to their last 512 KiB" "$S" || fail "the oversized archive was not cut"
grep -q "| bf16 |" "$OUT/performance-entry.md" || fail "no performance entry"

mkdir "$WORK/unpacked"
tar -C "$WORK/unpacked" -xzf "$OUT/device-check-logs.tar.gz"
for f in device-check.txt tests/cuda_backend_test.log tests/op_conv_test.log \
  tests/cuda_backend_test.CudaBackend.Breaks.rerun.log tests/train-lenet-bf16.log; do
  [[ -f $WORK/unpacked/$f ]] || fail "the archive lacks $f"
done
big=$(stat -c %s "$WORK/unpacked/tests/cuda_backend_test.log")
((big <= 524288)) || fail "the large log was kept at $big bytes"
grep -q "listed below" "$WORK/unpacked/tests/cuda_backend_test.log" || fail "the cut lost the log's end"

# A second run with time for the rates: the fake's step records give ours (1234.5 img/s).
rm -rf "$OUT"
set +e
PATH=$FAKE/path:$PATH OUT=$OUT LOGS=$WORK/logs2 DDPV_DEVICE_BIN=$FAKE/bin BUDGET_S=60 \
  KILL_S=$KILL SKIP_TESTS=1 STEPS=10 WARMUP=5 PROFILE=0 PYTHON="$PY" \
  timeout -k 5 120 "$SRC/scripts/device-check.sh" >"$WORK/stdout2" 2>&1
rc=$?
set -e
cat "$WORK/stdout2"
grep -q "ddpv fp32: 1234.5 img/s" "$OUT/summary.txt" || fail "our rate was not read from the metrics"
grep -q "ddpv bf16: 1234.5 img/s" "$OUT/summary.txt" || fail "our bf16 rate was not read"
# No GPU for PyTorch here: its rates are missing, so the run is not a success.
[[ $rc == 1 ]] || fail "device-check without PyTorch's rates exited $rc"
echo "device_check_test: ok (first run $took s)"
