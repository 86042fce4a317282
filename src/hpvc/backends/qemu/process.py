"""VM nodes run by QEMU directly: the process, its CPU pinning over QMP, read-back.

The renderer (``hpvc.render.qemu``) says what to run; this module runs it and
applies the tuning QEMU cannot apply itself. QEMU is started as a detached
child (own session, stdio to a log file, ``-pidfile`` written by QEMU); the
call returns once QEMU answers on its QMP socket. Then ``apply_pinning`` asks
QMP which host thread runs each vCPU (``query-cpus-fast``) and sets its
affinity; every other thread of the process (main loop, I/O, RCU, workers) goes
to the emulator CPUs. Threads QEMU creates later inherit their creator's
affinity, so they stay on the emulator CPUs too.

Long because starting, pinning, reading back and stopping one QEMU share
the bookkeeping of its threads and sockets; the QMP session is in
``hpvc.backends.qemu.qmp`` and the /proc readers in ``hpvc.host.procfs``.

architecture rule 5: the undo kinds are ``"tap"`` (delete the interface if it is
still a tap) and ``"qemu"`` (written before QEMU starts: its ``-name`` value,
pid file, QMP and other sockets); before it, the serial console's reader
(``"console-ring"``, ``hpvc.host.console_ring``), so QEMU is undone first.
Stopping asks QMP to ``quit``, then sends SIGTERM, then SIGKILL, and signals a
PID only while its command line still holds the expected ``-name`` (a reused
PID is never signalled).

The ``/proc`` readers take an injectable ``proc`` root, so the bookkeeping is
tested with fake task lists. A guest's readiness (its console's ready line) is
VM-wide: ``hpvc.backends.vm.console``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from hpvc.backends.qemu.qmp import QMP_CONNECT_S, Memdev, memdevs, qmp, vcpu_threads, wait_qmp
from hpvc.errors import HpvcError
from hpvc.host import console_ring, procfs
from hpvc.host.journal import Args, Journal, undoer
from hpvc.host.procfs import PROC, ThreadAffinity, find_qemu, is_qemu, task_ids, thread_affinity
from hpvc.paths import private_dir
from hpvc.render.qemu import QemuLaunch, QemuPinning
from hpvc.units import format_cpulist

STOP_WAIT_S = (3.0, 3.0, 2.0)  # after quit, after SIGTERM, after SIGKILL
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}  # QEMUs started by this process


# --- typed results -------------------------------------------------------------------


class VcpuAffinity(ThreadAffinity):
    vcpu: int


class Pinned(TypedDict):
    """What ``apply_pinning`` set."""

    vcpus: list[VcpuAffinity]
    emulator_cpus: list[int]
    emulator_threads: list[int]


class ReadBack(TypedDict):
    """What ``hpvc status`` shows of a running VM: pinning and memory as they are."""

    pid: int
    vcpus: list[VcpuAffinity]
    emulator: list[ThreadAffinity]
    memdevs: list[Memdev]
    memory: dict[str, int]
    kvm: dict[str, bool]


# --- the QEMU command line -----------------------------------------------------------


def _opts(value: str) -> list[str]:
    """Split a QEMU option string on single commas (``,,`` is a literal comma)."""
    return [part.replace("\0", ",") for part in value.replace(",,", "\0").split(",")]


def _values(argv: Sequence[str], flag: str) -> list[str]:
    return [argv[i + 1] for i in range(len(argv) - 1) if argv[i] == flag]


def name_of(argv: Sequence[str]) -> str:
    """The ``-name`` value of a QEMU command line (what identifies its process)."""
    names = _values(argv, "-name")
    if len(names) != 1:
        raise HpvcError("QEMU command line", f"want one -name, found {len(names)}")
    return names[0]


@dataclass(frozen=True)
class LaunchFiles:
    """Files a QEMU command line makes the process create (sockets, pid file, logs)."""

    sockets: tuple[str, ...]
    pidfile: str | None
    logs: tuple[str, ...]


def launch_files(argv: Sequence[str]) -> LaunchFiles:
    """The unix sockets (``-qmp unix:``, ``-chardev socket,path=``), pid file and chardev logs."""
    sockets: list[str] = []
    logs: list[str] = []
    for value in _values(argv, "-qmp"):
        first = _opts(value)[0]
        if first.startswith("unix:"):
            sockets.append(first[5:])
    for dev in _values(argv, "-chardev"):
        parts = _opts(dev)
        keys = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
        if parts[0] == "socket" and "path" in keys:
            sockets.append(keys["path"])
        if "logfile" in keys:
            logs.append(keys["logfile"])
    pidfiles = _values(argv, "-pidfile")
    return LaunchFiles(tuple(sockets), pidfiles[-1] if pidfiles else None, tuple(logs))


def accel_of(argv: Sequence[str]) -> str | None:
    """The accelerator a QEMU command line runs on (``kvm``, ``tcg``; ``-accel``,
    ``-machine accel=`` or ``-enable-kvm``); None when it names none."""
    if "-enable-kvm" in argv:
        return "kvm"
    for value in _values(argv, "-accel"):
        return _opts(value)[0]
    for value in _values(argv, "-machine"):
        for opt in _opts(value):
            if opt.startswith("accel="):
                return opt.removeprefix("accel=").split(":")[0]
    return None


# --- start and stop ------------------------------------------------------------------


def start_qemu(
    journal: Journal,
    launch: QemuLaunch,
    *,
    log: Path,
    qmp_timeout: float = QMP_CONNECT_S,
    console_cap: int = 16 << 20,
) -> int:
    """Start QEMU detached (own session, stdio to ``log``); return its PID once QMP answers.

    A launch whose serial console is logged to a FIFO (``console_fifo``) gets
    hpvc's console reader first: it makes the FIFO (0600, root's: QEMU opens it
    before it drops to its cluster's uid) and holds it open for reading, so
    QEMU's open for writing does not wait, and keeps ``console_log`` to
    ``console_cap`` bytes. A new start's log starts empty, as QEMU's own
    ``logappend=off`` did (a restart makes the node's folder anew in any case).
    """
    name = name_of(launch.argv)
    what = f"QEMU {name.split(',')[0]}"
    already = find_qemu(name)
    if already:
        raise HpvcError(what, f"already running as PID {already[0]}", "run 'hpvc down' first")
    files = launch_files(launch.argv)
    console = [launch.console_log] if launch.console_log is not None else []
    for path in (*files.sockets, *files.logs, *console, launch.pidfile, str(log)):
        private_dir(Path(path).parent)  # in hpvc's state: root's alone
    sockets = list(dict.fromkeys([launch.qmp_socket, *files.sockets]))
    if launch.console_fifo is not None and launch.console_log is not None:
        fifo, ring = Path(launch.console_fifo), Path(launch.console_log)
        console_ring.start(journal, ring, console_cap, fifo=fifo)  # undone after QEMU
    journal.record(
        "qemu", name=name, pidfile=launch.pidfile, qmp=launch.qmp_socket, sockets=sockets
    )
    with open(log, "wb") as out:  # this start's messages only: errors quote its tail
        try:
            child = subprocess.Popen(
                list(launch.argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        except OSError as e:
            raise HpvcError(what, f"cannot run {launch.argv[0]}: {e.strerror or e}") from e
    _CHILDREN[child.pid] = child
    wait_qmp(launch.qmp_socket, child.pid, qmp_timeout, log)
    return child.pid


def _reap(pid: int) -> None:
    """Collect the exit status of a QEMU this process started (its command line is gone)."""
    child = _CHILDREN.get(pid)
    if child is None:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=2.0)  # it is exiting: its memory may still be being freed
    if child.returncode is not None:
        del _CHILDREN[pid]


def _wait_gone(pid: int, name: str, seconds: float, proc: Path = PROC) -> bool:
    deadline = time.monotonic() + seconds
    while is_qemu(pid, name, proc):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    _reap(pid)
    return True


def stop_qemu(pid: int, name: str, qmp_socket: str | None, proc: Path = PROC) -> None:
    """Stop one QEMU: QMP ``quit``, then SIGTERM, then SIGKILL; only while it is still ``name``."""
    quit_s, term_s, kill_s = STOP_WAIT_S
    if not is_qemu(pid, name, proc):
        _reap(pid)
        return
    if qmp_socket and os.path.exists(qmp_socket):
        with contextlib.suppress(HpvcError):
            qmp(qmp_socket, "quit", connect_s=1.0, command_s=2.0, pid=pid)
        if _wait_gone(pid, name, quit_s, proc):
            return
    for sig, seconds in ((signal.SIGTERM, term_s), (signal.SIGKILL, kill_s)):
        if not is_qemu(pid, name, proc):  # checked right before each signal
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        if _wait_gone(pid, name, seconds, proc):
            return
    raise HpvcError(f"QEMU {name} (PID {pid})", "still running after SIGKILL")


def _remove(path: Path, *, socket_only: bool) -> None:
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if stat.S_ISSOCK(mode) or (not socket_only and stat.S_ISREG(mode)):
        path.unlink(missing_ok=True)


@undoer("qemu")
def _undo_qemu(args: Args) -> None:
    name, pidfile = str(args["name"]), Path(args["pidfile"])
    pid = procfs.read_pidfile(pidfile)
    pids = [pid] if pid is not None and is_qemu(pid, name) else find_qemu(name)
    for p in pids:
        stop_qemu(p, name, args.get("qmp"))
    _remove(pidfile, socket_only=False)
    for path in args.get("sockets", []):
        _remove(Path(path), socket_only=True)


# --- pinning -------------------------------------------------------------------------


def check_cpus(pinning: QemuPinning, allowed: Iterable[int]) -> None:
    """Raise unless every planned CPU is one this process may use."""
    planned = {c for _, cpus in pinning.vcpus for c in cpus} | set(pinning.emulator)
    missing = planned - set(allowed)
    if missing:
        raise HpvcError(
            "vCPU pinning",
            f"planned CPUs {format_cpulist(missing)} are not available to hpvc "
            f"(it may use {format_cpulist(set(allowed)) or 'none'})",
            "re-plan on this host, or run hpvc outside the cpuset that restricts it",
        )


def vcpu_affinity(pinning: QemuPinning, threads: Mapping[int, int]) -> dict[int, frozenset[int]]:
    """Thread ID -> CPUs for the vCPU threads; vCPUs sharing a thread get the union."""
    planned = {v for v, _ in pinning.vcpus}
    if planned != set(threads):
        raise HpvcError(
            "vCPU pinning",
            f"plan has vCPUs {format_cpulist(planned)}, QEMU has {format_cpulist(set(threads))}",
        )
    out: dict[int, frozenset[int]] = {}
    for vcpu, cpus in pinning.vcpus:
        tid = threads[vcpu]
        out[tid] = out.get(tid, frozenset()) | frozenset(cpus)
    return out


def emulator_threads(tasks: Iterable[int], vcpu_tids: Iterable[int]) -> list[int]:
    """Every thread of the process that runs no vCPU."""
    skip = set(vcpu_tids)
    return sorted(t for t in tasks if t not in skip)


def _set_affinity(tid: int, cpus: Iterable[int], required: bool) -> bool:
    try:
        os.sched_setaffinity(tid, set(cpus))
    except ProcessLookupError:
        if required:
            raise HpvcError(f"pin thread {tid}", "the thread is gone") from None
        return False
    except OSError as e:
        raise HpvcError(f"pin thread {tid} to {format_cpulist(set(cpus))}", str(e)) from e
    return True


def _pin_emulator(pid: int, vcpu_tids: set[int], cpus: tuple[int, ...], proc: Path) -> list[int]:
    """Pin every non-vCPU thread; a few passes catch threads started meanwhile."""
    done: list[int] = []
    for _ in range(3):
        fresh = [t for t in emulator_threads(task_ids(pid, proc), vcpu_tids) if t not in done]
        if not fresh:
            break
        done += [t for t in fresh if _set_affinity(t, cpus, required=False)]
    return sorted(done)


def apply_pinning(
    qmp_socket: str | Path, pid: int, pinning: QemuPinning, proc: Path = PROC
) -> Pinned:
    """Pin each vCPU thread to its planned CPUs and the other threads to the emulator CPUs."""
    check_cpus(pinning, os.sched_getaffinity(0))
    threads = vcpu_threads(qmp(qmp_socket, "query-cpus-fast", pid=pid)[0])
    per_tid = vcpu_affinity(pinning, threads)
    for tid, cpus in per_tid.items():
        _set_affinity(tid, cpus, required=True)
    emulator = _pin_emulator(pid, set(per_tid), pinning.emulator, proc) if pinning.emulator else []
    vcpus = [
        VcpuAffinity(vcpu=v, **thread_affinity(pid, threads[v], proc)) for v in sorted(threads)
    ]
    return Pinned(vcpus=vcpus, emulator_cpus=sorted(pinning.emulator), emulator_threads=emulator)


# --- read-back -----------------------------------------------------------------------


def _int_dict(value: object) -> dict[str, int]:
    return {str(k): int(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _bool_dict(value: object) -> dict[str, bool]:
    return {str(k): bool(v) for k, v in value.items()} if isinstance(value, dict) else {}


def read_back(pid: int, qmp_socket: str | Path, proc: Path = PROC) -> ReadBack:
    """vCPU and emulator thread affinity as the kernel has it, memory backends, KVM in use."""
    cpus, mem, summary, kvm = qmp(
        qmp_socket,
        "query-cpus-fast",
        "query-memdev",
        "query-memory-size-summary",
        "query-kvm",
        connect_s=2.0,
        pid=pid,
    )
    threads = vcpu_threads(cpus)
    vcpus = [
        VcpuAffinity(vcpu=v, **thread_affinity(pid, tid, proc))
        for v, tid in sorted(threads.items())
    ]
    emulator = [
        thread_affinity(pid, t, proc)
        for t in emulator_threads(task_ids(pid, proc), threads.values())
    ]
    return ReadBack(
        pid=pid,
        vcpus=vcpus,
        emulator=emulator,
        memdevs=memdevs(mem),
        memory=_int_dict(summary),
        kvm=_bool_dict(kvm),
    )
