# Shared logic of the job scripts: option helpers, the launcher command, and the run-a-step
# wrapper that turns Slurm's warning signal into a checkpoint plus a requeue.
# Sourced by train_cpu.sbatch, train_gpu.sbatch and convert.sbatch after DDPV_ROOT is known.
#
# Note [Preemption by signal and requeue]
# A job at its time limit (or preempted) gets `--signal=B:USR1@120`: Slurm sends SIGUSR1 to the
# batch shell only (B:), 120 s before it kills the job. The shell runs the training step in the
# background and waits, because bash runs a trap only between commands: a foreground srun would
# keep the trap from running until training ended. The trap forwards USR1 to the step (srun and
# mpirun both pass USR1 on to every rank); ddpv-train finishes the step it is in, writes a
# checkpoint and exits 0. The shell then calls `scontrol requeue`, which puts the same job id
# back in the queue (the script needs `#SBATCH --requeue`). When it starts again it finds
# <checkpoint dir>/latest (or a checkpoint file) and passes `--resume auto`. SIGTERM (scancel, or the time limit
# without a warning) reaches the ranks directly from Slurm; they checkpoint too, and the shell
# just waits for them and does not requeue: a cancelled job stays cancelled.

# shellcheck shell=bash

ddpv_log() { echo "ddpv-job: $*"; }

# ddpv_has_opt NAME ARGS...: true when ARGS hold --NAME or --NAME=VALUE.
ddpv_has_opt() {
  local name=$1; shift
  local a
  for a in "$@"; do
    [ "$a" = "--$name" ] && return 0
    case "$a" in "--$name="*) return 0 ;; esac
  done
  return 1
}

# ddpv_opt_value NAME ARGS...: prints the value of --NAME VALUE or --NAME=VALUE (last one wins).
ddpv_opt_value() {
  local name=$1; shift
  local value="" prev=""
  local a
  for a in "$@"; do
    [ "$prev" = "--$name" ] && value=$a
    case "$a" in "--$name="*) value=${a#--"$name"=} ;; esac
    prev=$a
  done
  printf '%s' "$value"
}

# Fills the array DDPV_TRAIN_ARGS: the user's arguments plus what the job knows and the user
# did not say: --threads from SLURM_CPUS_PER_TASK, a checkpoint folder per job id, and
# --resume auto when that folder already holds a checkpoint (a requeued or resubmitted job).
ddpv_train_args() {
  DDPV_TRAIN_ARGS=("$@")
  if ! ddpv_has_opt threads "$@" && [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then
    DDPV_TRAIN_ARGS+=(--threads "$SLURM_CPUS_PER_TASK")
  fi
  DDPV_CHECKPOINT_DIR=$(ddpv_opt_value checkpoint-dir "$@")
  if [ -z "$DDPV_CHECKPOINT_DIR" ]; then
    DDPV_CHECKPOINT_DIR=${DDPV_CHECKPOINT_ROOT}/${SLURM_JOB_ID:-local}
    DDPV_TRAIN_ARGS+=(--checkpoint-dir "$DDPV_CHECKPOINT_DIR")
  fi
  mkdir -p "$DDPV_CHECKPOINT_DIR"
  # A checkpoint without `latest` counts too (its write may have hit a full disk): --resume
  # auto then takes the newest checkpoint that verifies.
  if ! ddpv_has_opt resume "$@"; then
    local restart=${SLURM_RESTART_COUNT:+ (restart $SLURM_RESTART_COUNT)}
    if [ -e "$DDPV_CHECKPOINT_DIR/latest" ]; then
      ddpv_log "resuming from $DDPV_CHECKPOINT_DIR/latest$restart"
      DDPV_TRAIN_ARGS+=(--resume auto)
    elif compgen -G "$DDPV_CHECKPOINT_DIR/ckpt-e*-s*.h5" >/dev/null; then
      ddpv_log "resuming from the newest checkpoint in $DDPV_CHECKPOINT_DIR (it has no latest)$restart"
      DDPV_TRAIN_ARGS+=(--resume auto)
    fi
  fi
}

# Fills the array DDPV_LAUNCH with the command that starts one rank per Slurm task.
# shellcheck disable=SC2034  # DDPV_LAUNCH is read by the scripts that source this file
ddpv_launcher() {
  local cpus=${SLURM_CPUS_PER_TASK:-1}
  case "$DDPV_LAUNCHER" in
    srun)
      # --kill-on-bad-exit: one failed rank ends the step instead of leaving the others hanging
      # in a collective until the time limit.
      DDPV_LAUNCH=(srun --mpi="$DDPV_SRUN_MPI" --kill-on-bad-exit=1 --cpus-per-task="$cpus") ;;
    mpirun)
      local ntasks=${SLURM_NTASKS:-1}
      local per_node=${SLURM_NTASKS_PER_NODE:-$ntasks}
      per_node=${per_node%%(*}   # Slurm writes "2(x3)" for 2 tasks on each of 3 nodes
      if [ -n "$DDPV_MPIRUN_ARGS" ]; then
        # shellcheck disable=SC2206
        DDPV_LAUNCH=(mpirun -np "$ntasks" $DDPV_MPIRUN_ARGS)
      else
        DDPV_LAUNCH=(mpirun -np "$ntasks" --map-by "ppr:${per_node}:node:PE=${cpus}" --bind-to core)
      fi ;;
    *) ddpv_log "DDPV_LAUNCHER='$DDPV_LAUNCHER' is not srun or mpirun (set it in jobs/env.sh)"
       return 2 ;;
  esac
}

