#!/usr/bin/env bash
# Start the local Slurm test cluster: its own munged, slurmctld and N slurmd
# ("hosts" n1..nN, 3 unless HPVC_SLURM_HOSTS says) on this machine, each host
# in network, UTS and mount namespaces of its own on a private fabric bridge,
# everything else under one state directory (docs/slurm.md, "The local Slurm test cluster").
#
#   HPVC_SLURM_DIR         state directory (default /var/lib/hpvc/slurm)
#   HPVC_SLURM_HOSTS       how many hosts, 1 to 32 (default 3; `HOSTS=N make
#                          slurm-up` sets it); a running cluster keeps its count
#   HPVC_SLURM_PORT        slurmctld port; every slurmd uses the next (default 6917);
#                          also picks the fabric: 6917 -> bridge hpvcfab0, 10.250.0.0/24
#   HPVC_SLURM_FABRIC      bridge name, at most 11 characters (default hpvcfab<N>)
#   HPVC_SLURM_SUBNET      fabric subnet, A.B.C.0/24 (default 10.250.<N>.0/24)
#   HPVC_SLURM_HOST_STATE  hpvc's state directory on each host, %h = host name
#                          (default <dir>/hpvc/%h)
#   HPVC_SLURM_CPUS_PER_HOST  CPUs of its own per host (default: this
#                          machine's divided by the hosts, if that is at least
#                          2; else all hosts share every CPU)
#   HPVC_SLURM_RESIDENT    1 (default): a resident hpvc (`hpvc serve`) beside
#                          each slurmd and one for the submitting side; 0: none
#   HPVC_SITE_PREFIX       where scripts/slurm/install.sh put hpvc and the
#                          plugin for every user (default /opt/hpvc)
#   HPVC_PYTHON            the Python that builds the fabric (python -m
#                          hpvc.testbed; default: the checkout's .venv, else
#                          the site's)
#
# Idempotent: starts only what is not running. The last line of its output is
# the `export SLURM_CONF=...` that points srun/sbatch/sinfo at the cluster.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/slurm/common.sh
. "$here/common.sh"

die() { echo "slurm-up: $*" >&2; exit 1; }
bad() { echo "slurm-up: $*" >&2; exit 2; }  # bad input: nothing was changed
start=$(date +%s.%N)

[ "$(id -u)" = 0 ] || die "needs root (slurmd runs jobs as any user; namespaces, bridge)"
for b in munged slurmctld slurmd sinfo ip nsenter unshare; do
  command -v "$b" >/dev/null || die "$b not installed (run 'make setup')"
