#!/usr/bin/env bash
# Start one daemon of the local Slurm test cluster inside its "host"; up.sh
# runs this, detached (docs/slurm.md, "The local Slurm test cluster"):
#
#   host.sh ctl   slurmctld in the network namespace <fabric>-ctl and a UTS
#                 namespace whose hostname is ctl
#   host.sh nK    slurmd -N nK in its cpuset (when up.sh made one), the network
#                 namespace <fabric>-nK, a UTS namespace whose hostname is nK
#                 and a mount namespace of its own: a fresh /run (the network
#                 namespaces and crun containers hpvc makes there stay on that
#                 host), a fresh /dev/shm, /sys/class/net showing its own
#                 network, and an /etc/hosts naming the fabric addresses.
#
# The namespaces are entered with nsenter + unshare, never `ip netns exec`:
# that remounts /sys and hides the cgroup mounts, which the SPANK plugin and
# hpvc need. Everything else (the file system, the cgroup tree) is shared, as
# on a cluster with a shared file system.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/slurm/common.sh
. "$here/common.sh"

role=${1:?usage: host.sh ctl|nK}
if [ "${2:-}" != --inside ]; then
  if [ "$role" = "$CTL" ]; then
    exec nsenter --net="$(netns_path "$role")" unshare --uts -- \
      bash "$here/host.sh" "$role" --inside
  fi
  # Children inherit the cpuset: slurmd, its slurmstepd and the job's tasks.
  cs=$(cpuset_dir "$role")
  if [ -d "$cs" ]; then echo $$ >"$cs/tasks"; fi
  exec nsenter --net="$(netns_path "$role")" unshare --uts --mount --propagation private -- \
    bash "$here/host.sh" "$role" --inside
fi

hostname "$role"
if [ "$role" = "$CTL" ]; then
  # -c (HPVC_SLURM_CLEAR=1, from up.sh when no slurmd of the cluster runs, so
  # no job can): forget the jobs of a slurmctld that died, or their hosts would
  # stay allocated.
  exec slurmctld -D ${HPVC_SLURM_CLEAR:+-c} -f "$CONF"
fi
# Only this mount namespace sees these (--propagation private above).
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs /run
mkdir -p /run/netns /run/lock
chmod 1777 /run/lock
ln -s /dev/shm /run/shm
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
# sysfs shows the network devices of the namespace that mounted it.
mkdir /run/sysfs
mount -t sysfs sysfs /run/sysfs
mount --bind /run/sysfs/class/net /sys/class/net
mount --bind /run/sysfs/devices/virtual/net /sys/devices/virtual/net
umount /run/sysfs
rmdir /run/sysfs
mount --bind "$SLURM_DIR/etc-hosts" /etc/hosts
# Tasks in hpvc nodes live in other network namespaces: the step's PMIx
# server must accept connections from them, not only on loopback.
export PMIX_MCA_ptl_tcp_remote_connections=1
# In a cpuset of its own, slurmd must still number CPUs over all of the
# machine's (hwloc would show it only its cpuset's, renumbered from 0), so that
# the CPU ids Slurm gives a job are the machine's; the other hosts' CPUs are
# its CpuSpecList in slurm.conf, never given to a job here. (slurmd then logs
# that it cannot bind itself to those: "core specialization disabled".)
if [ -d "$(cpuset_dir "$role")" ]; then export HWLOC_ALLOW=all; fi
# The host's resident hpvc (hpvc serve: the plugin's `hpvc node up` starts
# from a warm fork of it), in the host's namespaces and cpuset, as a site
# would run it beside slurmd; down.sh stops it by its pid file.
hpvc_bin=$(plugstack_arg hpvc)
if [ -n "$hpvc_bin" ] && [ "${HPVC_SLURM_RESIDENT:-1}" = 1 ]; then
  if old=$(serve_ours "$role"); then kill "$old" || true; fi  # left by a slurmd that died
  images=$(plugstack_arg image_dir)
  HPVC_STATE_DIR=$(host_state "$role") HPVC_IMAGE_DIR=$images setsid "$hpvc_bin" serve \
    </dev/null >>"$SLURM_DIR/log/hpvc-serve-$role.log" 2>&1 &
  echo $! >"$(serve_pid "$role")"
fi
# Hold the VXLAN port for hpvc before any user can bind it (docs/network.md,
# "Who holds the VXLAN port"), as a site does before slurmd starts.
if [ -n "$hpvc_bin" ] && ! HPVC_STATE_DIR=$(host_state "$role") HPVC_RESIDENT=0 \
  "$hpvc_bin" node prepare >>"$SLURM_DIR/log/slurmd-$role.out" 2>&1; then
  echo "host.sh: hpvc node prepare failed on $role (see above); jobs across hosts may not start" >&2
fi
exec slurmd -D -f "$CONF" -N "$role"
