#!/usr/bin/env bash
# The job scripts of jobs/ on a real Slurm: a one-node cluster (munged, slurmctld, slurmd) made
# in a temporary folder on this machine; convert, train, preempt with USR1, requeue, resume.
# Needs root (slurmd starts the jobs' processes as their users). Exit 77 = skipped.
#
# Stages (each bounded by a timeout; the daemons are stopped on any exit):
#   1. convert.sbatch turns a tiny generated IDX data set into an image store.
#   2. train_cpu.sbatch trains lenet for a few steps on 2 ranks (srun --mpi=pmix): the job
#      completes and its checkpoint holds the right step.
#   3. A long job with a 1-minute limit gets USR1 in its batch shell from `--signal=B:USR1@50`:
#      it checkpoints and requeues itself; the requeued run resumes from that checkpoint; then
#      scancel (SIGTERM) stops it with a checkpoint and no requeue.
#   4. A second submission with the same --checkpoint-dir (launched with mpirun this time)
#      resumes from there and runs 3 more steps.
set -euo pipefail

source "$(dirname "$0")/lib.sh"

[ "$(id -u)" -eq 0 ] || skip "needs root to run slurmd and munged (run as root or in a container)"
for p in ddpv-train ddpv-convert; do
  [ -x "$bin/$p" ] || fail "$bin/$p is not built (make build)"
done
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  "$root/scripts/install-deps.sh" --cluster ||
    skip "slurm-wlm and munge are not installed and apt-get could not install them"
fi

# Never let settings of an outer Slurm job (when this test itself runs in one) leak in.
while read -r v; do unset "$v"; done < <(env | sed -n 's/^\(SLURM_[A-Za-z0-9_]*\)=.*/\1/p')