done
PY=$(testbed_python) || die "no Python with hpvc to build the fabric (run 'make setup', or set HPVC_PYTHON)"
case "$SLURM_DIR" in /*) ;; *) die "HPVC_SLURM_DIR must be an absolute path" ;; esac
[ ${#NODES[@]} -gt 0 ] ||
  bad "HOSTS=$HOST_COUNT: give a number of hosts from 1 to 32 (e.g. HOSTS=8 make slurm-up)"
made=$(sed -n 's/^HOSTS=//p' "$FABRIC_ENV" 2>/dev/null | head -n1 || true)
[ -z "$made" ] || [ "$made" = "$HOST_COUNT" ] ||
  bad "$SLURM_DIR holds a cluster of $made hosts, not $HOST_COUNT: run 'make slurm-down' first, or set HPVC_SLURM_DIR and HPVC_SLURM_PORT for a second cluster"
[ ${#FABRIC} -le 11 ] && [[ "$FABRIC" =~ ^[A-Za-z0-9_]+$ ]] ||
  die "HPVC_SLURM_FABRIC=$FABRIC: give at most 11 letters, digits or '_' (veths are <fabric>-ctl)"
[[ "$SUBNET" =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})\.0/24$ ]] &&
  [ "${BASH_REMATCH[1]}" -le 255 ] && [ "${BASH_REMATCH[2]}" -le 255 ] && [ "${BASH_REMATCH[3]}" -le 255 ] ||
  die "HPVC_SLURM_SUBNET=$SUBNET: give a /24 network, e.g. 10.250.7.0/24"
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

# ---- CPUs -------------------------------------------------------------------

# A CPU list (0-3,8) one CPU per line.
expand_cpus() {
  local r
  for r in ${1//,/ }; do
    case "$r" in *-*) seq "${r%-*}" "${r#*-}" ;; *) echo "$r" ;; esac
  done
}

# Sets HOST_CPUS (one comma list per node, empty when the hosts share every
# CPU), HOST_SPEC (per node, the machine's CPUs that are not its own),
# SLURM_CPUS (the CPUs each node declares) and CPU_NOTE (one line).
#
# A host with CPUs of its own runs its slurmd in a cpuset of them (its steps
# and tasks inherit it). Slurm numbers a node's CPUs over what hwloc shows
# slurmd, so host.sh lets hwloc show all of the machine's (HWLOC_ALLOW=all)
# and every node declares them all with the other hosts' CPUs as its
# CpuSpecList (reserved, never given to a job): the CPU ids Slurm gives a job
# (S_JOB_ALLOC_CORES, which the plugin passes to `hpvc node up --cpus`) are
# the machine's, and they are the host's own.
plan_cpus() {
  local cpus all k i j c list spec
  mapfile -t cpus < <(expand_cpus "$(awk '/^Cpus_allowed_list:/ {print $2}' /proc/self/status)")
  mapfile -t all < <(expand_cpus "$(cat /sys/devices/system/cpu/online)")
  local n=${#cpus[@]}
  k=${HPVC_SLURM_CPUS_PER_HOST:-$(( n / ${#NODES[@]} ))}
  [[ "$k" =~ ^[0-9]+$ ]] || die "HPVC_SLURM_CPUS_PER_HOST=$k: give a number of CPUs"
  [ -n "${HPVC_SLURM_CPUS_PER_HOST:-}" ] || [ "$k" -ge 2 ] || k=0
  HOST_CPUS=()
  HOST_SPEC=()
  if [ "$k" -gt 0 ] && [ ! -w "$CPUSET_ROOT/cpuset.cpus" ]; then
    CPU_NOTE="$n CPUs, but no cgroup v1 cpuset at $CPUSET_ROOT: the ${#NODES[@]} hosts share them"
    k=0
  fi
  if [ "$k" -eq 0 ]; then
    SLURM_CPUS=$n
    if [ -n "${CPU_NOTE:-}" ]; then
      :
    elif [ -n "${HPVC_SLURM_CPUS_PER_HOST:-}" ]; then
      CPU_NOTE="$n CPUs: the ${#NODES[@]} hosts share them (HPVC_SLURM_CPUS_PER_HOST=0)"
    else
      CPU_NOTE="$n CPUs, too few to give each of the ${#NODES[@]} hosts 2 of its own: they share them"
    fi
    return
  fi
  SLURM_CPUS=${#all[@]}
  CPU_NOTE="CPUs of each host (its slurmd's cpuset):"
  for i in "${!NODES[@]}"; do
    list=()
    # With more asked for than there are (HPVC_SLURM_CPUS_PER_HOST), hosts wrap around and overlap.
    for ((j = 0; j < k; j++)); do list+=("${cpus[$(( (i * k + j) % n ))]}"); done
    HOST_CPUS[$i]=$(IFS=,; echo "${list[*]}")
    spec=()
    for c in "${all[@]}"; do
      case ",${HOST_CPUS[$i]}," in *",$c,"*) ;; *) spec+=("$c") ;; esac
    done
    HOST_SPEC[$i]=$(IFS=,; echo "${spec[*]}")
    CPU_NOTE+=" ${NODES[$i]} ${HOST_CPUS[$i]};"
  done
  CPU_NOTE=${CPU_NOTE%;}
  [ $(( k * ${#NODES[@]} )) -le "$n" ] || CPU_NOTE+=" (overlapping: only $n CPUs)"
}

make_cpusets() {
  local i d=$CPUSET_ROOT/$FABRIC
  if [ ${#HOST_CPUS[@]} -eq 0 ]; then
    # One left by an earlier start that gave the hosts CPUs of their own.
    [ ! -d "$d" ] || rmdir "$d"/*/ "$d"
    return 0
  fi
  mkdir -p "$d"
  cat "$CPUSET_ROOT/cpuset.mems" >"$d/cpuset.mems"
  cat "$CPUSET_ROOT/cpuset.cpus" >"$d/cpuset.cpus"
  for i in "${!NODES[@]}"; do
    mkdir -p "$d/${NODES[$i]}"
    cat "$d/cpuset.mems" >"$d/${NODES[$i]}/cpuset.mems"
    echo "${HOST_CPUS[$i]}" >"$d/${NODES[$i]}/cpuset.cpus"
  done
}

