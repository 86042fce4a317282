#!/usr/bin/env bash
# Minimal reproduction (issue 28, docs/checkpoint.md "Containers"): can the
# host's CRIU dump and restore a process tree that lives in its own network
# namespace and holds a TCP connection established to another namespace?
# Two namespaces joined by a veth pair (10.251.77.0/24, inside namespaces this
# script makes), a counting echo server in B, a client in A; criu check, then
# criu dump --tcp-established of the client and criu restore of it. Prints
# each step's result and exits 0 only when the restored client goes on
# counting over the same connection. Cleans up everything it made, also on
# failure. Run as root.
set -u
A=hpvc-criu-a.$$ B=hpvc-criu-b.$$ VA=hcriu-a$$ VB=hcriu-b$$
work=$(mktemp -d /tmp/hpvc-criu-repro.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  [ -f "$work/restored.pid" ] && kill "$(cat "$work/restored.pid")" 2>/dev/null
  ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
echo "kernel: $(uname -r); $(criu --version | head -1)"
echo "== criu check"
criu check; echo "criu check exit: $?"
ip netns add "$A" && ip netns add "$B" || exit 1
ip link add "$VA" type veth peer name "$VB"
ip link set "$VA" netns "$A"; ip link set "$VB" netns "$B"
ip -n "$A" addr add 10.251.77.1/24 dev "$VA"; ip -n "$B" addr add 10.251.77.2/24 dev "$VB"
for n in "$A:$VA" "$B:$VB"; do ip -n "${n%%:*}" link set lo up; ip -n "${n%%:*}" link set "${n#*:}" up; done
nsenter --net=/run/netns/"$B" setsid python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.251.77.2", 7777)); s.listen(1); c, _ = s.accept()
while (d := c.recv(64)): c.sendall(d)
' </dev/null >"$work/server.log" 2>&1 &
pids+=($!)
sleep 0.5
nsenter --net=/run/netns/"$A" setsid python3 -u -c '
import socket, time
c = socket.create_connection(("10.251.77.2", 7777)); n = 0
while True:
    n += 1; c.sendall(b"%d\n" % n); assert int(c.recv(64)) == n
    print(n, flush=True); time.sleep(0.05)
' </dev/null >"$work/client.log" 2>&1 &
client=$!; pids+=("$client")
sleep 1
echo "client pid $client counted to $(tail -1 "$work/client.log")"
echo "== criu dump --tcp-established"
mkdir "$work/img"
nsenter --net=/run/netns/"$A" criu dump -t "$client" -D "$work/img" --tcp-established \
  -o dump.log -v4
rc=$?; echo "criu dump exit: $rc"
if [ "$rc" != 0 ]; then grep -E 'Error|Warn' "$work/img/dump.log" | head -5; exit 1; fi
echo "== criu restore --tcp-established"
nsenter --net=/run/netns/"$A" criu restore -D "$work/img" --tcp-established -d \
  --pidfile "$work/restored.pid" -o restore.log -v4
rc=$?; echo "criu restore exit: $rc"
if [ "$rc" != 0 ]; then grep -E 'Error' "$work/img/restore.log" | head -5; exit 1; fi
before=$(tail -1 "$work/client.log"); sleep 1; after=$(tail -1 "$work/client.log")
echo "restored client counted from $before to $after"
[ "$after" -gt "$before" ]
