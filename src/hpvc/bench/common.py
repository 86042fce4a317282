"""What the cluster benchmarks share: checks, host facts, a throw-away state, output.

Every cluster benchmark runs on its own temporary state directory, so it never
touches the user's clusters, and tears down whatever it brought up, also when
it fails. A teardown that fails keeps the state directory (its journals say
what is left) and names the command that finishes the job.
"""

from __future__ import annotations

import ipaddress
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hpvc import __version__
from hpvc.cluster import lifecycle
from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.host import accel, hwinfo
from hpvc.image import build_image, resolve_image
from hpvc.progress import Progress, quiet
from hpvc.store import Store

# Tool -> Debian package that provides it.
APT_PACKAGE = {
    "crun": "crun",
    "mpirun.openmpi": "openmpi-bin",
    "mpicc": "libopenmpi-dev",
    "make": "make",
    "ip": "iproute2",
    "javac": "openjdk-17-jdk-headless",
    "ganesha.nfsd": "nfs-ganesha nfs-ganesha-vfs",
}

# Where benchmark clusters take their /24 networks (first free one from here).
SUBNET_POOL = ipaddress.IPv4Network("10.232.0.0/14")


def require(what: str, tools: list[str], root: bool = True) -> None:
    """Refuse to start without root or one of ``tools``: one line, the package to install."""
    if root and os.geteuid() != 0:
        raise MissingDependency(what, "needs root (cgroups, namespaces, mounts)", "run as root")
    for tool in tools:
        if shutil.which(tool) is None:
            pkg = APT_PACKAGE.get(tool, tool)
            raise MissingDependency(what, f"{tool} not found", f"apt-get install {pkg}")


def ensure_image(name: str, progress: Progress = quiet) -> None:
    """Make sure image ``name`` is built (a first build takes about a minute), and
    that one built with extras holds what this hpvc's extras install (an image
    from before a change to the spark extra's TeraSort is built again)."""
    from hpvc.image.model import ImageSpec

    try:
        image = resolve_image(name)
    except InputError:
        from hpvc.image.extras import preset_extras  # `spark`: the preset's extras

        progress(f"image {name!r} not built yet: building it (about a minute)")
        build_image(name, progress=lambda m: progress(f"image: {m}"), extras=preset_extras(name))
        return
    if not image.extras or image.source:  # no extras, or imported: nothing of hpvc's inside
        return
    recipe = ImageSpec.make(image.packages, image.suite, image.mirror, image.extras)
    if recipe.digest == image.digest:
        return
    progress(f"image {name!r} holds an older {', '.join(image.extras)}: building it again")
    build_image(
        name, list(image.packages), mirror=image.mirror, suite=image.suite,
        extras=image.extras, progress=lambda m: progress(f"image: {m}"),
    )  # fmt: skip


def ensure_guest(name: str, progress: Progress = quiet) -> None:
    """Make sure the VM guest of image ``name`` (kernel, initramfs, disk) is built,
    so that no measured step builds it."""
    from hpvc.image.guest import build_guest

    ensure_image(name, progress)
    build_guest(resolve_image(name), progress=lambda m: progress(f"guest: {m}"))


def native_dir() -> Path:
    """The repository's ``native/bench`` (the C micro-benchmarks)."""
    env = os.environ.get("HPVC_NATIVE_BENCH")
    here = Path(__file__).resolve().parents[3] / "native" / "bench"
    for c in ([Path(env)] if env else []) + [here, Path.cwd() / "native" / "bench"]:
        if (c / "Makefile").is_file():
            return c
    raise InputError(
        "native/bench",
        "sources of the micro-benchmarks not found",
        "run from an hpvc checkout, or set HPVC_NATIVE_BENCH=DIR",
    )


def build_native(target: str, out: Path, mpicc: str = "mpicc") -> Path:
    """``make -C native/bench OUT=out``; return the built ``target`` (MPI programs
    with ``mpicc``: ``mpicc.mpich`` builds them for MPICH)."""
    r = subprocess.run(
        ["make", "-C", str(native_dir()), f"OUT={out}", f"MPICC={mpicc}", str(out / target)],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        lines = (r.stderr or r.stdout).strip().splitlines()
        raise HpvcError(f"build {target}", lines[-1] if lines else f"make exit {r.returncode}")
    return out / target


def _used_networks() -> list[ipaddress.IPv4Network]:
    r = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True)
    nets = []
    for line in r.stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            addr = fields[fields.index("inet") + 1]
            nets.append(ipaddress.IPv4Interface(addr).network)
    return nets


