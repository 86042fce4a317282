#!/usr/bin/env bash
# Stop the local Slurm test cluster started by up.sh and remove its state
# directory (HPVC_SLURM_DIR, default /var/lib/hpvc/slurm). Safe to run twice.
# Only processes named in the cluster's own pid files (checked against
# /proc/PID/cmdline) and job steps holding files under the state directory
# open are signalled.
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
[ -e "$CONF" ] || [ -e "$SLURM_DIR/run" ] ||
  die "$SLURM_DIR does not look like a test cluster made by up.sh; not touching it"

export SLURM_CONF=$CONF

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

# Cancel the jobs first so their steps end through Slurm.
if ours_pid "$CTLD_PID" slurmctld >/dev/null && command -v scancel >/dev/null; then
  if [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
    scancel --full -u "$(id -un)" >/dev/null 2>&1 || true
    scancel --full $(squeue -h -o %i 2>/dev/null) >/dev/null 2>&1 || true
    for _ in $(seq 50); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
  fi
fi

pids=()
for n in "${NODES[@]}"; do
  p=$(ours_pid "$(slurmd_pid "$n")" slurmd) && pids+=("$p")
done
stop "${pids[@]}"
# Steps left over (a slurmd that died hard leaves its slurmstepd behind).
mapfile -t left < <(steps)
stop "${left[@]}"
p=$(ours_pid "$CTLD_PID" slurmctld) && stop "$p"
p=$(ours_pid "$MUNGE_PID" munged) && stop "$p"

rm -rf --one-file-system "$SLURM_DIR"
echo "slurm-down: stopped and removed $SLURM_DIR"
