#!/bin/bash
# Runs ddpv-train on one workstation with mpirun, the way the Slurm scripts do on a cluster:
# one rank per GPU (or RANKS ranks on CPU), threads split evenly, checkpoints resumed.
#   jobs/mpirun_local.sh --data fashion.h5 --model lenet --epochs 2
#   RANKS=4 jobs/mpirun_local.sh --device cpu --data fashion.h5 --model resnet20
# Send SIGUSR1 (or SIGTERM) to this script to stop with a checkpoint; run the same command
# again to continue from it (checkpoints go to $DDPV_CHECKPOINT_ROOT/local unless
# --checkpoint-dir is given).
set -uo pipefail

DDPV_ROOT=${DDPV_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
# shellcheck source=env.sh
source "$DDPV_ROOT/jobs/env.sh"
# shellcheck source=common.sh
source "$DDPV_ROOT/jobs/common.sh"

# Ranks: one per visible GPU unless the run is on CPU; on CPU one rank per socket is a good
# start (two ranks on a two-socket machine), RANKS overrides.
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
device=$(ddpv_opt_value device "$@")
if [ -z "${RANKS:-}" ]; then
  if [ "$gpus" -gt 0 ] && [ "$device" != cpu ]; then RANKS=$gpus; else RANKS=1; fi
fi
cores=$(nproc)
threads=$(( cores / RANKS )); [ "$threads" -ge 1 ] || threads=1
export OMP_NUM_THREADS=$threads

ddpv_train_args "$@"
ddpv_has_opt threads "$@" || DDPV_TRAIN_ARGS+=(--threads "$threads")
# Extra mpirun options: MPIRUN_ARGS="--mca btl tcp,self" etc.; --oversubscribe lets more ranks
# than cores start (slow, but handy for trying a world size out).
# shellcheck disable=SC2206
launch=(mpirun -np "$RANKS" --bind-to none ${MPIRUN_ARGS:-})
ddpv_log "$RANKS ranks x $threads threads on $(hostname), checkpoints in $DDPV_CHECKPOINT_DIR"
ddpv_run_step forward ddpv-train "${launch[@]}" "$DDPV_BIN/ddpv-train" "${DDPV_TRAIN_ARGS[@]}"