# ---- the fabric -------------------------------------------------------------

# Whether the bridge, every host's namespace and its veth are there.
fabric_intact() {
  local h
  ip link show dev "$FABRIC" >/dev/null 2>&1 || return 1
  for h in "$CTL" "${NODES[@]}"; do
    [ -e "$(netns_path "$h")" ] && ip link show dev "$(netns_name "$h")" >/dev/null 2>&1 || return 1
  done
}

# The bridge (root namespace, .254) and, per host, a network namespace whose
# end of a veth pair ($FAB_IF) has the host's address; lo up; no IPv6. hpvc's
# own builder makes them (python -m hpvc.testbed fabric: hpvc.testbed.fabric,
# journaled in $FABRIC_JOURNAL); it first undoes what the journal still holds,
# so a fabric half gone (a reboot) is made anew. Run only when no daemon of
# the cluster runs; a fabric that is all there is kept.
make_fabric() {
  local h ports=()
  fabric_intact && return 0
  for h in "$CTL" "${NODES[@]}"; do ports+=(--port "$(netns_name "$h")" "$(host_addr "$h")"); done
  "$PY" -m hpvc.testbed fabric --journal "$FABRIC_JOURNAL" --bridge "$FABRIC" \
    --address "$(host_addr root)/24" --mtu "$FAB_MTU" "${ports[@]}" ||
    die "could not make the fabric $FABRIC ('make slurm-down' removes what was made)"
  for h in "$CTL" "${NODES[@]}"; do  # interfaces made later in a host too (IPv6 noise)
    nsenter --net="$(netns_path "$h")" sh -c \
      'for f in all default; do echo 1 >/proc/sys/net/ipv6/conf/$f/disable_ipv6; done 2>/dev/null || true'
  done
}

# Refuse names or a subnet someone else on this machine uses (another test
# cluster with the same derived names, or a real network).
check_fabric_free() {
  local h
  if ip link show dev "$FABRIC" >/dev/null 2>&1; then
    die "a network interface $FABRIC exists already (another test cluster, or one whose directory was removed by hand: 'ip link del $FABRIC'): set HPVC_SLURM_PORT or HPVC_SLURM_FABRIC to another value"
  fi
  for h in "$CTL" "${NODES[@]}"; do
    [ ! -e "$(netns_path "$h")" ] ||
      die "network namespace $(netns_name "$h") exists already (another test cluster, or one whose directory was removed by hand: 'ip netns del $(netns_name "$h")'): set HPVC_SLURM_PORT or HPVC_SLURM_FABRIC"
  done
  if ip -o -4 addr show | awk '{print $4}' | grep -q "^${NET3//./\\.}\."; then
    die "an address in $SUBNET is in use on this machine: set HPVC_SLURM_SUBNET or HPVC_SLURM_PORT"
  fi
}

