#!/usr/bin/env bash
# Start the local Slurm test cluster: its own munged, slurmctld and three
# slurmd ("nodes" n1..n3) on this machine, all on 127.0.0.1 with their own
# ports, everything under one state directory (docs/slurm.md).
#
#   HPVC_SLURM_DIR   state directory (default /var/lib/hpvc/slurm)
#   HPVC_SLURM_PORT  slurmctld port; the slurmd use the next three (default 6917)
#
# Idempotent: starts only what is not running. The last line of its output is
# the `export SLURM_CONF=...` that points srun/sbatch/sinfo at the cluster.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/slurm/common.sh
. "$here/common.sh"

die() { echo "slurm-up: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (slurmd runs jobs as any user)"
for b in munged slurmctld slurmd sinfo; do
  command -v "$b" >/dev/null || die "$b not installed (run 'make setup')"
done
case "$SLURM_DIR" in /*) ;; *) die "HPVC_SLURM_DIR must be an absolute path" ;; esac
# munged refuses a socket in a directory not searchable by everyone.
d=$(dirname "$SLURM_DIR")
while [ "$d" != / ]; do
  if [ -d "$d" ] && [ "$(( 0$(stat -c %a "$d") & 1 ))" = 0 ]; then
    die "$d is not searchable by all users (munged needs that for its socket): chmod o+x it or pick another HPVC_SLURM_DIR"
  fi
  d=$(dirname "$d")
done

export SLURM_CONF=$CONF

running() {
  local n
  ours_pid "$MUNGE_PID" munged >/dev/null || return 1
  ours_pid "$CTLD_PID" slurmctld >/dev/null || return 1
  for n in "${NODES[@]}"; do ours_pid "$(slurmd_pid "$n")" slurmd >/dev/null || return 1; done
}

any_running() {
  local n
  ours_pid "$MUNGE_PID" munged >/dev/null && return 0
  ours_pid "$CTLD_PID" slurmctld >/dev/null && return 0
  for n in "${NODES[@]}"; do ours_pid "$(slurmd_pid "$n")" slurmd >/dev/null && return 0; done
  return 1
}

log_tail() {
  local f
  for f in "$SLURM_DIR"/log/*; do
    [ -s "$f" ] || continue
    echo "--- $f (last 15 lines)" >&2
    tail -n 15 "$f" >&2
  done
}

port_busy() { ss -Htln "sport = :$1" 2>/dev/null | grep -q .; }

write_conf() {
  local host cpus i
  host=$(hostname -s)
  cpus=$(nproc)
  cat >"$CONF" <<CONF
# Local Slurm test cluster made by scripts/slurm/up.sh (docs/slurm.md).
# Do not edit: 'make slurm-down' removes this directory.
ClusterName=$CLUSTER_NAME
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$BASE_PORT
SlurmdPort=$((BASE_PORT + 1))
SlurmUser=root
SlurmdUser=root
# Our own munged, never the system one.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
# Listen on 127.0.0.1 only, not on every address of the host.
CommunicationParameters=NoInAddrAny
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool/%n
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURM_DIR/run/slurmd-%n.pid
SlurmctldLogFile=$SLURM_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$SLURM_DIR/plugstack.conf
# No cgroups: nothing here touches the host's cgroup tree.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
# Per-node TmpFS: three slurmd on one machine must not share PMIx's client
# directories (/tmp/spmix_appdir_<uid>_<job>.<step> would clash).
TmpFS=$SLURM_DIR/tmp/%n
SwitchType=switch/none
ReturnToService=2
KillWait=5
MinJobAge=60
CONF
  for i in "${!NODES[@]}"; do
    echo "NodeName=${NODES[$i]} NodeHostname=$host NodeAddr=127.0.0.1 Port=$((BASE_PORT + 1 + i)) CPUs=$cpus RealMemory=1024 State=UNKNOWN" >>"$CONF"
  done
  echo "PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP" >>"$CONF"
}

# hpvc's SPANK plugin (srun --hpvc=SPEC, docs/slurm.md) when it is built:
# HPVC_SPANK_SO names the .so, HPVC_BIN the hpvc command it runs, and
# HPVC_SPANK_ARGS extra plugstack arguments (site policy).
write_plugstack() {
  local so=${HPVC_SPANK_SO:-$here/../../native/spank/hpvc_spank.so}
  local bin=${HPVC_BIN:-$here/../../.venv/bin/hpvc}
  {
    echo "# SPANK plugins of the hpvc test cluster (written by scripts/slurm/up.sh)"
    if [ -e "$so" ]; then
      echo "required $(realpath "$so") hpvc=$(realpath "$bin") state_dir=${HPVC_STATE_DIR:-/var/lib/hpvc} ${HPVC_SPANK_ARGS:-}"
    else
      echo "# $so is not built: 'make -C native/spank' adds srun --hpvc"
    fi
  } >"$SLURM_DIR/plugstack.conf"
}

start=$(date +%s.%N)
already=0
started=()  # "PID:what" of the daemons started here, to fail fast if one exits
if running; then
  already=1
else
  if ! any_running; then
    for p in $(seq "$BASE_PORT" $((BASE_PORT + ${#NODES[@]}))); do
      port_busy "$p" && die "TCP port $p is in use (set HPVC_SLURM_PORT to another base port)"
    done
    mkdir -p "$SLURM_DIR"
    chmod 755 "$SLURM_DIR"
    mkdir -p "$SLURM_DIR"/{state,run,log,munge,spool}
    chmod 700 "$SLURM_DIR/munge"
    for n in "${NODES[@]}"; do mkdir -p "$SLURM_DIR/spool/$n" "$SLURM_DIR/tmp/$n"; done
    write_conf
    write_plugstack
  fi
  if [ ! -s "$MUNGE_KEY" ]; then
    (umask 077; dd if=/dev/urandom of="$MUNGE_KEY" bs=1024 count=1 status=none)
  fi
  chmod 400 "$MUNGE_KEY"

  if ! ours_pid "$MUNGE_PID" munged >/dev/null; then
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE_KEY" --pid-file="$MUNGE_PID" \
      --log-file="$SLURM_DIR/log/munged.log" --seed-file="$SLURM_DIR/munge/munged.seed" \
      </dev/null || { log_tail; die "munged did not start"; }
  fi
  for _ in $(seq 50); do [ -S "$MUNGE_SOCKET" ] && break; sleep 0.1; done
  [ -S "$MUNGE_SOCKET" ] || { log_tail; die "munged socket $MUNGE_SOCKET did not appear"; }

  # -D keeps the daemons in the foreground; setsid detaches them from this
  # shell, and they write their own pid files (SlurmctldPidFile, SlurmdPidFile).
  if ! ours_pid "$CTLD_PID" slurmctld >/dev/null; then
    setsid slurmctld -D -f "$CONF" </dev/null >>"$SLURM_DIR/log/slurmctld.out" 2>&1 &
    started+=("$!:slurmctld")
  fi
  for n in "${NODES[@]}"; do
    if ! ours_pid "$(slurmd_pid "$n")" slurmd >/dev/null; then
      # Tasks in hpvc nodes live in other network namespaces: the step's PMIx
      # server must accept connections from them, not only on loopback.
      PMIX_MCA_ptl_tcp_remote_connections=1 \
        setsid slurmd -D -f "$CONF" -N "$n" </dev/null >>"$SLURM_DIR/log/slurmd-$n.out" 2>&1 &
      started+=("$!:slurmd $n")
    fi
  done
fi

# Wait until all three nodes are idle.
deadline=$(( $(date +%s) + ${HPVC_SLURM_TIMEOUT:-30} ))
while :; do
  idle=$(sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 == "idle" {print $1}' | sort -u | grep -c . || true)
  [ "$idle" -ge "${#NODES[@]}" ] && break
  for s in "${started[@]}"; do
    if [ ! -e "/proc/${s%%:*}" ]; then
      log_tail
      die "${s#*:} exited during start-up; logs are in $SLURM_DIR/log ('make slurm-down' cleans up)"
    fi
  done
  if [ "$(date +%s)" -ge "$deadline" ]; then
    sinfo -N 2>&1 | sed 's/^/slurm-up: sinfo: /' >&2 || true
    log_tail
    die "timed out waiting for ${#NODES[@]} idle nodes; logs are in $SLURM_DIR/log ('make slurm-down' cleans up)"
  fi
  sleep 0.2
done
if [ "$already" = 1 ]; then
  echo "slurm-up: already running: cluster $CLUSTER_NAME, nodes ${NODES[*]}, state in $SLURM_DIR"
else
  echo "slurm-up: cluster $CLUSTER_NAME up in $(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN{printf "%.1f", e-s}') s: nodes ${NODES[*]}, slurmctld 127.0.0.1:$BASE_PORT, state in $SLURM_DIR"
fi
echo "export SLURM_CONF=$CONF"
