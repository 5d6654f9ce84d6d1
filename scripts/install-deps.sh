#!/usr/bin/env bash
# Installs every Debian package that the build, the tests, the demo and the benchmarks need,
# and only those that are missing. Idempotent: a second run installs nothing.
#   scripts/install-deps.sh            build + test dependencies (PyTorch among them: the
#                                      export test loads our checkpoints into torch)
#   scripts/install-deps.sh --bench    also OpenBLAS and tcmalloc (the benchmark peer's BLAS
#                                      and allocator) and torchvision (make bench-data's peer)
#   scripts/install-deps.sh --cluster  also Slurm and munge (tests/cluster)
#   scripts/install-deps.sh --fuzz     also clang and its sanitizer and libFuzzer runtimes
#                                      (make fuzz)
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  openmpi-bin libopenmpi-dev          # MPI launcher and library
  libhdf5-dev hdf5-tools              # image store and checkpoints; h5dump in tests
  libboost-program-options-dev        # command-line parsing
  libdnnl-dev ocl-icd-opencl-dev      # oneDNN, the CPU backend (its CMake config wants OpenCL)
  libgtest-dev googletest             # unit and MPI tests
  libbenchmark-dev                    # bench/
  zlib1g-dev libjpeg-dev libpng-dev   # ddpv-convert: gzip IDX, JPEG, PNG
  dataset-fashion-mnist               # the real data of `make demo`
  python3 python3-numpy python3-h5py python3-matplotlib  # scripts/, plots, test fixtures
  python3-torch                       # e2e.export_torch_test, golden files, the bench peer
)
for arg in "$@"; do
  case "$arg" in
    # the PyTorch peer, its BLAS and its allocator (Note [Peer allocator], bench/peer/torch_ddp.py),
    # and the input-pipeline peer (bench/peer/torchvision_data.py)
    --bench) packages+=(libopenblas0-pthread libtcmalloc-minimal4 python3-torchvision) ;;
    --cluster) packages+=(slurm-wlm munge iproute2) ;;
    --fuzz) packages+=(clang libclang-rt-14-dev) ;;
    *) echo "install-deps.sh: unknown option '$arg' (use --bench, --cluster or --fuzz)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps.sh: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q >/dev/null
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
