#!/usr/bin/env bash
# Prints the unit test binaries that have CUDA cases, one per line: every cuda_*_test, and the
# other tests whose source instantiates a case per device (test_devices()) or asks for a CUDA
# backend (backend_or_skip(Device::kCuda)). The device check runs these, and
# scripts/pack-device-libs.sh carries only these: a CPU-only test there repeats what CI runs
# and costs carried megabytes.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
for src in "$ROOT"/tests/unit/*_test.cpp; do
  name=$(basename "${src%.cpp}")
  if [[ $name == cuda_* ]] || grep -q -E 'test_devices\(\)|_or_skip\(Device::kCuda' "$src"; then
    echo "$name"
  fi
done
