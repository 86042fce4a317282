#!/usr/bin/env bash
# Run a command on one host of the local Slurm test cluster: in its network,
# UTS and mount namespaces (those of its slurmd), with HPVC_STATE_DIR and
# HPVC_IMAGE_DIR set to that host's hpvc state and the shared images.
#
#   bash scripts/slurm/on.sh n1 ip -br addr          # the host's network
#   bash scripts/slurm/on.sh n2 .venv/bin/hpvc node ls
#   bash scripts/slurm/on.sh n1 crun list            # its containers (its own /run)
#
# HPVC_SLURM_DIR (and HPVC_SLURM_PORT) as for up.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/slurm/common.sh
. "$here/common.sh"

die() { echo "slurm-on: $*" >&2; exit 2; }
[ $# -ge 2 ] || die "usage: on.sh HOST COMMAND [ARG...]  (HOST: ${NODES[*]})"
host=$1
shift
case " ${NODES[*]} " in *" $host "*) ;; *) die "no host '$host' (hosts: ${NODES[*]})" ;; esac
pid=$(ours_pid "$(slurmd_pid "$host")" slurmd) ||
  die "the slurmd of $host in $SLURM_DIR is not running ('make slurm-up')"
images=$(plugstack_arg image_dir)
# The host's CPUs too, when it has its own (up.sh's cpusets).
cs=$(cpuset_dir "$host")
if [ -d "$cs" ]; then echo $$ >"$cs/tasks"; fi
exec nsenter -t "$pid" --net --uts --mount --wd="$PWD" -- \
  env HPVC_STATE_DIR="$(host_state "$host")" ${images:+HPVC_IMAGE_DIR="$images"} "$@"
