#!/usr/bin/env bash
# `make install PREFIX=<temp>` and a consumer project: a tiny CMake project outside the tree
# that does find_package(ddpvision), links ddpvision::ddpv, builds and runs (a Shape and a CPU
# backend doing one op). Also checks the installed programs run and the install refers to no
# path of the source or build tree. Exit 77 = skipped.
set -euo pipefail

source "$(dirname "$0")/lib.sh"

[ -f "$build/CMakeCache.txt" ] || fail "$build is not configured (make build first)"
tmp=$(mktemp -d /tmp/ddpv-install.XXXXXX)
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

# The front door, as a user types it (the build is up to date after `make build`).
make -C "$root" --no-print-directory install BUILD_DIR="$build" PREFIX="$prefix" \
  JOBS="${JOBS:-2}" >"$tmp/install.log" 2>&1 || { tail -n 40 "$tmp/install.log"; fail "make install failed"; }
log "make install PREFIX=$prefix: $(find "$prefix" -type f | wc -l) files"

for f in include/ddpv/core/shape.hpp include/ddpv/backend/backend.hpp \
         lib/cmake/ddpvision/ddpvisionConfig.cmake lib/cmake/ddpvision/ddpvisionTargets.cmake \
         lib/libddpv_core.a share/ddpvision/jobs/train_cpu.sbatch; do
  [ -e "$prefix/$f" ] || fail "$prefix/$f was not installed"
done
for p in ddpv-train ddpv-convert; do
  if [ -x "$build/bin/$p" ]; then
    [ -x "$prefix/bin/$p" ] || fail "$prefix/bin/$p was not installed"
    "$prefix/bin/$p" --help >/dev/null 2>&1 || fail "installed $p --help failed"
  fi
done
# An installed package must not point back into the tree it was built from.
if grep -rl -e "$root/include" -e "$root/src" -e "$build" "$prefix/lib/cmake" >"$tmp/leaks"; then
  fail "the package config refers to the source or build tree: $(cat "$tmp/leaks")"
fi

# ---- the consumer --------------------------------------------------------------------------
mkdir -p "$tmp/consumer"
cat > "$tmp/consumer/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.24)
project(ddpv_consumer LANGUAGES CXX)
find_package(ddpvision 0.1 REQUIRED)
add_executable(consumer main.cpp)
target_link_libraries(consumer PRIVATE ddpvision::ddpv)
EOF
cat > "$tmp/consumer/main.cpp" <<'EOF'
// A program outside the ddpvision tree: builds against the installed headers and libraries.
#include <cstdio>
#include <vector>

#include "ddpv/backend/backend.hpp"
#include "ddpv/core/shape.hpp"

int main() {
  const ddpv::Shape shape{2, 8, 8, 3};
  if (shape.numel() != 384) return 1;
  ddpv::BackendOptions options;
  options.device = ddpv::Device::kCpu;
  options.threads = 1;
  auto backend = ddpv::make_backend(options);
  const std::vector<float> x = {-2.0f, -0.5f, 0.0f, 1.5f, 3.0f};
  std::vector<float> y(x.size(), 7.0f);
  backend->relu_forward(static_cast<int64_t>(x.size()), x.data(), y.data());
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = x[i] > 0 ? x[i] : 0.0f;
    if (y[i] != want) {
      std::printf("relu(%g) = %g, want %g\n", x[i], y[i], want);
      return 1;
    }
  }
  std::printf("consumer: shape %s, backend %s, relu ok\n", shape.str().c_str(),
              backend->name().c_str());
  return 0;
}
EOF
cmake -S "$tmp/consumer" -B "$tmp/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$tmp/consumer.log" 2>&1 ||
  { cat "$tmp/consumer.log"; fail "find_package(ddpvision) failed"; }
cmake --build "$tmp/consumer/build" -j "${JOBS:-2}" >>"$tmp/consumer.log" 2>&1 ||
  { cat "$tmp/consumer.log"; fail "the consumer did not build against the installed tree"; }
if grep -rq -e "$root/include" "$tmp/consumer/build/CMakeFiles"; then
  fail "the consumer was compiled with the source tree's include folder"
fi
out=$("$tmp/consumer/build/consumer") || fail "the consumer failed: $out"
log "$out"
log "PASS"
