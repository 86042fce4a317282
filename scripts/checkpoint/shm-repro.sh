#!/usr/bin/env bash
# Minimal reproduction (issue 28, docs/checkpoint.md "Containers", Limits):
# why hpvc cannot yet checkpoint container nodes with locality = "shm".
#
# The layout hpvc gives such nodes (hpvc.backends.crun.container.start_holder,
# render/oci.py _namespaces): one process (the holder) owns a PID and an IPC
# namespace; every co-resident node joins both, and has its own UTS namespace
# (its hostname), mount and network namespaces. A node's init is started by
# crun from outside the PID namespace, so its parent is outside; a job a user
# starts in a node (crun exec: setns + fork from outside) and leaves running
# in the background is re-parented to the PID namespace's init, the holder,
# not to its node's init. This script builds that layout with plain
# processes (no mount namespaces, no containers) and shows, step by step:
#   1. one dump of the whole shared PID namespace, from its init: CRIU refuses
#      the nodes' own UTS namespaces (only mount and network namespaces may be
#      nested under the dumped tree's root, CRIU 4.2 criu/namespaces.c
#      generate_ns_id);
#   2. per-node dumps: the node's init is not PID 1 of its namespace, CRIU
#      refuses it unless the PID namespace is named external
#      (--external pid[INODE]:KEY); with it the dump works and restores into a
#      re-created holder with the saved PID (--inherit-fd, --join-ns ipc);
#   3. but a job started in the node the way `hpvc exec` starts one is a child
#      of the holder, so it is in no node's tree: the node's dump leaves it out.
#      Dumping it as a tree of its own would carry its node's mount namespace a
#      second time; CRIU restores a mount namespace only with the tree that
#      holds it (criu/mount.c prepare_mnt_ns; --join-ns mnt only setns()es
#      before that rebuild: read in CRIU's source, not run by this script),
#      so a node split over two trees cannot come back as one node.
# Exits 0 when all three are seen as described. Cleans up what it started
# (by PID), also on failure. Run as root; needs CRIU 4.2 (scripts/setup-criu.sh).
set -u
work=$(mktemp -d /tmp/hpvc-shm-repro.XXXXXX)
pids="$work/pids"  # every PID started, one a line (functions run in subshells)
kids() { cat /proc/"$1"/task/*/children 2>/dev/null | tr ' ' '\n' | grep -v '^$'; }
cleanup() {
  [ -f "$pids" ] && while read -r p; do kill -9 "$p" 2>/dev/null; done <"$pids"
  [ -f "$work/restored.pid" ] && kill -9 "$(cat "$work/restored.pid")" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "UNEXPECTED: $*"; exit 1; }
errors() { grep 'Error (' "$1" | grep -v RLIMIT_NOFILE | sed 's/^([0-9. ]*) //' | head -3; }

holder() {  # a holder like hpvc's: PID + IPC namespaces, its init a session leader inside
  unshare --ipc --pid --fork --kill-child setsid sleep infinity </dev/null >/dev/null 2>&1 &
  local up=$!
  echo "$up" >>"$pids"
  sleep 0.3
  local init
  init=$(kids "$up" | head -1)
  [ -n "$init" ] || fail "no holder init"
  echo "$init" >>"$pids"
  echo "$init"
}
node() {  # a node's init in holder $1, own UTS namespace (hostname $2), started from outside
  nsenter -t "$1" --pid --ipc -- setsid unshare --uts sh -c \
    "hostname $2; exec sh -c 'while :; do sleep 1; done'" </dev/null >/dev/null 2>&1 &
  echo $! >>"$pids"
  sleep 0.3
  kids $! | head -1 | tee -a "$pids"
}

echo "kernel: $(uname -r); $(criu --version | head -1)"
H=$(holder)
A=$(node "$H" node-a)
B=$(node "$H" node-b)
[ -n "$A" ] && [ -n "$B" ] || fail "nodes did not start"
echo "holder init $H; node-a init $A (parent $(awk '/^PPid/{print $2}' /proc/"$A"/status)); node-b init $B"

echo "== 1. one dump of the shared PID namespace from its init (the nodes made its children)"
H1=$(holder)
for n in x y; do  # orphaned into H1: its init becomes their parent
  nsenter -t "$H1" --pid --ipc -- sh -c \
    "setsid unshare --uts sh -c 'hostname node-$n; exec sleep infinity' </dev/null >/dev/null 2>&1 &"
done
sleep 0.3
kids "$H1" >>"$pids"
echo "children of the holder's init: $(kids "$H1" | tr '\n' ' ')"
mkdir -p "$work/whole"
criu dump -t "$H1" -D "$work/whole" -o dump.log -v4 -R && fail "the whole-namespace dump passed"
errors "$work/whole/dump.log"
grep -q "Can't dump nested uts namespace" "$work/whole/dump.log" || fail "another error"

echo "== 2. node-a alone: without, then with its PID namespace named external"
mkdir -p "$work/a0" "$work/a"
criu dump -t "$A" -D "$work/a0" -o dump.log -v4 -R && fail "a non-init root dumped"
errors "$work/a0/dump.log"
ino=$(stat -L -c %i /proc/"$H"/ns/pid)
criu dump -t "$A" -D "$work/a" -o dump.log -v4 --external "pid[$ino]:shared-pid" ||
  { errors "$work/a/dump.log"; fail "dump with an external PID namespace"; }
echo "dumped node-a (its tasks: $(grep -c 'Seized task' "$work/a/dump.log")); it is gone now"
H2=$(holder)
exec 7</proc/"$H2"/ns/pid
criu restore -D "$work/a" -o restore.log -v4 -d --inherit-fd "fd[7]:shared-pid" \
  --join-ns ipc:/proc/"$H2"/ns/ipc --pidfile "$work/restored.pid" ||
  { errors "$work/a/restore.log"; fail "restore into a re-created holder"; }
exec 7<&-
R=$(cat "$work/restored.pid")
same=no
[ "$(readlink /proc/"$R"/ns/pid)" = "$(readlink /proc/"$H2"/ns/pid)" ] && same=yes
echo "restored node-a as $R: in the new holder's PID namespace: $same;" \
  "its PID there: $(awk '/^NSpid/{print $3}' /proc/"$R"/status); hostname: $(nsenter -t "$R" --uts hostname)"
[ "$same" = yes ] || fail "not in the new holder's namespace"

echo "== 3. a job started in node-b as crun exec starts one (setns + fork from outside, backgrounded)"
nsenter -t "$B" --pid --ipc --uts -- sh -c 'setsid sleep 1000 </dev/null >/dev/null 2>&1 &'
sleep 0.3
job=$(for k in $(kids "$H"); do [ "$(tr '\0' ' ' </proc/"$k"/cmdline)" = "sleep 1000 " ] && echo "$k"; done)
[ -n "$job" ] || fail "the job is not a child of the holder's init"
echo "$job" >>"$pids"
echo "the job $job ($(tr '\0' ' ' </proc/"$job"/cmdline)) has parent $(awk '/^PPid/{print $2}' /proc/"$job"/status)" \
  "= the holder's init $H, not node-b's init $B; hostname $(nsenter -t "$job" --uts hostname)"
mkdir -p "$work/b"
ino=$(stat -L -c %i /proc/"$H"/ns/pid)
criu dump -t "$B" -D "$work/b" -o dump.log -v4 -R --external "pid[$ino]:shared-pid" ||
  { errors "$work/b/dump.log"; fail "dump of node-b"; }
grep -q "Seized task $job" "$work/b/dump.log" && fail "the job was in node-b's dump"
echo "node-b's dump holds $(grep -c 'Seized task' "$work/b/dump.log") task(s), not the job $job"
echo "RESULT: as described (1: nested UTS refused; 2: per-node dump works; 3: the job is outside it)"
