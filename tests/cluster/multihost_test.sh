#!/usr/bin/env bash
# Multi-host training without a cluster: HOSTS network namespaces on this machine, each with its
# own hostname and one veth link into a bridge, stand in for nodes; mpirun starts the remote
# daemons through a launch agent that enters the namespace (in place of ssh), and MPI talks
# TCP over the veth links only. Trains a few deterministic lenet steps on HOSTS x 2 ranks and
# checks that the parameters equal those of the same world size on one host (both through the
# shared update: one model per host, slices allreduced across hosts in the multi-host run).
# Then the same with an uneven split of each global batch (--batch-split, Note [Balanced
# batches]): ranks of different batch sizes, their slices summed across hosts.
# Needs root (ip netns). Exit 77 = skipped. The setup is described in docs/cluster.md.
set -euo pipefail

source "$(dirname "$0")/lib.sh"
hosts=${HOSTS:-2}
per_host=2
world=$(( hosts * per_host ))

[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces"
[ -x "$bin/ddpv-train" ] || fail "$bin/ddpv-train is not built (make build)"
command -v ip >/dev/null || "$root/scripts/install-deps.sh" --cluster ||
  skip "iproute2 (ip) is not installed and could not be installed"
command -v unshare >/dev/null || skip "unshare (util-linux) is missing"

tmp=$(mktemp -d /tmp/ddpv-multihost.XXXXXX)
tag=$$                       # namespace and link names stay unique per run
switch=ddpvsw$tag
ns_of() { echo "ddpvh$1-$tag"; }
addr_of() { echo "10.231.$(( tag % 200 + 20 )).$(( $1 + 1 ))"; }
made=()
cleanup() {
  local rc=$?
  # Deleting a namespace deletes the veth ends inside it and the bridge.
  for (( i=${#made[@]}-1; i>=0; i-- )); do ip netns del "${made[$i]}" 2>/dev/null || true; done
  [ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"
  exit $rc
}
trap cleanup EXIT

# ---- the network: a switch namespace holding a bridge, one namespace per host ----------------
ip netns add "$switch" 2>"$tmp/err" || skip "cannot create a network namespace here: $(cat "$tmp/err")"
made+=("$switch")
ip -n "$switch" link add br0 type bridge 2>"$tmp/err" || skip "cannot create a bridge: $(cat "$tmp/err")"
ip -n "$switch" link set br0 up
for (( h=0; h<hosts; h++ )); do
  ns=$(ns_of $h)
  ip netns add "$ns"
  made+=("$ns")
  # A veth pair is a cable: one end becomes eth0 of the host, the other a bridge port.
  ip link add "vh$h-$tag" type veth peer name "sp$h-$tag" 2>"$tmp/err" ||
    skip "cannot create veth links: $(cat "$tmp/err")"
  ip link set "vh$h-$tag" netns "$ns"
  ip link set "sp$h-$tag" netns "$switch"
  ip -n "$ns" link set "vh$h-$tag" name eth0
  ip -n "$ns" addr add "$(addr_of $h)/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  ip -n "$switch" link set "sp$h-$tag" master br0
  ip -n "$switch" link set "sp$h-$tag" up
  echo "$(addr_of $h) $ns h$h" >> "$tmp/hosts.map"
  echo "$(addr_of $h) slots=$per_host" >> "$tmp/hostfile"
done
log "$hosts hosts: $(cut -d' ' -f1,3 "$tmp/hosts.map" | paste -sd, -)"

# The launch agent: Open MPI calls `agent HOST COMMAND...` as it would call ssh. It looks HOST
# up in hosts.map, enters that network namespace and a new UTS namespace with the host's
# name, and runs the command there with a shell, as sshd would.
cat > "$tmp/netns-agent.sh" <<EOF
#!/bin/bash
host=\$1; shift
echo "\$host" >> "$tmp/agent.log"
read -r _ ns name < <(awk -v h="\$host" '\$1 == h' "$tmp/hosts.map")
[ -n "\$ns" ] || { echo "netns-agent: unknown host \$host" >&2; exit 255; }
exec ip netns exec "\$ns" unshare --uts /bin/sh -c "hostname \$name; \$*"
EOF
chmod +x "$tmp/netns-agent.sh"

# ---- the runs ------------------------------------------------------------------------------
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
train=("$bin/ddpv-train" --synthetic --synthetic-size 512 --model lenet --device cpu --threads 1
       --batch-size 8 --max-steps 5 --deterministic --seed 11 --lr 0.05 --val-split none
       --log-every 1)

# Reference: all ranks on this host, shared-memory transport, the way the tests run mpirun.
# Uneven: each pair of ranks splits its 16 samples 2 + 14 (rank 0 with 2, rank 1 with 14, ...).
split=$(for ((r = 0; r < world; r++)); do echo $(( r % 2 ? 14 : 2 )); done | paste -sd/ -)
single() {  # name, then more ddpv-train arguments
  local name=$1; shift
  timeout 300 mpirun -np "$world" --oversubscribe --bind-to none \
    --mca btl_vader_single_copy_mechanism none \
    "${train[@]}" --checkpoint-dir "$tmp/$name" --metrics "$tmp/$name.jsonl" "$@" \
    >"$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; fail "the single-host run $name failed"; }
}
single single
single single-split --batch-split "$split"
log "single host: $world ranks done, even and split $split"

# Multi-host: mpirun runs on h0 (like a login to the first node of an allocation); ranks on
# other hosts are started by the agent. TCP only (no shared memory between "hosts"), and only
# over eth0, the veth link, for both MPI messages (btl) and the runtime's own wiring (oob).
multi() {  # name, then more ddpv-train arguments
  local name=$1; shift
  timeout 300 "$tmp/netns-agent.sh" "$(addr_of 0)" \
    mpirun -np "$world" --hostfile "$tmp/hostfile" --bind-to none \
    --mca plm_rsh_agent "$tmp/netns-agent.sh" \
    --mca btl tcp,self --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 \
    "${train[@]}" --checkpoint-dir "$tmp/$name" --metrics "$tmp/$name.jsonl" "$@" \
    >"$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; fail "the multi-host run $name failed"; }
}
multi multi
multi multi-split --batch-split "$split"
grep -q "^balance: the global batch split $split by rank" "$tmp/multi-split.log" ||
  { cat "$tmp/multi-split.log"; fail "the split run did not report its split $split"; }
log "multi host: $world ranks on $hosts hosts done, even and split"
# Note [Rank times]: the busiest rank's host comes from that rank, across nodes. Ranks fill the
# hosts in order, $per_host each, so rank r runs on h(r / $per_host).
line=$(grep "^ranks: busy" "$tmp/multi.log") || { cat "$tmp/multi.log"; fail "no ranks line"; }
[[ $line =~ the\ busiest,\ rank\ ([0-9]+)\ on\ (h[0-9]+), ]] ||
  fail "the ranks line names no rank on one of the hosts: $line"
[ "${BASH_REMATCH[2]}" = "h$(( BASH_REMATCH[1] / per_host ))" ] ||
  fail "rank ${BASH_REMATCH[1]} is on h$(( BASH_REMATCH[1] / per_host )), the line says: $line"
log "the ranks line names rank ${BASH_REMATCH[1]} on ${BASH_REMATCH[2]}"
# Each host's ranks share one model and allreduce their slices across hosts (Note [Shared update]).
grep -q "shared update ($per_host ranks per node x $hosts nodes" "$tmp/multi.log" ||
  { cat "$tmp/multi.log"; fail "the multi-host run did not take the shared update across nodes"; }

# ---- the check -----------------------------------------------------------------------------
compare() {  # dir dir tolerance (relative, element by element)
$py - "$1" "$2" "$world" "$3" <<'EOF'
import os, sys, h5py, numpy as np
def open_latest(d):
    return h5py.File(os.path.join(d, open(os.path.join(d, "latest")).read().strip()), "r")
with open_latest(sys.argv[1]) as a, open_latest(sys.argv[2]) as b:
    for f in (a, b):
        assert int(f.attrs["world_size"]) == int(sys.argv[3]), f"world_size {f.attrs['world_size']}"
    assert int(a.attrs["step"]) == int(b.attrs["step"]), (a.attrs["step"], b.attrs["step"])
    names = []
    a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    names = [n for n in names if n.startswith(("params/", "buffers/"))]
    assert names, "no /params in the checkpoint"
    worst, worst_name, exact = 0.0, "", True
    for n in names:
        x, y = np.asarray(a[n], dtype=np.float64), np.asarray(b[n], dtype=np.float64)
        assert x.shape == y.shape, f"{n}: {x.shape} vs {y.shape}"
        exact &= bool(np.array_equal(x, y))
        d = float(np.max(np.abs(x - y) / (np.abs(x) + 1e-6))) if x.size else 0.0
        if d > worst:
            worst, worst_name = d, n
    print(f"{len(names)} tensors at step {int(a.attrs['step'])}: "
          f"{'bitwise equal' if exact else f'max relative difference {worst:.2e} ({worst_name})'}")
    tol = float(sys.argv[4])
    assert worst <= tol, f"{sys.argv[1]} and {sys.argv[2]} differ: {worst:.2e} in {worst_name}"
EOF
}
# Same reduction order on both transports, so equality is expected; a small tolerance keeps the
# test meaningful should Open MPI pick another allreduce algorithm for TCP.
compare "$tmp/single" "$tmp/multi" 1e-5
compare "$tmp/single-split" "$tmp/multi-split" 1e-5
# The agent ran once for mpirun on h0 and once per other host for its Open MPI daemon.
used=$(sort -u "$tmp/agent.log" | wc -l)
[ "$used" = "$hosts" ] || fail "ranks were started on $used hosts, want $hosts"
log "the multi-host runs equal the single-host runs, even and split; PASS"