def free_subnets(
    count: int,
    pool: ipaddress.IPv4Network = SUBNET_POOL,
    extra_used: list[ipaddress.IPv4Network] | None = None,
) -> list[str]:
    """``count`` /24 networks of ``pool`` that no interface on this host uses now
    (nor any of ``extra_used``).

    The search starts at an offset taken from our PID, so two benchmarks
    started side by side are unlikely to pick the same networks.
    """
    used = _used_networks() + list(extra_used or [])
    nets = list(pool.subnets(new_prefix=24))
    start = os.getpid() % len(nets)
    out: list[str] = []
    for i in range(len(nets)):
        cand = nets[(start + i) % len(nets)]
        if not any(cand.overlaps(u) for u in used):
            out.append(str(cand))
            if len(out) == count:
                return out
    raise HpvcError("benchmark network", f"no free /24 left in {pool}", "")


def cluster_spec(
    name: str,
    subnet: str,
    groups: list[dict[str, Any]],
    locality: str = "shm",
    kind: str = "container",
    image: str = "hpc",
) -> str:
    """A spec of 1-vCPU floating nodes (a 2-CPU host cannot pin many)."""
    lines = [
        f'name = "{name}"',
        f'kind = "{kind}"',
        f'image = "{image}"',
        "[network]",
        f'subnet = "{subnet}"',
        "mtu = 9000",
        "[tuning]",
        'pinning = "shared"',
        'hugepages = "none"',
        'partition = "commodity"',
        f'locality = "{locality}"',
    ]
    for g in groups:
        lines += ["[[nodes]]", f'role = "{g["role"]}"', f"count = {g['count']}"]
        lines += [f"vcpus = {g.get('vcpus', 1)}", f'memory = "{g["memory"]}"']
    return "\n".join(lines) + "\n"


@contextmanager
def scratch_state(what: str, progress: Progress = quiet) -> Iterator[tuple[Path, Store]]:
    """A temporary directory and a Store inside it; every cluster in it is torn down."""
    tmp = Path(tempfile.mkdtemp(prefix="hpvc-bench-"))
    store = Store(tmp / "state")
    failed = True
    try:
        yield tmp, store
        failed = False
    finally:
        errors = teardown_all(store, progress)
        if not errors:
            shutil.rmtree(tmp, ignore_errors=True)
        elif not failed:
            raise HpvcError(
                f"{what}: teardown",
                errors[0],
                f"HPVC_STATE_DIR={store.root} hpvc down NAME (state kept in {tmp})",
            )
        else:
            progress(f"teardown failed ({errors[0]}); state kept in {store.root}")


def teardown_all(store: Store, progress: Progress = quiet) -> list[str]:
    """Undo every cluster the store knows (records and half-made ones)."""
    base = store.root / "clusters"
    names = sorted(p.name for p in base.iterdir()) if base.is_dir() else []
    errors: list[str] = []
    for name in names:
        progress(f"teardown {name}")
        errors += lifecycle.teardown(store, name)
    return errors


def sh(argv: list[str], what: str) -> str:
    """Run ``argv``; its stdout, or HpvcError with the last line it said."""
    r = subprocess.run(argv, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        lines = (r.stderr or r.stdout).strip().splitlines()
        raise HpvcError(what, lines[-1] if lines else f"exit code {r.returncode}")
    return r.stdout.strip()


def tool_version(argv: list[str]) -> str:
    """The first line a tool's ``--version`` prints (stdout, else stderr), or "unknown"."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = [x.strip() for x in (r.stdout + r.stderr).splitlines() if x.strip()]
    return lines[0] if lines else "unknown"


def cpu_model() -> str:
    """This host's CPU model ("unknown" when neither /proc/cpuinfo nor Python says)."""
    return hwinfo.cpu_model() or platform.processor() or "unknown"


def host_facts(mpi: bool = True) -> dict[str, Any]:
    """Where and with what the numbers were taken."""
    facts: dict[str, Any] = {
        "hpvc": __version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "crun": tool_version(["crun", "--version"]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg_start": list(os.getloadavg()),  # a shared machine: how busy it was
    }
    if mpi:
        facts["open_mpi"] = tool_version(["ompi_info", "--version"])
    return facts


def error_line(e: BaseException) -> str:
    return e.line() if isinstance(e, HpvcError) else f"{type(e).__name__}: {e}"


def accelerator() -> dict[str, Any]:
    """The VM accelerator of this host (kvm or tcg) and why, for reading the VM figures."""
    try:
        a = accel.accelerator()
    except Exception as e:
        return {"vm": None, "error": error_line(e)}
    return {"vm": a.name, "forced": a.forced, "note": a.warning}


def write_results(out: Path, doc: dict[str, Any], report: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "report.md").write_text(report)