tmp=$(mktemp -d /tmp/ddpv-slurm.XXXXXX)
chmod 755 "$tmp"   # munged insists that every folder above its socket is world-executable
pids=()
# Processes of this cluster, found by the SLURM_CONF in their environment: slurmd hands every
# job step to a slurmstepd that outlives slurmd, so stopping the daemons is not enough.
kill_strays() {
  local d strays=()
  for d in /proc/[0-9]*; do
    [ "${d#/proc/}" = $$ ] && continue
    grep -qsz "^SLURM_CONF=$tmp/slurm.conf\$" "$d/environ" && strays+=("${d#/proc/}")
  done
  [ ${#strays[@]} -eq 0 ] || kill -9 "${strays[@]}" 2>/dev/null || true
}
cleanup() {
  local rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 77 ]; then
    for f in "$tmp"/log/*.log; do echo "---- tail of $f"; tail -n 15 "$f"; echo; done 2>/dev/null || true
  fi
  # Jobs first (their ranks get SIGTERM and a moment to exit), then the daemons in reverse
  # order of start, then whatever is left.
  if [ -f "$tmp/slurm.conf" ] && scancel --partition=test 2>/dev/null; then
    for _ in $(seq 100); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  for (( i=${#pids[@]}-1; i>=0; i-- )); do kill "${pids[$i]}" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  kill_strays
  [ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"
  exit $rc
}
trap cleanup EXIT

fail() {
  echo "$test_name: FAIL: $*"
  for f in "$tmp"/out/*.out; do echo "---- $f"; cat "$f"; done 2>/dev/null || true
  exit 1
}

# ---- the cluster ---------------------------------------------------------------------------
mkdir -p "$tmp"/{munge,state,spool,tmpfs,log,out,ckpt}
chmod 755 "$tmp/munge"
dd if=/dev/urandom of="$tmp/munge.key" bs=1024 count=1 status=none
chmod 400 "$tmp/munge.key"
munged -F --key-file="$tmp/munge.key" --socket="$tmp/munge/socket" --pid-file="$tmp/munge/pid" \
  --log-file="$tmp/log/munged.log" --seed-file="$tmp/munge/seed" >"$tmp/log/munged.stdout" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -S "$tmp/munge/socket" ] && break; sleep 0.1; done
[ -S "$tmp/munge/socket" ] || fail "munged did not start (see $tmp/log/munged.log)"

# Two free TCP ports for slurmctld and slurmd (another Slurm may own the defaults).
read -r ctld_port slurmd_port < <($py -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
node=$(hostname -s)
# No cgroups (not available in a container): processes are tracked by their parent chain and
# tasks are not bound. Accounting is off. cred_expire=5 lets a requeued job start after ~6 s
# instead of the default ~2 minutes. config_overrides trusts CPUs=4 even on a smaller machine,
# so that 2 ranks x 1 CPU always fit.
cat > "$tmp/slurm.conf" <<EOF
ClusterName=ddpvtest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$tmp/munge/socket,cred_expire=5
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
TmpFS=$tmp/tmpfs
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
InactiveLimit=0
KillWait=15
MinJobAge=600
NodeName=$node NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$tmp/slurm.conf
slurmctld -D -f "$SLURM_CONF" >"$tmp/log/slurmctld.stdout" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" >"$tmp/log/slurmd.stdout" 2>&1 &
pids+=($!)
for _ in $(seq 150); do
  [ "$(sinfo -h -o %T 2>/dev/null)" = idle ] && break
  sleep 0.2
done
[ "$(sinfo -h -o %T 2>/dev/null)" = idle ] || fail "the node did not become idle: $(sinfo 2>&1)"
log "cluster up: $(sinfo -h -o '%P %D node(s) %c CPUs %T')"

# ---- helpers -------------------------------------------------------------------------------
job_state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
job_field() { scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"; }

# wait_job ID TIMEOUT: waits until the job has ended; sets s to its final state.
wait_job() {
  local id=$1 limit=$2
  for _ in $(seq $(( limit * 5 ))); do
    s=$(job_state "$id")
    case "$s" in
      COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE) return 0 ;;
    esac
    sleep 0.2
  done
  scancel "$id" 2>/dev/null || true
  fail "job $id still $(job_state "$id") after $limit s"
}

# wait_for TIMEOUT WHAT COMMAND...: polls COMMAND until it succeeds.
wait_for() {
  local limit=$1 what=$2; shift 2
  for _ in $(seq $(( limit * 5 ))); do "$@" && return 0; sleep 0.2; done
  fail "timed out after $limit s waiting for $what"
}

# The step recorded in the checkpoint that DIR/latest names.
ckpt_step() {
  $py - "$1" <<'EOF'
import sys, os, h5py
d = sys.argv[1]
name = open(os.path.join(d, "latest")).read().strip()
with h5py.File(os.path.join(d, name), "r") as f:
    print(int(f.attrs["step"]), int(f.attrs["world_size"]))
EOF
}

# The largest step in a metrics file (JSON lines), 0 when none yet.
metrics_step() {
  $py - "$1" <<'EOF'
import sys, json
best = 0
try:
    for line in open(sys.argv[1]):
        try:
            best = max(best, int(json.loads(line).get("step", 0)))
        except ValueError:
            pass  # a line being written
except OSError:
    pass
print(best)
EOF
}
past_step() { [ "$(metrics_step "$1")" -gt "$2" ]; }
has_line() { grep -q -- "$2" "$1" 2>/dev/null; }

# The job scripts find the source tree themselves (from the job record), as for a user.
export DDPV_BIN=$bin DDPV_CHECKPOINT_ROOT=$tmp/ckpt
cd "$tmp"
submit() { sbatch --parsable -o "$tmp/out/%j.out" "$@"; }

# ---- 1. convert ----------------------------------------------------------------------------
# 512 train and 128 test images of 28x28 in 10 classes, as gzip IDX files: each class is a
# bright square at its own place plus noise, so that a few steps already lower the loss.
$py - "$tmp" <<'EOF2'
import gzip, struct, sys, numpy as np
rng = np.random.default_rng(7)
def make(n):
    labels = rng.integers(0, 10, n).astype(np.uint8)
    images = rng.integers(0, 60, (n, 28, 28)).astype(np.uint8)
    for i, c in enumerate(labels):
        r, q = divmod(int(c), 4)
        images[i, 2 + 8 * r:8 + 8 * r, 2 + 6 * q:8 + 6 * q] = 220
    return images, labels
for split, n in (("train", 512), ("t10k", 128)):
    images, labels = make(n)
    with gzip.open(f"{sys.argv[1]}/{split}-images-idx3-ubyte.gz", "wb") as f:
        f.write(struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
    with gzip.open(f"{sys.argv[1]}/{split}-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">II", 2049, n) + labels.tobytes())
EOF2
j=$(submit "$root/jobs/convert.sbatch" idx --train-images "$tmp/train-images-idx3-ubyte.gz" \
      --train-labels "$tmp/train-labels-idx1-ubyte.gz" --test-images "$tmp/t10k-images-idx3-ubyte.gz" \
      --test-labels "$tmp/t10k-labels-idx1-ubyte.gz" --out "$tmp/tiny.h5")
wait_job "$j" 120
[ "$s" = COMPLETED ] && [ -f "$tmp/tiny.h5" ] || fail "convert job $j ended $s without $tmp/tiny.h5"
log "convert.sbatch: job $j $s, store $(stat -c %s "$tmp/tiny.h5") bytes"

# ---- 2. train ------------------------------------------------------------------------------
common=(--data "$tmp/tiny.h5" --model lenet --batch-size 16 --deterministic --seed 3 --log-every 1)
j=$(submit -N1 --ntasks-per-node=2 --cpus-per-task=1 "$root/jobs/train_cpu.sbatch" "${common[@]}" \
      --max-steps 6 --checkpoint-dir "$tmp/ckpt/a" --metrics "$tmp/a.jsonl")
wait_job "$j" 180
out=$tmp/out/$j.out
[ "$s" = COMPLETED ] || fail "train job $j ended $s"
[ "$(job_field "$j" ExitCode)" = 0:0 ] || fail "train job $j exit code $(job_field "$j" ExitCode)"
has_line "$out" "ddpv-train finished with status 0" || fail "job $j: no success line in its output"
has_line "$out" "2 ranks x 1 threads" || fail "job $j did not run 2 ranks x 1 thread"
read -r step world < <(ckpt_step "$tmp/ckpt/a") || fail "job $j left no readable checkpoint"
[ "$step" = 6 ] && [ "$world" = 2 ] || fail "job $j checkpoint: step $step world $world, want 6 and 2"
log "train_cpu.sbatch: job $j $s, checkpoint at step $step of world size $world"

# ---- 3. preempt, requeue, resume, cancel ---------------------------------------------------
# A 1-minute time limit with the warning 50 s before it: the real --signal=B:USR1 mechanism
# (the script's own @120 is overridden, as a user would). slurmctld checks time limits every
# few seconds, so the signal comes 10 to 30 s after the start.
j=$(submit -N1 --ntasks-per-node=2 --cpus-per-task=1 --time=1 --signal=B:USR1@50 \
      "$root/jobs/train_cpu.sbatch" "${common[@]}" \
      --epochs 1000 --checkpoint-dir "$tmp/ckpt/b" --metrics "$tmp/b.jsonl")
out=$tmp/out/$j.out
wait_for 120 "job $j to requeue itself" has_line "$out" "requeueing job $j"
read -r k1 _ < <(ckpt_step "$tmp/ckpt/b") || fail "job $j: no checkpoint after USR1"
[ "$k1" -gt 2 ] || fail "job $j checkpointed at step $k1, before the step it had reached"
has_line "$out" "stopped by SIGUSR1" || fail "job $j: ddpv-train did not report the USR1 stop"
has_line "$out" "ddpv-train finished with status 0" || fail "job $j: ddpv-train did not exit 0 on USR1"
log "USR1 before the time limit: job $j checkpointed at step $k1 and requeued itself"
wait_for 120 "requeued job $j to resume at step $k1" has_line "$out" "resumed from .* step $k1\$"
has_line "$out" "ddpv-job: resuming from" || fail "job $j: the script did not pass --resume auto"
[ "$(job_field "$j" Restarts)" = 1 ] || fail "job $j: Restarts=$(job_field "$j" Restarts), want 1"
wait_for 120 "requeued job $j to train past step $k1" past_step "$tmp/b.jsonl" $(( k1 + 1 ))
scancel "$j"   # SIGTERM to every process of the job: a checkpoint, and no requeue
wait_job "$j" 120
[ "$s" = CANCELLED ] || fail "job $j ended $s after scancel, want CANCELLED"
read -r k2 _ < <(ckpt_step "$tmp/ckpt/b") || fail "job $j: no checkpoint after SIGTERM"
[ "$k2" -gt "$k1" ] || fail "job $j: checkpoint step $k2 after the resumed run, want > $k1"
has_line "$out" "stopped by SIGTERM" || fail "job $j: ddpv-train did not report the SIGTERM stop"
[ "$(grep -c "requeueing job" "$out")" = 1 ] || fail "job $j requeued itself after scancel"
log "requeued job $j resumed from step $k1; scancel stopped it with a checkpoint at step $k2"

# ---- 4. a second submission resumes (launched by mpirun inside the allocation) -----------
j=$(DDPV_LAUNCHER=mpirun \
    DDPV_MPIRUN_ARGS="--oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none" \
    submit -N1 --ntasks-per-node=2 --cpus-per-task=1 "$root/jobs/train_cpu.sbatch" "${common[@]}" \
      --epochs 1000 --run-steps 3 --checkpoint-dir "$tmp/ckpt/b" --metrics "$tmp/c.jsonl")
wait_job "$j" 180
out=$tmp/out/$j.out
[ "$s" = COMPLETED ] || fail "resubmitted job $j ended $s"
has_line "$out" "resuming from $tmp/ckpt/b/latest" || fail "job $j did not resume"
read -r k3 _ < <(ckpt_step "$tmp/ckpt/b")
[ "$k3" = $(( k2 + 3 )) ] || fail "job $j checkpoint at step $k3, want $k2 + 3"
log "second submission (mpirun): job $j resumed at step $k2 and stopped at step $k3"
log "PASS"
