# Site settings for the job scripts: modules, where ddpvision is installed, where checkpoints
# go, how ranks are launched. Sourced by every script in jobs/; edit this file once per cluster.
# Every setting is `NAME=${NAME:-default}`, so a value exported before `sbatch` (sbatch passes
# the submitting environment on by default) wins over the default written here.

# ---- modules ---------------------------------------------------------------------------------
# Load the same compiler, MPI, HDF5 and oneDNN (and CUDA, cuDNN, NCCL on GPU nodes) that the
# build used, or ddpv-train fails at start with "cannot open shared object file".
# Example for an Lmod site (uncomment and adapt):
#   module purge
#   module load gcc/12 openmpi/4.1 hdf5/1.10 onednn/2.6
#   module load cuda/12.4 cudnn/9 nccl/2.21          # GPU partitions only
if command -v module >/dev/null 2>&1 && [ -n "${DDPV_MODULES:-}" ]; then
  # DDPV_MODULES="gcc/12 openmpi/4.1 hdf5/1.10" loads a list without editing this file.
  # shellcheck disable=SC2086
  module load ${DDPV_MODULES}
fi

# ---- paths -----------------------------------------------------------------------------------
# DDPV_ROOT is the folder above jobs/: the source tree, or <PREFIX>/share/ddpvision after
# `make install PREFIX=...`; the scripts set it before sourcing this file.
# DDPV_BIN holds ddpv-train and ddpv-convert: by default the build tree's bin/ (source tree) or
# <PREFIX>/bin (installed tree), whichever has them.
if [ -z "${DDPV_BIN:-}" ]; then
  for d in "$DDPV_ROOT/build/bin" "$DDPV_ROOT/../../bin"; do
    if [ -x "$d/ddpv-train" ]; then DDPV_BIN=$(cd "$d" && pwd); break; fi
  done
  DDPV_BIN=${DDPV_BIN:-$DDPV_ROOT/build/bin}
fi
# Checkpoints: one folder per job below this root, named by the job id (which survives a
# requeue, so a requeued job finds its own checkpoints); default: checkpoints/ in the folder
# the job was submitted from. Put it on a shared file system that every node can read: a
# resumed job may land on other nodes than the first time. A job given --checkpoint-dir uses
# that folder instead (so a new submission can continue an old job).
DDPV_CHECKPOINT_ROOT=${DDPV_CHECKPOINT_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}/checkpoints}

# ---- launching -------------------------------------------------------------------------------
# srun (Slurm starts every rank; needs Slurm built with PMIx, check `srun --mpi=list`) or
# mpirun (Open MPI reads the allocation from Slurm and starts its daemons with srun itself).
DDPV_LAUNCHER=${DDPV_LAUNCHER:-srun}
DDPV_SRUN_MPI=${DDPV_SRUN_MPI:-pmix}
# Extra mpirun options when DDPV_LAUNCHER=mpirun (binding, transports). Empty = the defaults
# chosen in common.sh: one rank per task slot, bound to its cores.
DDPV_MPIRUN_ARGS=${DDPV_MPIRUN_ARGS:-}

# Open MPI refuses to start as root unless told; containers and test clusters often run as root.
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

# ---- threads ---------------------------------------------------------------------------------
# ddpv-train gets --threads from SLURM_CPUS_PER_TASK; OpenMP (oneDNN's runtime) should agree so
# that a rank never starts more threads than the cores Slurm gave it.
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-${OMP_NUM_THREADS:-1}}
export OMP_PROC_BIND=${OMP_PROC_BIND:-close} OMP_PLACES=${OMP_PLACES:-cores}

# ---- network (uncomment what your fabric needs; see docs/user-guide.md, troubleshooting) -------
# export OMPI_MCA_btl_tcp_if_include=ib0        # the TCP interface MPI may use
# export OMPI_MCA_pml=ucx                        # InfiniBand through UCX
# export UCX_NET_DEVICES=mlx5_0:1
# export NCCL_SOCKET_IFNAME=ib0                  # NCCL bootstrap interface
# export NCCL_IB_HCA=mlx5                        # NCCL InfiniBand adapters
# export NCCL_DEBUG=WARN                         # INFO prints the rings/trees NCCL chose