# ddpv_run_step MODE NAME COMMAND...: runs COMMAND in the background and waits for it; NAME
# is what the log calls it.
#   MODE=forward  on USR1, pass the signal to the step, wait for its checkpoint, then requeue.
#   MODE=rerun    on USR1, stop the step (SIGTERM) and requeue: the step keeps no state, and
#                 its output is written under a temporary name and renamed, so a stopped run
#                 leaves nothing half-done and the requeued job starts it over.
# Returns the step's exit status. See Note [Preemption by signal and requeue].
ddpv_run_step() {
  local mode=$1 name=$2; shift 2
  DDPV_PREEMPTED=0
  DDPV_INTERRUPTED=0
  DDPV_STEP_MODE=$mode
  trap '_ddpv_on_usr1' USR1
  trap '_ddpv_on_term' TERM
  "$@" &
  DDPV_STEP_PID=$!
  local rc
  while true; do
    DDPV_INTERRUPTED=0
    wait "$DDPV_STEP_PID"
    rc=$?
    # wait returns early (status > 128) when a trap ran; the step itself is still running.
    [ "$DDPV_INTERRUPTED" = 1 ] && kill -0 "$DDPV_STEP_PID" 2>/dev/null && continue
    [ "$DDPV_INTERRUPTED" = 1 ] && { wait "$DDPV_STEP_PID" 2>/dev/null; rc=$?; }
    break
  done
  trap - USR1 TERM
  ddpv_log "$name finished with status $rc"
  if [ "$DDPV_PREEMPTED" = 1 ]; then
    if [ "$mode" = forward ] && [ "$rc" -ne 0 ]; then
      ddpv_log "step exited with status $rc after the warning signal; not requeueing"
      return "$rc"
    fi
    ddpv_requeue
    return 0
  fi
  return "$rc"
}

_ddpv_on_usr1() {
  DDPV_INTERRUPTED=1
  [ "$DDPV_PREEMPTED" = 1 ] && return   # one warning is enough
  DDPV_PREEMPTED=1
  if [ "$DDPV_STEP_MODE" = rerun ]; then
    ddpv_log "received USR1 (time limit or preemption ahead): stopping the step, it reruns"
    kill -TERM "$DDPV_STEP_PID" 2>/dev/null || true
    return
  fi
  ddpv_log "received USR1 (time limit or preemption ahead): asking the step to checkpoint"
  kill -USR1 "$DDPV_STEP_PID" 2>/dev/null || true
}

_ddpv_on_term() {
  # Under Slurm, scancel and the time limit signal the ranks themselves; outside it (mpirun on
  # a workstation) the request is passed on as USR1, which mpirun forwards to the ranks as is
  # (on TERM, mpirun tears the job down and exits 1). Then wait for the checkpoint.
  DDPV_INTERRUPTED=1
  [ -n "${SLURM_JOB_ID:-}" ] || kill -USR1 "$DDPV_STEP_PID" 2>/dev/null || true
  ddpv_log "received TERM: waiting for the step to finish its checkpoint"
}

# Puts this job back in the queue under the same id; it restarts from the top of the script.
ddpv_requeue() {
  if [ -z "${SLURM_JOB_ID:-}" ]; then
    ddpv_log "not running under Slurm: nothing to requeue; rerun the same command to resume"
    return 0
  fi
  ddpv_log "requeueing job $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID" || ddpv_log "scontrol requeue failed: submit again to resume"
}
