"""Podman as the peer of ``hpvc bench startup``: N containers started and removed.

The image is imported once per run from hpvc's own ``hpc`` rootfs
(``tar -C ROOTFS -c . | podman import``), so both sides start the same files.
Every container gets what an hpvc node of the startup benchmark gets: 1 CPU
floating over the host's CPUs (``--cpus 1 --cpuset-cpus`` all of them), 128
MiB (``--memory 128m``), no hugepages, crun as the runtime, an idle process
(``sleep infinity``), one address on a bridge network. The network is
created for the run (``--internal``, a /24 from 10.231.0.0/16 that nothing
else uses; never Podman's default 10.88.0.0/16). Three timed steps, each a
wall clock around what a user would type:

- ``parallel``: N ``podman run -d`` started at once, until the last returns;
- ``sequential``: the same N, one after the other;
- ``rm``: one ``podman rm -f -t 0`` of the N (``-t 0``: kill at once, as
  ``hpvc down`` does; ``sleep`` as PID 1 ignores SIGTERM, so the default
  would wait 10 s for nothing).

``session`` removes every container, the network (and with it its bridge)
and the image at the end, also when the run fails, and checks that none is
left. Podman is a peer tool here, like iperf3 in ``bench.network``: it is
run through ``subprocess`` and touches nothing of hpvc's.
"""

from __future__ import annotations

import ipaddress
import os
import resource
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpvc.bench import common
from hpvc.errors import HpvcError
from hpvc.image import resolve_image
from hpvc.progress import Progress, quiet

TOOLS = ["podman", "crun", "tar"]
SUBNET_POOL = ipaddress.IPv4Network("10.231.0.0/16")
MEMORY = "128m"
COMMAND = ["sleep", "infinity"]
NPROC = 4096  # podman's default RLIMIT_NPROC (1048576) is refused without CAP_SYS_RESOURCE
MODES = ("parallel", "sequential")
TIMEOUT_S = 120


def available() -> bool:
    return shutil.which("podman") is not None


def preflight() -> None:
    common.require("bench startup --peer podman", TOOLS)


def _podman(*args: str, check: bool = True, stdin: Any = None) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        ["podman", *args],
        capture_output=True,
        text=True,
        check=False,
        stdin=stdin,
        timeout=TIMEOUT_S,
    )
    if check and r.returncode != 0:
        last = (r.stderr or r.stdout).strip().splitlines()
        raise HpvcError(f"podman {args[0]}", last[-1] if last else f"exit {r.returncode}")
    return r


def _podman_subnets() -> list[ipaddress.IPv4Network]:
    """Subnets of the networks Podman already knows (not all of them are up)."""
    names = _podman("network", "ls", "-q", check=False).stdout.split()
    out: list[ipaddress.IPv4Network] = []
    for name in names:
        fmt = "{{range .Subnets}}{{.Subnet}} {{end}}"
        r = _podman("network", "inspect", "--format", fmt, name, check=False)
        for word in r.stdout.split():
            try:
                out.append(ipaddress.IPv4Network(word, strict=False))
            except ValueError:
                continue  # an IPv6 subnet
    return out


def free_subnet() -> str:
    used = _podman_subnets()
    return common.free_subnets(1, SUBNET_POOL, extra_used=used)[0]


