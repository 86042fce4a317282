"""Podman's ``container checkpoint`` / ``container restore`` of the same containers.

The peer of ``hpvc bench checkpoint``'s container clusters: as many Podman
containers as the cluster has nodes, from the same image (hpvc's ``hpc``
rootfs imported by ``bench.startup.podman.session``), each limited to the
node's memory, on an internal bridge network, running the same job
(``job.py``: memory held, the ping-pong between the first two). Podman needs
an OCI runtime with CRIU: Debian's crun 1.8 has none ("configured runtime
does not support checkpoint/restore"), so these containers run under runc
(Debian's 1.1.5), which calls the same CRIU as hpvc (scripts/setup-criu.sh).

Timed as a user types it: ``podman container checkpoint --tcp-established
C1 C2 ...`` (Podman saves the containers side by side, each CRIU freezing
its own container: no barrier across them, the failure mode of criu issue
448), the size of their checkpoint folders, then ``podman container restore
--tcp-established C1 C2 ...``. The job is checked after the restore as on
hpvc's side.
"""

from __future__ import annotations

import resource
import subprocess
import time
from pathlib import Path
from typing import Any

from hpvc.bench.checkpoint import job
from hpvc.bench.startup import podman
from hpvc.errors import HpvcError

RUNTIME = "runc"
TIMEOUT_S = 900


def _podman(*args: str) -> str:
    r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=TIMEOUT_S)
    if r.returncode != 0:
        last = (r.stderr or r.stdout).strip().splitlines()
        raise HpvcError(f"podman {args[0]} {args[1] if len(args) > 1 else ''}".strip(),
                        last[-1] if last else f"exit {r.returncode}")  # fmt: skip
    return r.stdout.strip()


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


class CheckpointPeer:
    """``n`` containers of ``memory_mib`` each, holding ``fill_mib`` and running the job."""

    def __init__(self, peer: podman.Peer, n: int, memory_mib: int, fill_mib: int) -> None:
        self.peer, self.n, self.memory_mib, self.fill_mib = peer, n, memory_mib, fill_mib
        self.names = [f"{peer.prefix}-ck{i}" for i in range(n)]

    def _run(self, name: str, code: str) -> None:
        nofile = "{}:{}".format(*resource.getrlimit(resource.RLIMIT_NOFILE))
        _podman("run", "-d", "-q", "--runtime", RUNTIME, "--name", name,
                "--label", f"hpvc-bench={self.peer.prefix}", "--network", self.peer.network,
                "--cpus", "1", "--cpuset-cpus", self.peer.cpus,
                "--memory", f"{self.memory_mib}m", "--ulimit", f"nofile={nofile}",
                "--ulimit", f"nproc={podman.NPROC}:{podman.NPROC}",
                self.peer.image, "python3", "-c", code)  # fmt: skip

    def ip(self, name: str) -> str:
        fmt = f'{{{{(index .NetworkSettings.Networks "{self.peer.network}").IPAddress}}}}'
        return _podman("inspect", "--format", fmt, name)

    def start(self) -> None:
        """Start the containers; wait until every one holds its memory and the count moves."""
        fill = job.FILL.format(mib=self.fill_mib, ready=f"{job.COUNT}.filled")
        hold = fill.replace("while True:\n    time.sleep(3600)\n", "")
        self._run(self.names[1], hold + job.SERVER.format(port=job.PORT))
        server = self.ip(self.names[1])
        client = job.CLIENT.format(server=server, port=job.PORT, every=job.EVERY, count=job.COUNT)
        self._run(self.names[0], hold + client)
        for name in self.names[2:]:
            self._run(name, fill)
        deadline = time.monotonic() + 600
        for name in self.names:
            while not self._exec(name, f"cat {job.COUNT}.filled 2>/dev/null || true"):
                if time.monotonic() > deadline:
                    raise HpvcError("bench checkpoint: podman", f"{name} did not fill its memory")
                time.sleep(1)
        self.goes_on()

    def _exec(self, name: str, script: str) -> str:
        r = subprocess.run(["podman", "exec", name, "sh", "-c", script],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
        return r.stdout.strip() if r.returncode == 0 else ""

    def count(self) -> int:
        out = self._exec(self.names[0], f"cat {job.COUNT} 2>/dev/null")
        return int(out) if out.isdigit() else 0

    def goes_on(self, within_s: float = 120) -> bool:
        before = self.count()
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            time.sleep(0.5)
            if self.count() > before:
                return True
        return False

    def checkpoint(self) -> tuple[float, int]:
        """Wall seconds of ``podman container checkpoint`` of every container, and
        the bytes of their checkpoint folders."""
        t0 = time.perf_counter()
        _podman("container", "checkpoint", "--tcp-established", *self.names)
        took = time.perf_counter() - t0
        return took, sum(_size(f) for f in self.folders())

    def folders(self) -> list[Path]:
        """Each container's checkpoint folder (Podman's own, in its storage)."""
        fmt = "{{.StaticDir}}"
        return [Path(_podman("inspect", "--format", fmt, n)) / "checkpoint" for n in self.names]

    def restore(self) -> float:
        t0 = time.perf_counter()
        _podman("container", "restore", "--tcp-established", *self.names)
        return time.perf_counter() - t0

    def last_words(self) -> str:
        """The containers' last log line each, and their states (why a job stopped)."""
        out = []
        for name in self.names[:2]:
            r = subprocess.run(["podman", "logs", "--tail", "1", name],
                               capture_output=True, text=True, timeout=120)  # fmt: skip
            state = subprocess.run(["podman", "inspect", "--format", "{{.State.Status}}", name],
                                   capture_output=True, text=True, timeout=120)  # fmt: skip
            said = (r.stdout + r.stderr).strip().splitlines()
            out.append(f"{name} {state.stdout.strip()}: {said[-1] if said else '(no output)'}")
        return "; ".join(out)

    def remove(self) -> None:
        subprocess.run(["podman", "rm", "-f", "-t", "0", *self.names],
                       capture_output=True, text=True, timeout=TIMEOUT_S)  # fmt: skip

    def describe(self) -> dict[str, Any]:
        return {
            "tool": self.peer.version,
            "runtime": f"{RUNTIME} ({RUNTIME} --version: first line in host facts)",
            "image": f"{self.peer.image} (imported from hpvc's hpc rootfs)",
            "network": f"{self.peer.network}: internal bridge, {self.peer.subnet}",
            "timing": "podman container checkpoint --tcp-established C...; size of each"
            " container's checkpoint folder; podman container restore --tcp-established C...",
        }
