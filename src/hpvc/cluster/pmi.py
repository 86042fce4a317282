"""``hpvc run`` of an MPICH image over co-resident container nodes: hpvc serves PMI.

MPICH decides which ranks share a host, and so which talk through shared
memory, from the ``PMI_process_mapping`` its process manager gives
(MPICH 4.0.2 ``src/util/mpir_pmi.c``: ``build_nodemap_pmi1``; the hostname
exchange only where the manager has no mapping). The image's hydra
(``hpvc.cluster.hydra``) cannot say that two container nodes share a host:
it builds the mapping with one node per proxy (``pmiserv_utils.c``:
``pmi_process_mapping``, a block per proxy's ``node_id``), it merges hosts
only where the host list names one twice in a row (``HYDU_add_to_node_list``),
and then one proxy forks every rank of them in one container; no MPIR_CVAR
makes two nodes one (``MPIR_CVAR_NOLOCAL`` and ``MPIR_CVAR_NUM_CLIQUES`` only
split). So where co-resident nodes share memory (``tuning.locality = "shm"``:
one IPC and PID namespace, one ``/dev/shm``), hpvc is the process manager:
it starts each rank in its node itself (the backend's rank script, as for
Open MPI) and answers the ranks' PMI-1 over TCP on the cluster bridge, giving
the nodes of one host one node in ``PMI_process_mapping``. Debian ships no
PMI-1 server a program can run for processes it starts in other namespaces
(hydra's is inside its proxy, which forks the ranks itself; Slurm's inside
slurmstepd; PMIx is another protocol), and the protocol is small: text lines
``cmd=NAME key=value ...`` (MPICH's ``src/pmi/simple/simple_pmi.c`` is the
client). Nodes that share no memory keep the image's hydra.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from hpvc.backends.base import MpiLaunch
from hpvc.cluster.hydra import end_process
from hpvc.plan import PlannedNode

MAXES = "kvsname_max=256 keylen_max=64 vallen_max=1024"  # hydra's (pmiserv/common.h)


def process_mapping(layout: list[tuple[PlannedNode, int]]) -> str:
    """``(vector,(0,1,2))``: MPICH's node of each rank, in rank order; the nodes
    on one host are one node (ids in order of first appearance)."""
    ids: dict[str, int] = {}
    blocks: list[tuple[int, int]] = []  # (node id, ranks), adjacent ones of a host merged
    for node, count in layout:
        nid = ids.setdefault(node.host, len(ids))
        if blocks and blocks[-1][0] == nid:
            blocks[-1] = (nid, blocks[-1][1] + count)
        else:
            blocks.append((nid, count))
    return "(vector," + ",".join(f"({nid},1,{c})" for nid, c in blocks) + ")"


def parse(line: str) -> dict[str, str]:
    """``cmd=put kvsname=k key=a value=b`` -> its fields (values have no spaces)."""
    out: dict[str, str] = {}
    for word in line.split():
        key, _, value = word.partition("=")
        out[key] = value
    return out


class Server:
    """One job's PMI-1 key-value space and barrier, on a TCP port."""

    def __init__(
        self, address: str, size: int, mapping: str, peers: frozenset[str] = frozenset()
    ) -> None:
        self.size = size
        # Where ranks may connect from: the nodes' own addresses. The bridge's
        # address is one any user of the host can connect to, with the host's
        # address on the bridge as the source, never a node's (those live in the
        # nodes' network namespaces): a stranger's connection is closed unread.
        self.peers = peers
        self.kvsname = f"hpvc_{os.getpid()}"
        self.kvs = {"PMI_process_mapping": mapping}
        self.abort: int | None = None  # a rank's cmd=abort exit code
        self._cond = threading.Condition()
        self._arrived = 0
        self._epoch = 0
        self._sock = socket.create_server((address, 0), backlog=max(size, 16))
        self.port: int = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        with self._cond:
            self._epoch += 1  # release anyone left in a barrier
            self._cond.notify_all()
        self._sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, (host, *_) = self._sock.accept()
            except OSError:
                return  # closed
            if self.peers and host not in self.peers:
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("r", encoding="ascii", errors="replace") as lines:
            for line in lines:
                msg = parse(line)
                if "mcmd" in msg:  # spawn: its lines up to endcmd; hpvc spawns nothing
                    for more in lines:
                        if more.strip() == "endcmd":
                            break
                    msg = {"cmd": "spawn"}
                reply = self.answer(msg)
                if reply is None:
                    return
                try:
                    conn.sendall(reply.encode())
                except OSError:
                    return
                if msg.get("cmd") == "finalize":
                    return

    def answer(self, msg: dict[str, str]) -> str | None:
        """The reply to one command (None: stop serving this rank)."""
        cmd = msg.get("cmd", "")
        if cmd == "init":
            return "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n"
        if cmd == "initack":  # PMI_ID given: rank and size over the socket
            rank = msg.get("pmiid", "0")
            return f"cmd=initack\ncmd=set size={self.size}\ncmd=set rank={rank}\ncmd=set debug=0\n"
        if cmd == "get_maxes":
            return f"cmd=maxes {MAXES}\n"
        if cmd == "get_appnum":
            return "cmd=appnum appnum=0\n"
        if cmd == "get_universe_size":
            return f"cmd=universe_size size={self.size}\n"
        if cmd == "get_my_kvsname":
            return f"cmd=my_kvsname kvsname={self.kvsname}\n"
        if cmd == "put":
            with self._cond:
                self.kvs[msg.get("key", "")] = msg.get("value", "")
            return "cmd=put_result rc=0 msg=success\n"
        if cmd == "get":
            key = msg.get("key", "")
            with self._cond:
                value = self.kvs.get(key)
            if value is None:
                return f"cmd=get_result rc=-1 msg=key_{key}_not_found value=unknown\n"
            return f"cmd=get_result rc=0 msg=success value={value}\n"
        if cmd == "barrier_in":
            self._barrier()
            return "cmd=barrier_out\n"
        if cmd == "finalize":
            return "cmd=finalize_ack\n"
        if cmd == "abort":
            with self._cond:
                self.abort = int(msg.get("exitcode", "1") or 1)
            return None
        return f"cmd={cmd}_result rc=-1 msg=not_supported_by_hpvc\n"

    def _barrier(self) -> None:
        """Wait until every rank of the job has entered (PMI-1's barrier is global)."""
        with self._cond:
            epoch = self._epoch
            self._arrived += 1
            if self._arrived == self.size:
                self._arrived = 0
                self._epoch += 1
                self._cond.notify_all()
            else:
                self._cond.wait_for(lambda: self._epoch != epoch)


