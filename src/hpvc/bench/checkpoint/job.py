"""The job inside the benchmark's guests: memory to save, and messages to lose.

Every node holds ``fill_mib`` MiB of non-zero memory in one process (a 1 MiB
random block repeated: QEMU's migration stream skips zero pages only, so the
checkpoint's size is the memory the job really uses). The first two nodes
also run a ping-pong over TCP on the cluster network: the client sends its
count, the server echoes it, the client checks each echo is the count it
sent and writes the count to ``COUNT`` every ``EVERY`` round trips. A
message lost or doubled across a checkpoint ends the client with an error in
``LOG``; a job that goes on keeps raising the count. Both are read over
``hpvc exec`` (``cluster.ops``) between the measured steps, never during.
"""

from __future__ import annotations

import shlex
import subprocess
import time

from hpvc.cluster import ops
from hpvc.errors import HpvcError
from hpvc.store import Store

PORT = 7311
EVERY = 20
COUNT = "/tmp/hpvc-bench-ckpt.count"
LOG = "/tmp/hpvc-bench-ckpt.log"
EXEC_TIMEOUT_S = 120

FILL = """
import os, time
hold = os.urandom(1 << 20) * {mib}
open("{ready}", "w").write("{mib}")
while True:
    time.sleep(3600)
"""

SERVER = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {port})); s.listen(1); c, _ = s.accept()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    d = c.recv(16)
    if not d:
        break
    c.sendall(d)
"""

CLIENT = """
import socket, time
for _ in range(300):
    try:
        c = socket.create_connection(("{server}", {port})); break
    except OSError:
        time.sleep(0.1)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
n = 0
while True:
    n += 1
    c.sendall(b"%015d\\n" % n)
    got = b""
    while len(got) < 16:
        d = c.recv(16 - len(got))
        if not d:
            raise SystemExit("connection closed at %d" % n)
        got += d
    if int(got) != n:
        raise SystemExit("sent %d, echo %d" % (n, int(got)))
    if n % {every} == 0:
        open("{count}.new", "w").write(str(n)); __import__("os").rename("{count}.new", "{count}")
"""


def _background(code: str, log: str) -> list[str]:
    """A shell line that starts ``python3 -c code`` detached from the exec session."""
    line = f"setsid python3 -c {shlex.quote(code)} </dev/null >>{log} 2>&1 &"
    return ["sh", "-c", line]


def _exec(name: str, node: str, argv: list[str], store: Store) -> str:
    r = subprocess.run(
        ops.exec_argv(name, node, argv, store),
        capture_output=True,
        text=True,
        check=False,
        timeout=EXEC_TIMEOUT_S,
    )
    if r.returncode != 0:
        lines = (r.stderr or r.stdout).strip().splitlines()
        raise HpvcError(f"bench checkpoint: node {node}", lines[-1] if lines else "exec failed")
    return r.stdout


def start(name: str, nodes: list[tuple[str, str]], fill_mib: int, store: Store) -> None:
    """Start the job in ``nodes`` ((name, address), the ping-pong between the
    first two) and wait until every node holds its memory and the count moves."""
    for node, _ in nodes:
        code = FILL.format(mib=fill_mib, ready=f"{COUNT}.filled")
        _exec(name, node, _background(code, LOG), store)
    if len(nodes) >= 2:
        (server, _), (client, _) = nodes[1], nodes[0]
        _exec(name, server, _background(SERVER.format(port=PORT), LOG), store)
        code = CLIENT.format(server=nodes[1][1], port=PORT, every=EVERY, count=COUNT)
        _exec(name, client, _background(code, LOG), store)
    deadline = time.monotonic() + 600
    for node, _ in nodes:
        while not _exec(name, node, ["sh", "-c", f"cat {COUNT}.filled 2>/dev/null || true"], store):
            if time.monotonic() > deadline:
                raise HpvcError("bench checkpoint", f"node {node} did not fill its memory")
            time.sleep(1)
    if len(nodes) >= 2:
        goes_on(name, nodes[0][0], store)


def count(name: str, node: str, store: Store) -> int:
    """The client's last count (0 before the first); raises with the job's log
    when the client stopped with an error."""
    script = f"cat {COUNT} 2>/dev/null; echo; cat {LOG} 2>/dev/null || true"
    out = _exec(name, node, ["sh", "-c", script], store)
    first, _, log = out.partition("\n")
    if "connection closed" in log or "sent " in log or "Error" in log:
        last = [x for x in log.strip().splitlines() if x.strip()]
        raise HpvcError("bench checkpoint: the job", last[-1] if last else "stopped")
    return int(first) if first.strip().isdigit() else 0


def goes_on(name: str, node: str, store: Store, within_s: float = 120) -> tuple[int, int]:
    """Wait until the ping-pong's count rises; (before, after). Raises when it
    does not within ``within_s`` or the job reported an error."""
    before = count(name, node, store)
    deadline = time.monotonic() + within_s
    while True:
        time.sleep(0.5)
        after = count(name, node, store)
        if after > before:
            return before, after
        if time.monotonic() > deadline:
            raise HpvcError(
                "bench checkpoint: the job", f"its count stayed at {after} for {within_s:.0f} s"
            )