@dataclass
class Peer:
    """One run's image, network and containers (all named after ``prefix``)."""

    prefix: str
    image: str
    network: str
    subnet: str
    cpus: str
    version: str
    bridge: str = ""

    def run_argv(self, name: str) -> list[str]:
        nofile = "{}:{}".format(*resource.getrlimit(resource.RLIMIT_NOFILE))
        return [
            "podman",
            "run",
            "-d",
            "-q",
            "--runtime",
            "crun",
            "--name",
            name,
            "--label",
            f"hpvc-bench={self.prefix}",
            "--network",
            self.network,
            "--cpus",
            "1",
            "--cpuset-cpus",
            self.cpus,
            "--memory",
            MEMORY,
            "--ulimit",
            f"nofile={nofile}",
            "--ulimit",
            f"nproc={NPROC}:{NPROC}",
            self.image,
            *COMMAND,
        ]

    def names(self, n: int, mode: str) -> list[str]:
        return [f"{self.prefix}-{mode[0]}{i}" for i in range(n)]

    def start(self, n: int, mode: str) -> float:
        """Start ``n`` containers (``parallel`` or ``sequential``); the wall clock."""
        argvs = [self.run_argv(name) for name in self.names(n, mode)]
        failed: list[str] = []
        t0 = time.perf_counter()
        if mode == "parallel":
            procs = [
                subprocess.Popen(a, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                for a in argvs
            ]
            for p in procs:
                _, err = p.communicate(timeout=TIMEOUT_S)
                if p.returncode != 0:
                    failed.append(err.strip())
        else:
            for a in argvs:
                r = subprocess.run(a, capture_output=True, text=True, timeout=TIMEOUT_S)
                if r.returncode != 0:
                    failed.append(r.stderr.strip())
        took = time.perf_counter() - t0
        if failed:
            lines = failed[0].splitlines()
            raise HpvcError(f"podman run ({mode})", lines[-1] if lines else "failed")
        return took

    def remove(self, n: int, mode: str) -> float:
        """``podman rm -f -t 0`` of the ``n`` containers; the wall clock."""
        t0 = time.perf_counter()
        _podman("rm", "-f", "-t", "0", *self.names(n, mode))
        return time.perf_counter() - t0

    def cycle(self, n: int, mode: str) -> dict[str, float]:
        start_s = self.start(n, mode)
        return {"start_s": start_s, "rm_s": self.remove(n, mode)}

    def describe(self) -> dict[str, Any]:
        return {
            "tool": "podman",
            "version": self.version,
            "runtime": "crun",
            "network_backend": _podman(
                "info", "--format", "{{.Host.NetworkBackend}}", check=False
            ).stdout.strip(),
            "image": f"{self.image} (imported from hpvc's hpc rootfs)",
            "network": f"{self.network}: --internal bridge {self.bridge}, {self.subnet}",
            "limits": f"--cpus 1 --cpuset-cpus {self.cpus} --memory {MEMORY}, no hugepages",
            "command": " ".join(COMMAND),
            "timing": "parallel: N `podman run -d` started at once, until the last returns;"
            " sequential: one after the other; rm: one `podman rm -f -t 0` of the N",
        }


def leftovers(prefix: str) -> list[str]:
    """Containers, networks and images of a run named ``prefix`` still there."""
    found: list[str] = []
    label = f"label=hpvc-bench={prefix}"
    ps = _podman("ps", "-a", "--format", "{{.Names}}", "--filter", label, check=False)
    found += [f"container {c}" for c in ps.stdout.split()]
    nets = _podman("network", "ls", "--format", "{{.Name}}", check=False).stdout.split()
    found += [f"network {n}" for n in nets if n == prefix]
    imgs = _podman("images", "--format", "{{.Repository}}", check=False).stdout.split()
    found += [f"image {i}" for i in imgs if i.endswith(f"/{prefix}")]
    return found


def _cleanup(prefix: str, image: str, progress: Progress) -> list[str]:
    errors: list[str] = []
    ps = _podman("ps", "-aq", "--filter", f"label=hpvc-bench={prefix}", check=False)
    steps = [
        ["rm", "-f", "-t", "0", *ps.stdout.split()] if ps.stdout.split() else [],
        ["network", "rm", "-f", prefix],
        ["rmi", "-f", image],
    ]
    for args in (a for a in steps if a):
        r = _podman(*args, check=False)
        if r.returncode != 0 and "no such" not in r.stderr.lower():
            errors.append(f"podman {' '.join(args[:2])}: {r.stderr.strip()}")
    errors += [f"left behind: {x}" for x in leftovers(prefix)]
    for e in errors:
        progress(f"podman cleanup: {e}")
    return errors


@contextmanager
def session(progress: Progress = quiet) -> Iterator[Peer]:
    """Import the image and create the network; remove both (and every container) at the end."""
    preflight()
    prefix = f"hpvc-bench-{os.getpid()}"
    image = f"localhost/hpvc-bench/{prefix}:latest"
    failed = True
    try:
        rootfs = resolve_image("hpc").rootfs
        progress(f"podman: importing {rootfs} as {image}")
        _import(rootfs, image)
        subnet = free_subnet()
        _podman("network", "create", "--internal", "--subnet", subnet, prefix)
        bridge = _podman(
            "network", "inspect", "--format", "{{.NetworkInterface}}", prefix, check=False
        ).stdout.strip()
        cpus = f"0-{(os.cpu_count() or 1) - 1}"
        version = common.tool_version(["podman", "--version"])
        yield Peer(prefix, image, prefix, subnet, cpus, version, bridge)
        failed = False
    finally:
        errors = _cleanup(prefix, image, progress)
        if errors and not failed:
            raise HpvcError(
                "bench startup: podman cleanup", errors[0], "podman ps -a; podman images"
            )


def _import(rootfs: Path, image: str) -> None:
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    try:
        _podman("import", "-q", "-", image, stdin=tar.stdout)
    finally:
        if tar.stdout:
            tar.stdout.close()
        if tar.wait(timeout=TIMEOUT_S) != 0:
            raise HpvcError("podman import", f"tar -C {rootfs} -c . failed")
