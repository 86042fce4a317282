# Shared by up.sh, down.sh, host.sh and on.sh: where the local Slurm test
# cluster lives, what it is called, and how to tell its processes from anybody
# else's. Sourced, not run.
# shellcheck shell=bash

# Everything the cluster writes is under this one directory.
SLURM_DIR=${HPVC_SLURM_DIR:-/var/lib/hpvc/slurm}
SLURM_DIR=${SLURM_DIR%/}
# slurmctld listens on BASE_PORT, every slurmd on BASE_PORT+1 (each in its own
# network namespace, so the ports of two clusters never meet).
BASE_PORT=${HPVC_SLURM_PORT:-6917}
# The hosts n1..nN: HPVC_SLURM_HOSTS (make slurm-up passes HOSTS=N), else the
# count a running cluster of this directory was made with (fabric.env, so
# down.sh and on.sh find every host), else 3. At most 32: hosts take the
# fabric addresses .1-.32 and veth names <fabric>-nK stay under 16 characters.
HOST_COUNT=${HPVC_SLURM_HOSTS:-$(sed -n 's/^HOSTS=//p' "$SLURM_DIR/fabric.env" 2>/dev/null | head -n1 || true)}
HOST_COUNT=${HOST_COUNT:-3}
NODES=()
if [[ "$HOST_COUNT" =~ ^[0-9]+$ ]] && [ "$HOST_COUNT" -ge 1 ] && [ "$HOST_COUNT" -le 32 ]; then
  for ((_i = 1; _i <= HOST_COUNT; _i++)); do NODES+=("n$_i"); done
fi
CLUSTER_NAME=hpvctest
# The hostname of slurmctld's own UTS namespace (SlurmctldHost).
CTL=ctl

# The fabric: a bridge in the root namespace and one network namespace per
# host (ctl, n1..nN), each wired to it by a veth pair, made by hpvc's own
# fabric builder (python -m hpvc.testbed, the one its VXLAN test bed stands on
# too) and journaled in FABRIC_JOURNAL. Names and subnet derive
# from the port, so a second cluster (other HPVC_SLURM_DIR and HPVC_SLURM_PORT,
# as the tests start) gets its own: port 6917 -> hpvcfab0, 10.250.0.0/24;
# 6918 -> hpvcfab1, 10.250.1.0/24; ... (the port's distance from 6917, mod 256).
FAB_ID=$(( ((BASE_PORT - 6917) % 256 + 256) % 256 ))
FABRIC=${HPVC_SLURM_FABRIC:-hpvcfab$FAB_ID}  # bridge; netns and veths are $FABRIC-<host>
SUBNET=${HPVC_SLURM_SUBNET:-10.250.$FAB_ID.0/24}
FAB_MTU=9000
FAB_IF=eth0  # a host's end of its veth, inside its network namespace (hpvc.testbed.fabric.IFNAME)
NET3=${SUBNET%.0/24}  # the first three octets (the subnet must be A.B.C.0/24)
# Addresses: nK = .K, slurmctld = .253, the root namespace (bridge) = .254.
host_addr() {
  case "$1" in
    "$CTL") echo "$NET3.253" ;;
    root) echo "$NET3.254" ;;
    n*) echo "$NET3.${1#n}" ;;
  esac
}
netns_name() { echo "$FABRIC-$1"; }
netns_path() { echo "/run/netns/$FABRIC-$1"; }
# cgroup v1 cpuset of each host when the machine has CPUs enough to give them apart.
CPUSET_ROOT=/sys/fs/cgroup/cpuset
cpuset_dir() { echo "$CPUSET_ROOT/$FABRIC/$1"; }

# hpvc's state directory on each host, as the plugin's state_dir= argument:
# %h is the host's short hostname (n1..nN), so what hpvc makes for one host is
# invisible to the others. Images stay shared (image_dir=), as on a cluster
# with a shared file system.
HOST_STATE=${HPVC_SLURM_HOST_STATE:-$SLURM_DIR/hpvc/%h}

# Slurm's TmpFS, one per host: the hosts share this machine's /tmp (a shared
# file system), and PMIx's client directories (spmix_appdir_<uid>_<job>.<step>)
# would clash. Under /tmp, because tasks inside hpvc nodes create the same path
# in the node's own /tmp (Open MPI's session directory), which only /tmp lets
# every user do.
TMPFS_DIR=/tmp/hpvc-slurm-$FAB_ID

# Where scripts/slurm/install.sh put hpvc and its plugin for every user.
SITE_PREFIX=${HPVC_SITE_PREFIX:-/opt/hpvc}
SITE_PREFIX=${SITE_PREFIX%/}

# The Python that runs hpvc's fabric builder (python -m hpvc.testbed):
# HPVC_PYTHON, else the checkout's .venv, else the site installation's.
testbed_python() {
  local c repo
  repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  for c in "${HPVC_PYTHON:-}" "$repo/.venv/bin/python" "$SITE_PREFIX/venv/bin/python"; do
    if [ -n "$c" ] && [ -x "$c" ]; then echo "$c"; return 0; fi
  done
  return 1
}

CONF=$SLURM_DIR/slurm.conf
FABRIC_ENV=$SLURM_DIR/fabric.env  # what up.sh made, for down.sh
FABRIC_JOURNAL=$SLURM_DIR/fabric.jsonl  # the fabric's journal (python -m hpvc.testbed undo)
MUNGE_SOCKET=$SLURM_DIR/run/munge.socket
MUNGE_KEY=$SLURM_DIR/munge/munge.key
MUNGE_PID=$SLURM_DIR/run/munged.pid
CTLD_PID=$SLURM_DIR/run/slurmctld.pid
slurmd_pid() { echo "$SLURM_DIR/run/slurmd-$1.pid"; }
serve_pid() { echo "$SLURM_DIR/run/hpvc-serve-$1.pid"; }

# serve_ours HOST: the PID of HOST's resident hpvc (`hpvc serve`, started by
# host.sh beside its slurmd) if it is alive and serves HOST's state directory.
serve_ours() {
  local pid
  pid=$(tr -dc '0-9' <"$(serve_pid "$1")" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  case "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" in *hpvc\ serve*) ;; *) return 1 ;; esac
  tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qxF "HPVC_STATE_DIR=$(host_state "$1")" || return 1
  echo "$pid"
}

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

# plugstack_arg KEY: the value of KEY= on hpvc's line of plugstack.conf, if any.
plugstack_arg() {
  local w
  [ -r "$SLURM_DIR/plugstack.conf" ] || return 0
  for w in $(grep -m1 '^required .*hpvc_spank' "$SLURM_DIR/plugstack.conf" || true); do
    case "$w" in "$1="*) echo "${w#*=}" ;; esac
  done
}

# host_state HOST: hpvc's state directory on HOST (the plugin's state_dir with
# %h expanded), or the default pattern when no plugin is configured.
host_state() {
  local pattern
  pattern=$(plugstack_arg state_dir)
  pattern=${pattern:-$HOST_STATE}
  pattern=${pattern//%%/$'\001'}
  pattern=${pattern//%h/$1}
  echo "${pattern//$'\001'/%}"
}
