"""Gate integration tests on what the host has; CI (HPVC_REQUIRE_ALL=1) refuses to skip.

Only missing *hardware* may skip under HPVC_REQUIRE_ALL; missing software that
``make setup`` installs is a failure there.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Real machines' /sys snapshots, vendored (tests/data/topologies/README.md).
TOPOLOGIES = os.path.join(ROOT, "tests", "data", "topologies")


def _kvm() -> str | None:
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "no usable /dev/kvm"
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return "cannot read /proc/cpuinfo"
    if " vmx" not in flags and " svm" not in flags:
        return "CPU has no vmx/svm (KVM here is not hardware virtualization)"
    return None


def _tool(name: str) -> Callable[[], str | None]:
    return lambda: None if shutil.which(name) else f"{name} not installed (make setup)"


# name -> (check returning a reason when missing, is_hardware)
_CHECKS: dict[str, tuple[Callable[[], str | None], bool]] = {
    "root": (lambda: None if os.geteuid() == 0 else "needs root", False),
    "hwloc": (_tool("hwloc-calc"), False),
    "virt-xml-validate": (_tool("virt-xml-validate"), False),
    "topologies": (
        lambda: None if os.path.isdir(TOPOLOGIES) else f"{TOPOLOGIES} not found",
        False,
    ),
    "crun": (_tool("crun"), False),
    "qemu": (_tool("qemu-system-x86_64"), False),
    "debootstrap": (_tool("debootstrap"), False),
    "mpi": (_tool("mpirun.openmpi"), False),
    "mpicc.mpich": (_tool("mpicc.mpich"), False),  # libmpich-dev: MPICH test programs
    "mpicc.openmpi": (_tool("mpicc.openmpi"), False),  # libopenmpi-dev: Open MPI test programs
    "ucx_perftest": (_tool("ucx_perftest"), False),  # ucx-utils: native/ucx's transport tests
    "fio": (_tool("fio"), False),
    "ip": (_tool("ip"), False),
    "nft": (_tool("nft"), False),
    "ping": (_tool("ping"), False),
    "iperf3": (_tool("iperf3"), False),
    "sockperf": (_tool("sockperf"), False),
    "podman": (_tool("podman"), False),
    "skopeo": (_tool("skopeo"), False),  # hpvc image import copies images with it
    "umoci": (_tool("umoci"), False),  # and unpacks them with it
    "busybox": (_tool("busybox"), False),  # busybox-static: tests' non-Debian images
    "java": (_tool("javac"), False),  # openjdk-17-jdk-headless: Spark's JRE and javac
    "ganesha": (_tool("ganesha.nfsd"), False),  # nfs-ganesha: the clusters' NFS server
    "kvm": (_kvm, True),
}


def requires(*what: str) -> None:
    """Skip (or, under HPVC_REQUIRE_ALL=1, fail) unless the host has everything named."""
    strict = os.environ.get("HPVC_REQUIRE_ALL") == "1"
    for name in what:
        check, hardware = _CHECKS[name]
        reason = check()
        if reason is None:
            continue
        if strict and not hardware:
            pytest.fail(f"required by HPVC_REQUIRE_ALL=1: {reason}")
        pytest.skip(reason)


def prefix_leftovers(prefix: str) -> list[str]:
    """Containers, netns, links and cgroups of clusters whose names start with
    ``prefix`` (hpvc names them ``hpvc-<cluster>-...`` and ``*/hpvc/<cluster>``)."""
    import subprocess
    from pathlib import Path

    ours = f"hpvc-{prefix}"
    found: list[str] = []
    r = subprocess.run(["crun", "list", "-q"], capture_output=True, text=True, check=False)
    found += [c for c in r.stdout.split() if c.startswith(ours)]
    netns = Path("/run/netns")
    if netns.is_dir():
        found += [p.name for p in netns.iterdir() if p.name.startswith(ours)]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    found += [w.rstrip(":") for w in links.stdout.split() if w.startswith(ours)]
    found += [f"cgroup {p}" for p in Path("/sys/fs/cgroup").glob(f"*/hpvc/{prefix}*")]
    return found


def build_pingpong(out: os.PathLike[str] | str) -> str:
    """Build native/bench's MPI ping-pong into ``out``; the binary's path."""
    import subprocess

    b = subprocess.run(
        ["make", "-s", "-C", os.path.join(ROOT, "native", "bench"), f"OUT={out}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert b.returncode == 0, b.stderr
    return os.path.join(str(out), "pingpong")


# Touching memory once makes the kernel initialise the struct pages it deferred at
# boot (CONFIG_DEFERRED_STRUCT_PAGE_INIT): a fresh machine's NUMA node shows about
# 8 GiB of its 24 GiB until then (docs/planning.md, "A fresh machine").
_TOUCH = (
    "import mmap, sys\n"
    "n = int(sys.argv[1]) << 20\n"
    "m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)\n"
    "for i in range(0, n, 4096):\n"
    "    m[i] = 1\n"
)


def host_free_mib() -> int:
    """What the planner may take from this host's NUMA nodes, in all (hpvc's own reader)."""
    from hpvc.sysroot import HOST
    from hpvc.topology import read_topology

    return sum(n.free_mib for n in read_topology(HOST).numa_nodes)


def make_room(mib: int, tries: int = 3) -> None:
    """Make the host's NUMA nodes offer ``mib`` free for a test cluster: touch
    memory in a child process (which gives it back when it exits) until the
    kernel has brought in enough; fail with the numbers where it cannot."""
    import subprocess
    import sys

    for _ in range(tries):
        free = host_free_mib()
        if free >= mib:
            return
        with open("/proc/meminfo") as f:
            avail = next(int(x.split()[1]) // 1024 for x in f if x.startswith("MemAvailable:"))
        # Pages already brought in are handed out first: only touching more than
        # the node has free makes the kernel bring in the rest.
        touch = min(mib + 1024, avail - 1024)
        if touch <= 0:
            break
        subprocess.run([sys.executable, "-c", _TOUCH, str(touch)], check=True, timeout=300)
    pytest.fail(
        f"the host's NUMA nodes offer {host_free_mib()} MiB free, the test needs {mib} MiB"
        " even after touching memory (free memory elsewhere, or give the machine more)"
    )
