#!/usr/bin/env bash
# Stop the local Slurm test cluster started by up.sh and remove everything it
# made: daemons, the hosts' namespaces, the fabric bridge and veths, the
# cpusets, the state directory (HPVC_SLURM_DIR, default /var/lib/hpvc/slurm).
# Safe to run twice.
#
# Only these processes are signalled: the ones named in the cluster's own pid
# files (checked against /proc/PID/cmdline), job steps holding files under the
# state directory open, and processes left in the network namespaces or
# cpusets this cluster made. hpvc shares a job left on a host are taken down
# inside that host (`hpvc node down`) before its namespaces go.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/slurm/common.sh
. "$here/common.sh"

die() { echo "slurm-down: $*" >&2; exit 1; }
case "$SLURM_DIR" in /*) ;; *) die "HPVC_SLURM_DIR must be an absolute path" ;; esac
[ "$SLURM_DIR" != / ] || die "refusing to remove /"

if [ ! -e "$SLURM_DIR" ]; then
  echo "slurm-down: nothing to do ($SLURM_DIR does not exist)"
  exit 0
fi
[ -e "$CONF" ] || [ -e "$SLURM_DIR/run" ] || [ -e "$FABRIC_ENV" ] ||
  die "$SLURM_DIR does not look like a test cluster made by up.sh; not touching it"

export SLURM_CONF=$CONF
# What up.sh made (names recorded before it made them).
fabric=$(sed -n 's/^FABRIC=//p' "$FABRIC_ENV" 2>/dev/null | head -n1)
mapfile -t netns < <(sed -n 's/^NETNS=//p' "$FABRIC_ENV" 2>/dev/null)

# slurmstepd processes of this cluster (one that outlived its slurmd): they
# hold its slurmd log under the state directory open. slurmd cleans their
# environment, so nothing else marks them.
steps() {
  local c pid f
  for c in /proc/[0-9]*/comm; do
    pid=${c#/proc/}; pid=${pid%/comm}
    [ "$(cat "$c" 2>/dev/null)" = slurmstepd ] || continue
    for f in /proc/"$pid"/fd/*; do
      case "$(readlink "$f" 2>/dev/null)" in
        "$SLURM_DIR"/*) echo "$pid"; break ;;
      esac
    done
  done
  return 0
}

# Processes in the network namespaces or cpusets of this cluster (its hosts).
in_hosts() {
  local ns ids=() p link
  for ns in "${netns[@]}"; do
    [ -e "/run/netns/$ns" ] && ids+=("net:[$(stat -L -c %i "/run/netns/$ns")]")
  done
  for p in /proc/[0-9]*; do
    [ "${p#/proc/}" != $$ ] || continue
    link=$(readlink "$p/ns/net" 2>/dev/null) || continue
    for ns in "${ids[@]}"; do [ "$link" = "$ns" ] && echo "${p#/proc/}" && break; done
  done
  if [ -n "$fabric" ] && [ -d "$CPUSET_ROOT/$fabric" ]; then
    cat "$CPUSET_ROOT/$fabric"/*/cgroup.procs 2>/dev/null || true
  fi
  return 0
}

# stop PID...: SIGTERM, wait up to 10 s, then SIGKILL.
stop() {
  local pid left i
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null || true
  for i in $(seq 100); do
    left=()
    for pid in "$@"; do [ -e "/proc/$pid" ] && left+=("$pid"); done
    [ ${#left[@]} -eq 0 ] && return 0
    sleep 0.1
  done
  kill -KILL "${left[@]}" 2>/dev/null || true
  sleep 0.2
}

# Cancel the jobs first so their steps end and their epilogs (hpvc node down)
# run through Slurm.
if ours_pid "$CTLD_PID" slurmctld >/dev/null && command -v scancel >/dev/null; then
  if [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
    scancel --full -u "$(id -un)" >/dev/null 2>&1 || true
    scancel --full $(squeue -h -o %i 2>/dev/null) >/dev/null 2>&1 || true
    for _ in $(seq 50); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
  fi
fi

# hpvc shares an epilog did not take down: inside their host, while it lives.
hpvc_bin=$(plugstack_arg hpvc)
images=$(plugstack_arg image_dir)
for n in "${NODES[@]}"; do
  pid=$(ours_pid "$(slurmd_pid "$n")" slurmd) || continue
  state=$(host_state "$n")
  [ -n "$hpvc_bin" ] && [ -d "$state/clusters" ] || continue
  for job in $(ls "$state/clusters" | sed -n 's/^j\([0-9]*\)-[0-9]*$/\1/p' | sort -u); do
    echo "slurm-down: $n: hpvc node down --job $job (left by its job)"
    nsenter -t "$pid" --net --uts --mount \
      env HPVC_STATE_DIR="$state" ${images:+HPVC_IMAGE_DIR="$images"} "$hpvc_bin" node down --job "$job" ||
      echo "slurm-down: $n: hpvc node down --job $job failed" >&2
  done
done

# Every daemon at once: each takes a second or two to stop, and the jobs
# are gone, so none needs another any more.
pids=()
for n in "${NODES[@]}"; do
  p=$(ours_pid "$(slurmd_pid "$n")" slurmd) && pids+=("$p")
  p=$(serve_ours "$n") && pids+=("$p")
done
p=$(ours_pid "$CTLD_PID" slurmctld) && pids+=("$p")
p=$(ours_pid "$MUNGE_PID" munged) && pids+=("$p")
p=$(ours_pid "$(serve_pid login)" hpvc) && pids+=("$p")
stop "${pids[@]}"
for n in "${NODES[@]}" login; do rm -f "$(serve_pid "$n")"; done
# Steps left over (a slurmd that died hard leaves its slurmstepd behind).
mapfile -t left < <(steps)
stop "${left[@]}"
# Anything else still running on a host (a task a step did not end).
mapfile -t left < <(in_hosts | sort -u)
if [ ${#left[@]} -gt 0 ]; then
  echo "slurm-down: stopping processes left on the hosts: ${left[*]}"
  stop "${left[@]}"
fi

# The fabric: its journal first (python -m hpvc.testbed undo: what up.sh's
# builder made), then by name whatever is left (a journal lost or unreadable).
# Deleting a veth deletes its peer; a namespace with no process left goes with
# its name.
if [ -e "$FABRIC_JOURNAL" ]; then
  if py=$(testbed_python); then
    "$py" -m hpvc.testbed undo --journal "$FABRIC_JOURNAL" || echo "slurm-down: removing the fabric by name" >&2
  fi
fi
for ns in "${netns[@]}"; do
  ip link del "$ns" 2>/dev/null || true
  [ ! -e "/run/netns/$ns" ] || ip netns del "$ns"
done
if [ -n "$fabric" ]; then
  ip link del "$fabric" 2>/dev/null || true
  if [ -d "$CPUSET_ROOT/$fabric" ]; then
    rmdir "$CPUSET_ROOT/$fabric"/*/ 2>/dev/null || true
    rmdir "$CPUSET_ROOT/$fabric" || echo "slurm-down: cpuset $CPUSET_ROOT/$fabric is still in use" >&2
  fi
fi

rm -rf --one-file-system "$SLURM_DIR"
# TMPFS_DIR (common.sh) is this cluster's, named after its fabric.
[ -z "$fabric" ] || rm -rf --one-file-system "$TMPFS_DIR"
echo "slurm-down: stopped and removed $SLURM_DIR${fabric:+ and the fabric $fabric}"
