# Shared by up.sh and down.sh: where the local Slurm test cluster lives and
# how to tell its processes from anybody else's. Sourced, not run.
# shellcheck shell=bash

# Everything the cluster makes is under this one directory.
SLURM_DIR=${HPVC_SLURM_DIR:-/var/lib/hpvc/slurm}
SLURM_DIR=${SLURM_DIR%/}
# slurmctld listens on BASE_PORT, the slurmd of node nK on BASE_PORT+K.
BASE_PORT=${HPVC_SLURM_PORT:-6917}
NODES=(n1 n2 n3)
CLUSTER_NAME=hpvctest

CONF=$SLURM_DIR/slurm.conf
MUNGE_SOCKET=$SLURM_DIR/run/munge.socket
MUNGE_KEY=$SLURM_DIR/munge/munge.key
MUNGE_PID=$SLURM_DIR/run/munged.pid
CTLD_PID=$SLURM_DIR/run/slurmctld.pid
slurmd_pid() { echo "$SLURM_DIR/run/slurmd-$1.pid"; }

# The PID in pid file $1 if that process is alive and is binary $2 started for
# this state directory (its command line names a file under it); else nothing.
ours_pid() {
  local pidfile=$1 binary=$2 pid cmd
  [ -r "$pidfile" ] || return 1
  pid=$(tr -dc '0-9' <"$pidfile")
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  case "$cmd" in
    *"$binary"*"$SLURM_DIR/"*) echo "$pid" ;;
    *) return 1 ;;
  esac
}
