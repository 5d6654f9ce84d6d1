#!/usr/bin/env bash
# Packs what scripts/device-check.sh needs on a GPU machine that has CUDA, cuDNN and NCCL but
# none of our other libraries and no package registry: the CUDA build's binaries (built here;
# nvcc needs no GPU) and the shared libraries they load (Open MPI with its plugins, HDF5,
# Boost.Program_options, oneDNN, and what those need), into .devlibs/ (ignored by git), to be
# carried to the device (device tool: carry [".devlibs"]).
#
#   scripts/pack-device-libs.sh [BUILD_DIR]     (default: build-cuda)
#
# Layout of .devlibs/:
#   bin/             ddpv-train and the GPU-relevant test binaries, stripped
#   devroot.tar.xz   the libraries with their absolute paths (relative to /), CUDA and glibc
#                    excluded; device-check.sh copies into / only files the device lacks
#   MANIFEST         when, from which commit and build, CUDA architectures, sizes
# The device tool carries 64 MiB in all, the working tree (tracked and untracked-not-ignored
# files) included, so the folder must fit in 64 MiB minus that tree (less 1 MiB of margin);
# LIMIT_MIB overrides the computed limit. Only the tests with CUDA cases are packed
# (scripts/gpu-tests.sh).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${1:-build-cuda}
[[ $BUILD_DIR = /* ]] || BUILD_DIR=$ROOT/$BUILD_DIR
OUT=$ROOT/.devlibs
# What travels besides .devlibs: every file git tracks or would add, in KiB.
tree_kib() {
  git -C "$ROOT" ls-files -z --cached --others --exclude-standard |
    (cd "$ROOT" && xargs -0 -r stat -c %s -- 2>/dev/null) |
    awk '{ s += $1 } END { printf "%d\n", (s + 1023) / 1024 }'
}
if [[ -n ${LIMIT_MIB:-} ]]; then
  LIMIT_KIB=$((LIMIT_MIB * 1024))
else
  TREE_KIB=$(tree_kib)
  LIMIT_KIB=$(((64 - 1) * 1024 - TREE_KIB))
fi
JOBS=${JOBS:-2}

die() { echo "pack-device-libs: $*" >&2; exit 1; }

[[ -f $BUILD_DIR/CMakeCache.txt ]] ||
  die "$BUILD_DIR is not configured; first: cmake -S $ROOT -B $BUILD_DIR -DDDPV_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=\"80;90\""
grep -q '^DDPV_WITH_CUDA:STRING=\(ON\|AUTO\)' "$BUILD_DIR/CMakeCache.txt" ||
  die "$BUILD_DIR is configured without CUDA (DDPV_WITH_CUDA=OFF)"
ARCHS=$(sed -n "s/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p" "$BUILD_DIR/CMakeCache.txt")
[[ $ARCHS == *90* ]] || die "$BUILD_DIR builds for CUDA architectures '$ARCHS': the H200 needs 90"

# ---- 1. build the binaries the device check runs --------------------------------------------
mapfile -t TESTS < <("$ROOT/scripts/gpu-tests.sh")
TARGETS=(ddpv-train "${TESTS[@]}")
echo "pack-device-libs: building ${TARGETS[*]} in $BUILD_DIR"
cmake -S "$ROOT" -B "$BUILD_DIR" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${TARGETS[@]}"

rm -rf "$OUT"
mkdir -p "$OUT/bin"
for t in "${TARGETS[@]}"; do
  cp "$BUILD_DIR/bin/$t" "$OUT/bin/$t"
  strip --strip-unneeded "$OUT/bin/$t"
done

# ---- 2. the shared libraries they need, minus CUDA (present there) and the C/C++ runtime -----
# (the device's own glibc and libstdc++ are newer; mixing in older copies would break it).
skip_lib() {
  case $(basename "$1") in
    libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | libresolv.so* | libutil.so* | \
      ld-linux*.so* | libstdc++.so* | libgcc_s.so* | linux-vdso*) return 0 ;;
    libcuda.so* | libcudart.so* | libcublas*.so* | libcudnn*.so* | libnccl.so* | libnvrtc*.so* | \
      libnvJitLink*.so* | libnvidia-*.so*) return 0 ;;
  esac
  [[ $1 == /usr/local/cuda* ]]
}

declare -A SEEN=()
FILES=()
add_file() {  # a path and, when it is a symlink, what it points to
  local f=$1
  [[ -e $f ]] || return 0
  # Canonical folder, same name: /lib/x86_64-linux-gnu/libz.so.1 (via Debian's /lib -> usr/lib)
  # is stored as /usr/lib/x86_64-linux-gnu/libz.so.1, so that nothing in the archive passes
  # through a symlinked folder on the device.
  f=$(readlink -f "$(dirname "$f")")/$(basename "$f")
  [[ -z ${SEEN[$f]:-} ]] || return 0
  SEEN[$f]=1
  FILES+=("${f#/}")
  if [[ -L $f ]]; then add_file "$(readlink -f "$f")"; fi
}
add_closure() {  # every library an ELF file loads, recursively (ldd resolves the closure)
  local line lib
  while read -r line; do
    lib=$(awk '/=> \//{print $3}' <<<"$line")
    [[ -n $lib ]] || continue
    skip_lib "$lib" && continue
    add_file "$lib"
  done < <(ldd "$1" 2>/dev/null || true)
}

for t in "${TARGETS[@]}"; do add_closure "$OUT/bin/$t"; done

# Open MPI opens its components (and PMIx its plugins) with dlopen from fixed paths, and reads
# its help texts and defaults from there: carry those packages whole. The plugins' own extra
# libraries (verbs, libfabric, UCX) are left behind: those components fail to load and are
# skipped, and one process on one host needs none of them.
for pkg in libopenmpi3 openmpi-common openmpi-bin libpmix2; do
  dpkg -s "$pkg" >/dev/null 2>&1 || { echo "pack-device-libs: note: package $pkg not installed"; continue; }
  while read -r f; do
    [[ -f $f || -L $f ]] || continue
    case $f in /usr/share/doc/* | /usr/share/man/* | /usr/share/lintian/*) continue ;; esac
    add_file "$f"
  done < <(dpkg -L "$pkg")
done
for core in /usr/lib/x86_64-linux-gnu/openmpi/lib/libmpi.so.40 /usr/bin/orted; do
  [[ -e $core ]] && add_closure "$core"
done

tar -C / -cJf "$OUT/devroot.tar.xz" "${FILES[@]}"

# ---- 3. manifest and size check ---------------------------------------------------------------
{
  echo "packed: $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname)"
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo none) ($(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l) changed files)"
  echo "build: $BUILD_DIR ($(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$BUILD_DIR/CMakeCache.txt"))"
  echo "cuda_archs: $ARCHS"
  echo "nvcc: $("$(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt")" --version | tail -1)"
  echo "binaries: ${TARGETS[*]}"
  echo "libraries: ${#FILES[@]} files"
} >"$OUT/MANIFEST"
SIZE_KIB=$(du -sk "$OUT" | cut -f1)
echo "pack-device-libs: $OUT holds $((SIZE_KIB / 1024)) MiB ($(ls "$OUT/bin" | wc -l) binaries, ${#FILES[@]} library files)"
echo "pack-device-libs: limit $((LIMIT_KIB / 1024)) MiB (64 MiB carried in all, less the working tree${TREE_KIB:+ of $((TREE_KIB / 1024)) MiB} and 1 MiB)"
((SIZE_KIB <= LIMIT_KIB)) ||
  die "$OUT holds $((SIZE_KIB / 1024)) MiB, over the $((LIMIT_KIB / 1024)) MiB that can travel: carry fewer binaries or shrink the working tree"
echo "pack-device-libs: carry it with the device tool: run(command='scripts/device-check.sh', carry=['.devlibs'])"