@contextmanager
def _outputs(capture: bool) -> Iterator[tuple[IO[Any] | None, IO[Any] | None]]:
    """Where the ranks write: the caller's stdout and stderr, or two files they share."""
    if not capture:
        yield None, None
        return
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        yield out, err


def run(
    launch: MpiLaunch,
    folder: Path,
    layout: list[tuple[PlannedNode, int]],
    argv: list[str],
    address: str,
    capture: bool = False,
) -> int | subprocess.CompletedProcess[str]:
    """Run the job, ``layout``'s ranks in node order, each through ``launch``'s rank
    script (written into ``folder`` with its ranks file), PMI served on ``address``
    (the cluster bridge's); its exit code (with ``capture``, stdout and stderr)."""
    targets = [launch.targets[node.name] for node, count in layout for _ in range(count)]
    (folder / "ranks").write_text("".join(t + "\n" for t in targets))
    script = folder / "rankexec"
    script.write_text(launch.script)
    script.chmod(0o755)
    size = len(targets)
    server = Server(address, size, process_mapping(layout), frozenset(n.ip for n, _ in layout))
    procs: list[subprocess.Popen[bytes]] = []
    with _outputs(capture) as (out, err):
        try:
            for rank in range(size):
                rank_env = {
                    **os.environ,
                    **launch.env,
                    # the rank script finds the rank's node by this (MpiLaunch)
                    "OMPI_COMM_WORLD_RANK": str(rank),
                    "PMI_PORT": f"{address}:{server.port}",
                    "PMI_RANK": str(rank),
                    "PMI_SIZE": str(size),
                }
                procs.append(
                    subprocess.Popen(
                        [str(script), *argv],
                        env=rank_env,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=err,
                    )
                )
            rc = _wait(procs, server)
        finally:
            for p in procs:
                end_process(p, 0)
            server.close()
        if out is None or err is None:
            return rc
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, rc, out.read(), err.read())


def _wait(procs: list[subprocess.Popen[bytes]], server: Server) -> int:
    """Until every rank has ended, or one failed or aborted (the rest are then
    ended by the caller): the job's exit code."""
    while True:
        if server.abort is not None:
            return server.abort
        codes = [p.poll() for p in procs]
        failed = next((c for c in codes if c not in (None, 0)), None)
        if failed is not None:
            return failed
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.05)