# What down.sh removes, written before anything is made.
write_fabric_env() {
  local h
  {
    echo "FABRIC=$FABRIC"
    echo "SUBNET=$SUBNET"
    echo "HOSTS=${#NODES[@]}"
    for h in "$CTL" "${NODES[@]}"; do echo "NETNS=$(netns_name "$h")"; done
    echo "CPU_NOTE=$CPU_NOTE"
  } >"$FABRIC_ENV"
}

fabric_env() { sed -n "s/^$1=//p" "$FABRIC_ENV" 2>/dev/null | head -n1; }

# ---- configuration ----------------------------------------------------------

# Each host declares a third of this machine's memory (at most 16 GiB); a job
# that does not say --mem gets DEF_MEM MiB on each of its hosts.
plan_memory() {
  local total
  total=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
  HOST_MEM=$(( total / ${#NODES[@]} ))
  [ "$HOST_MEM" -le 16384 ] || HOST_MEM=16384
  DEF_MEM=$(( HOST_MEM < 1024 ? HOST_MEM : 1024 ))
}

write_conf() {
  local i n
  plan_memory
  cat >"$CONF" <<CONF
# Local Slurm test cluster made by scripts/slurm/up.sh (docs/slurm.md).
# Do not edit: 'make slurm-down' removes this directory.
ClusterName=$CLUSTER_NAME
# slurmctld runs in its own network namespace on the fabric ($SUBNET).
SlurmctldHost=$CTL($(host_addr "$CTL"))
SlurmctldPort=$BASE_PORT
SlurmdPort=$((BASE_PORT + 1))
SlurmUser=root
SlurmdUser=root
# Our own munged, never the system one.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
# CommunicationParameters is left unset: slurmctld and every slurmd bind to
# INADDR_ANY of a network namespace that holds only lo and its fabric address,
# so nothing listens on this machine's real interfaces. NoInAddrAny would make
# srun, run in the root namespace, bind to the address this machine's hostname
# resolves to, which the hosts cannot reach: srun must listen on INADDR_ANY so
# that slurmd and slurmstepd reach its callbacks at the root's fabric address
# ($(host_addr root)), the source address of its requests.
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool/%n
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURM_DIR/run/slurmd-%n.pid
SlurmctldLogFile=$SLURM_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$SLURM_DIR/plugstack.conf
# No cgroup plugin: nothing here changes the host's cgroup tree (a host's
# CPUs, when it has its own, come from the cpuset its slurmd runs in).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
# Memory is allocated like CPUs: hpvc caps each job's virtual nodes on a host
# at what Slurm gave the job there (S_JOB_ALLOC_MEM); --mem asks for more.
SelectTypeParameters=CR_Core_Memory
DefMemPerNode=$DEF_MEM
MpiDefault=none
# Per-node TmpFS (common.sh, TMPFS_DIR): the hosts share this machine's /tmp.
TmpFS=$TMPFS_DIR/%n
SwitchType=switch/none
ReturnToService=2
KillWait=5
MinJobAge=60
# Job ids apart from those of other test clusters on this machine: the cgroups
# hpvc makes for a job's share (/hpvc/j<job>-<host index>) are the machine's,
# not a host's, and two clusters' job 6 would share them.
FirstJobId=$((FAB_ID * 100000 + 1))
CONF
  for i in "${!NODES[@]}"; do
    n=${NODES[$i]}
    echo "NodeName=$n NodeHostname=$n NodeAddr=$(host_addr "$n") CPUs=$SLURM_CPUS${HOST_SPEC[$i]:+ CpuSpecList=${HOST_SPEC[$i]}} RealMemory=$HOST_MEM State=UNKNOWN" >>"$CONF"
  done
  echo "PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP" >>"$CONF"
  # Each host's /etc/hosts (host.sh binds it there): the fabric's names.
  {
    echo "127.0.0.1 localhost"
    for i in "$CTL" "${NODES[@]}"; do echo "$(host_addr "$i") $i"; done
  } >"$SLURM_DIR/etc-hosts"
}

# hpvc's SPANK plugin (srun --hpvc=SPEC, docs/slurm.md) when it is installed
# (scripts/slurm/install.sh, into HPVC_SITE_PREFIX, where every user can run
# it): HPVC_SPANK_SO names the .so, HPVC_BIN the hpvc command it runs, and
# HPVC_SPANK_ARGS extra plugstack arguments (site policy). Every host has its
# own hpvc state directory (HOST_STATE, %h = its hostname); the image store is
# shared: the one hpvc uses here (HPVC_IMAGE_DIR, else <HPVC_STATE_DIR>/images).
write_plugstack() {
  local so=${HPVC_SPANK_SO:-$SITE_PREFIX/lib/hpvc_spank.so}
  local bin=${HPVC_BIN:-$SITE_PREFIX/venv/bin/hpvc}
  local images=${HPVC_IMAGE_DIR:-${HPVC_STATE_DIR:-/var/lib/hpvc}/images}
  {
    echo "# SPANK plugins of the hpvc test cluster (written by scripts/slurm/up.sh)"
    if [ -e "$so" ]; then
      # threads_as_cores: the nodes are declared by CPUs= alone, so Slurm counts
      # every hardware thread as a core (hpvc.slurm.cpus maps its numbers).
      echo "required $(realpath "$so") hpvc=$(realpath "$bin") state_dir=$HOST_STATE image_dir=$images threads_as_cores=yes ${HPVC_SPANK_ARGS:-}"
    else
      echo "# $so is not installed: 'make slurm-up' (scripts/slurm/install.sh) adds srun --hpvc"
    fi
  } >"$SLURM_DIR/plugstack.conf"
}

# ---- start ------------------------------------------------------------------

already=0
started=()  # "PID:what" of the daemons started here, to fail fast if one exits
if running; then
  already=1
  CPU_NOTE=$(fabric_env CPU_NOTE)
else
  if ! any_running; then
    if [ -e "$FABRIC_ENV" ]; then
      # A cluster of this directory was started before (and stopped or died):
      # its fabric must be the one asked for now.
      [ "$(fabric_env FABRIC)" = "$FABRIC" ] && [ "$(fabric_env SUBNET)" = "$SUBNET" ] ||
        die "$SLURM_DIR was made with fabric $(fabric_env FABRIC) $(fabric_env SUBNET): run 'make slurm-down' first"
    else
      check_fabric_free
      mkdir -p "$SLURM_DIR"
      chmod 755 "$SLURM_DIR"
    fi
    plan_cpus
    write_fabric_env
    mkdir -p "$SLURM_DIR"/{state,run,log,munge,spool}
    chmod 700 "$SLURM_DIR/munge"
    for n in "${NODES[@]}"; do mkdir -p "$SLURM_DIR/spool/$n" "$TMPFS_DIR/$n"; done
    # Every user's steps make their PMIx directories in TmpFS, as in /tmp.
    chmod 755 "$TMPFS_DIR"
    chmod 1777 "$TMPFS_DIR"/*
    make_cpusets
    write_conf
    write_plugstack
    make_fabric
  else
    CPU_NOTE=$(fabric_env CPU_NOTE)
  fi

  if [ ! -s "$MUNGE_KEY" ]; then
    (umask 077; dd if=/dev/urandom of="$MUNGE_KEY" bs=1024 count=1 status=none)
  fi
  chmod 400 "$MUNGE_KEY"
  # hpvc's site key for VM agents (docs/slurm.md, "Who may use a guest's agent"):
  # one file, in every host's state folder, handed out as munge's key is.
  AGENT_SITE_KEY=$SLURM_DIR/munge/hpvc-agent-site.key
  if [ ! -s "$AGENT_SITE_KEY" ]; then
    (umask 077; head -c 32 /dev/urandom >"$AGENT_SITE_KEY")
  fi
  for n in "${NODES[@]}"; do
    d=$(host_state "$n")
    (umask 077; mkdir -p "$d")
    install -m 600 "$AGENT_SITE_KEY" "$d/agent-site.key"
  done

  if ! ours_pid "$MUNGE_PID" munged >/dev/null; then
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE_KEY" --pid-file="$MUNGE_PID" \
      --log-file="$SLURM_DIR/log/munged.log" --seed-file="$SLURM_DIR/munge/munged.seed" \
      </dev/null || { log_tail; die "munged did not start"; }
  fi
  for _ in $(seq 50); do [ -S "$MUNGE_SOCKET" ] && break; sleep 0.1; done
  [ -S "$MUNGE_SOCKET" ] || { log_tail; die "munged socket $MUNGE_SOCKET did not appear"; }

  # -D keeps the daemons in the foreground; setsid detaches them from this
  # shell; host.sh enters the host's namespaces and execs the daemon, which
  # writes its own pid file (SlurmctldPidFile, SlurmdPidFile).
  if ! ours_pid "$CTLD_PID" slurmctld >/dev/null; then
    clear=1
    for n in "${NODES[@]}"; do ours_pid "$(slurmd_pid "$n")" slurmd >/dev/null && clear=; done
    HPVC_SLURM_CLEAR=$clear setsid bash "$here/host.sh" "$CTL" </dev/null >>"$SLURM_DIR/log/slurmctld.out" 2>&1 &
    started+=("$!:slurmctld")
  fi
  for n in "${NODES[@]}"; do
    if ! ours_pid "$(slurmd_pid "$n")" slurmd >/dev/null; then
      setsid bash "$here/host.sh" "$n" </dev/null >>"$SLURM_DIR/log/slurmd-$n.out" 2>&1 &
      started+=("$!:slurmd $n")
    fi
  done
fi

# Wait until every host is idle (each starts Python twice, node prepare and
# its resident hpvc, on CPUs the hosts may share: allow 2 s more per host).
deadline=$(( $(date +%s) + ${HPVC_SLURM_TIMEOUT:-$(( 30 + 2 * ${#NODES[@]} ))} ))
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
  sleep 0.1
done
# The submitting side's resident hpvc (the "login node" is this namespace):
# srun's `hpvc node check` starts from a warm fork of it, run as the user.
# Clients find it through HPVC_RESIDENT_SOCKET (printed below).
LOGIN_SOCK=$SLURM_DIR/run/hpvc-login.sock
login_bin=$(plugstack_arg hpvc)
if [ -n "$login_bin" ] && [ "${HPVC_SLURM_RESIDENT:-1}" = 1 ] &&
  ! ours_pid "$(serve_pid login)" hpvc >/dev/null; then
  setsid "$login_bin" serve --socket "$LOGIN_SOCK" </dev/null >>"$SLURM_DIR/log/hpvc-serve-login.log" 2>&1 &
  echo $! >"$(serve_pid login)"
  for _ in $(seq 100); do [ -S "$LOGIN_SOCK" ] && break; sleep 0.05; done
fi
echo "slurm-up: $CPU_NOTE"
where="hosts n1..${NODES[-1]} at $(host_addr n1)-${NODES[-1]#n} (netns $(netns_name 'n*')), slurmctld $(host_addr "$CTL"):$BASE_PORT, bridge $FABRIC $(host_addr root)/24, state in $SLURM_DIR"
if [ "$already" = 1 ]; then
  echo "slurm-up: already running: cluster $CLUSTER_NAME, $where"
else
  echo "slurm-up: cluster $CLUSTER_NAME up in $(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN{printf "%.1f", e-s}') s: $where"
fi
if [ -S "$LOGIN_SOCK" ]; then echo "export HPVC_RESIDENT_SOCKET=$LOGIN_SOCK"; fi
echo "export SLURM_CONF=$CONF"
