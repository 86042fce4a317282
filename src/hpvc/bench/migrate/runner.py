"""``hpvc bench migrate`` on one host (issue 27 Figures).

Per guest size one VM cluster of the qemu backend (two 1-vCPU compute guests
of the ``hpc`` image; ``locality = "none"``: an ivshmem region blocks
migration). compute1 moves into a new QEMU, re-planned on this host (``hpvc migrate``
with neither ``--to`` nor ``--cpus``), at every repetition: a real
migration each time (a new QEMU process), even where it lands on the CPUs it
had. Confining it to one CPU and then the other is refused on a 2-CPU host:
the pinned node would take the CPU its floating neighbour runs on. Per
repetition the loads run in turn, their order reversed every other one
(``report.loads_of``):

- ``idle``: nothing runs in the guests;
- ``memwrite``: ``native/bench/memwrite.c`` writes every page of a quarter
  of the guest's memory (at most ``WRITE_MIB``, 64 MiB) round after round in
  compute1, checking each round what the one before wrote (a wrong page
  fails the run);
- ``mpi``: the MPI ping-pong ``native/bench/migloop.c`` across compute0 and
  compute1 (``hpvc run -n 2``), once just before without a move (baseline)
  and once through the move: slowdown = baseline round trips / round trips.

Per move: QEMU's total time, downtime and bytes sent, the call's wall time,
and the downtime seen from outside: the longest gap between replies of
``ping -D -i 0.002`` from the host to the guest's address on the cluster
bridge (the guest's own clock stops while it is paused). Everything runs on
a scratch state (``common.scratch_state``): every cluster is taken down,
also when a step fails. Across two hosts: ``hpvc.bench.migrate.slurm``.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpvc.bench import common
from hpvc.bench.migrate import report
from hpvc.bench.migrate.slurm import build_loop, parse_loop
from hpvc.cluster import lifecycle, ops
from hpvc.cluster.migrate import migrate
from hpvc.errors import HpvcError, InputError
from hpvc.progress import Progress, quiet
from hpvc.store import Store
from hpvc.topology import read_topology

IMAGE = "hpc"
OVERHEAD_MIB = 256  # per guest: QEMU itself, besides the guest's memory
# What the memory writer keeps dirty: with 256 MiB in a 1 GiB TCG guest the
# writer's session had not ended 128 s after the move (run of 2026-11-26
# 06:41, cause not found); 64 MiB ran through (the 256 MiB guest's run).
WRITE_MIB = 64


def preflight(sizes_mib: list[int], reps: int, secs: int) -> None:
    if not sizes_mib or min(sizes_mib) < 256:
        raise InputError("--sizes", "each guest needs at least 256 MiB", "--sizes 1GiB,2GiB")
    if reps < 1:
        raise InputError("--reps", "at least one repetition", "--reps 3")
    if secs < 4:
        raise InputError("--seconds", "each load needs at least 4 s", "--seconds 10")
    if os.geteuid() != 0:
        raise InputError("hpvc bench migrate", "needs root (QEMU, taps)", "run as root")
    common.require("bench migrate", ["qemu-system-x86_64", "ip", "ping", "mpicc", "cc"])


def fitting(sizes_mib: list[int], free_mib: int) -> tuple[list[int], str]:
    """The sizes whose two guests fit in ``free_mib`` now, and a note naming
    those left out (empty when all fit)."""
    fit = [m for m in sizes_mib if 2 * (m + OVERHEAD_MIB) <= free_mib]
    out = [m for m in sizes_mib if m not in fit]
    note = ""
    if out:
        note = (f"Sized down: {', '.join(f'{m} MiB' for m in out)} left out, two guests of it"
                f" do not fit in the {free_mib} MiB the host had free.")  # fmt: skip
    return fit, note


def _build(out: Path) -> tuple[Path, Path]:
    loop = build_loop(out)
    mw = out / "memwrite"
    src = common.native_dir() / "memwrite.c"
    common.sh(
        ["cc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(mw), str(src)], "build memwrite"
    )
    return loop, mw


def _env(store: Store) -> dict[str, str]:
    from hpvc.image import default_store

    return {**os.environ, "HPVC_STATE_DIR": str(store.root), "HPVC_IMAGE_DIR": str(default_store())}


def _copy_in(name: str, store: Store, files: list[Path]) -> None:
    for node in ("compute0", "compute1"):
        for f in files:
            with open(f, "rb") as fh:
                put = ["sh", "-c", f"cat > /root/{f.name} && chmod +x /root/{f.name}"]
                argv = ops.exec_argv(name, node, put, store)
                subprocess.run(argv, stdin=fh, check=True, timeout=120, capture_output=True)


def _mpi(name: str, store: Store, secs: int) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "hpvc", "run", name, "-n", "2", "--", "/root/migloop", str(secs)]
    return subprocess.Popen(argv, env=_env(store), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip


def _stop(p: subprocess.Popen[str]) -> None:
    """End a load this run started: its own process group (``hpvc run``,
    mpirun and the ssh sessions under it), by the group's id."""
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
    p.wait()


GUEST_LOOK = (
    "date +%s.%N; cat /sys/devices/system/clocksource/clocksource0/current_clocksource;"
    " ps -eo pid,stat,etime,time,wchan:24,args | grep -v ' \\[' ; ss -tnpi | head -40"
)


def _look(name: str, store: Store) -> str:
    """What each compute guest says about itself (its clock against the host's, its
    processes and TCP connections): kept with a loop that did not end."""
    parts = []
    for node in ("compute0", "compute1"):
        argv = ops.exec_argv(name, node, ["sh", "-c", GUEST_LOOK], store)
        t0 = time.time()
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
            text = r.stdout + r.stderr
        except subprocess.TimeoutExpired:
            text = "(no answer in 30 s)"
        parts.append(f"--- {node} (host clock {t0:.3f} when asked)\n{text}")
    return "\n".join(parts)


def _loop_done(
    p: subprocess.Popen[str], secs: int, look: Callable[[], object] | None = None
) -> dict[str, float]:
    try:
        out, _ = p.communicate(timeout=secs + 90)
    except subprocess.TimeoutExpired:
        if look is not None:
            look()  # into the run's log, before the loop is ended
        _stop(p)
        out, _ = p.communicate()
        last = out.strip().splitlines()[-1:] or ["no output"]
        raise HpvcError(
            "bench migrate: the MPI loop", f"did not end in {secs + 90} s; it said: {last[0]}"
        ) from None
    except BaseException:  # Ctrl-C: leave nothing running
        _stop(p)
        raise
    got = parse_loop(out)
    if got is None or got["wrong"] or p.returncode != 0:
        raise HpvcError("bench migrate: the MPI loop", out.strip()[-300:])
    return got


def _writer_done(p: subprocess.Popen[str], secs: int, look: Callable[[], object]) -> dict[str, Any]:
    """The memory writer's end: its output, and ``load_failed`` when it did not
    end right (a wrong page, an exit other than 0, no end in time); the guests
    are looked at then. Kept in the row: the move itself was measured."""
    try:
        out, _ = p.communicate(timeout=secs + 120)
    except subprocess.TimeoutExpired:
        look()
        p.kill()
        out, _ = p.communicate()
        return {"memwrite_out": out.strip()[-200:], "load_failed": "writer: no end in time"}
    got: dict[str, Any] = {"memwrite_out": out.strip()[-200:], "memwrite_exit": p.returncode}
    if p.returncode != 0 or " 0 wrong" not in out:  # a page the move lost, or it died
        look()
        got["load_failed"] = f"writer: exit {p.returncode}, said {got['memwrite_out'] or 'nothing'}"
    return got


def _move(name: str, store: Store, ip: str) -> dict[str, Any]:
    # Into a file, not a pipe: nothing reads a pipe until the end, and ping
    # blocked once ~800 replies (64 KiB) filled it, a silence the gap then took
    # for the guest's (runs before 2026-11-26 11:58).
    with tempfile.TemporaryFile("w+") as sink:
        ping = subprocess.Popen(["ping", "-D", "-n", "-i", "0.002", ip], stdout=sink,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
        try:
            time.sleep(0.5)
            t0 = time.perf_counter()
            out = migrate(name, "compute1", store=store)
            wall = time.perf_counter() - t0
            time.sleep(0.5)
        finally:
            ended = time.time()
            ping.send_signal(signal.SIGINT)
            ping.wait(timeout=30)
        sink.seek(0)
        text = sink.read()
    return {**out["migration"], "wall_s": wall, "to_cpus": out["to"]["cpus"],
            "ping_gap_ms": report.longest_gap_ms(text, ended)}  # fmt: skip


def one_size(tmp: Path, store: Store, mib: int, reps: int, secs: int, files: list[Path],
             progress: Progress) -> list[dict[str, Any]]:  # fmt: skip
    name = f"mig{mib}"
    spec = tmp / f"{name}.toml"
    groups = [{"role": "compute", "count": 2, "memory": f"{mib}MiB"}]
    spec.write_text(common.cluster_spec(name, common.free_subnets(1)[0], groups,
                                        locality="none", kind="vm", image=IMAGE))  # fmt: skip
    progress(f"{name}: up (2 VMs x {mib} MiB)")
    lifecycle.up(str(spec), store, progress)
    _copy_in(name, store, files)
    ip = store.get(name).the_plan().node("compute1").ip
    rows: list[dict[str, Any]] = []
    move_s = 0.0  # the longest move of this size so far (the target's start is most of it)

    def look() -> None:
        progress(f"{name}: a load went wrong; the guests say:\n{_look(name, store)}")

    for rep in range(reps):
        for load in report.loads_of(rep):
            row: dict[str, Any] = {"memory_mib": mib, "load": load, "rep": rep}
            bg: subprocess.Popen[str] | None = None
            # A load lasts past the move (its pause comes at the move's end), and the
            # baseline loop as long: ``secs`` plus the longest move so far.
            span = secs + math.ceil(move_s)
            if load == "mpi":
                try:
                    row["baseline"] = _loop_done(_mpi(name, store, span), span, look)
                except HpvcError as e:  # kept, and the move still measured
                    row["load_failed"] = f"baseline loop: {e.line()}"
                bg = _mpi(name, store, span)
                time.sleep(min(8, secs / 2))  # the ranks start (ssh into the guests)
            elif load == "memwrite":
                row["memwrite_mib"] = min(WRITE_MIB, mib // 4)
                writer = ["/root/memwrite", str(row["memwrite_mib"]), str(span)]
                argv = ops.exec_argv(name, "compute1", writer, store)
                bg = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True)  # fmt: skip
                time.sleep(3)
            try:
                row |= _move(name, store, ip)
                move_s = max(move_s, float(row["wall_s"]))
                if bg is not None:  # still running after the switch: the pause fell inside it
                    row["load_spans_move"] = bg.poll() is None
            except BaseException:
                if bg is not None:  # the move's own error, not a wait on the load
                    if load == "mpi":
                        _stop(bg)
                    else:
                        bg.kill()
                        bg.wait()
                raise
            if bg is not None and load == "mpi":
                try:
                    row["loop"] = _loop_done(bg, span, look)
                except HpvcError as e:
                    row["load_failed"] = f"loop through the move: {e.line()}"
                if "loop" in row and "baseline" in row:
                    row["slowdown"] = report.slowdown(
                        int(row["baseline"]["round_trips"]), int(row["loop"]["round_trips"])
                    )
            elif bg is not None:
                row |= _writer_done(bg, span, look)
            if row.get("load_failed"):
                progress(f"{name} rep {rep} {load}: the load failed: {row['load_failed']}")
            progress(
                f"{name} rep {rep} {load}: {row['total_ms']} ms total,"
                f" {row['downtime_ms']} ms downtime, ping gap {row['ping_gap_ms']} ms"
            )
            rows.append(row)
    lifecycle.down(name, store, progress)
    return rows


def run(sizes_mib: list[int], reps: int = 3, secs: int = 10, progress: Progress = quiet,
        partial: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """The whole benchmark; ``partial``: the document so far is written there
    after each size (a run cut short keeps what it measured)."""
    preflight(sizes_mib, reps, secs)
    common.ensure_guest(IMAGE, progress)
    free = sum(n.free_mib for n in read_topology().numa_nodes)
    sizes, note = fitting(sizes_mib, free)
    if not sizes:
        raise InputError("--sizes", note, "give smaller sizes, e.g. --sizes 512MiB")
    doc: dict[str, Any] = {"benchmark": "migrate", **common.host_facts(mpi=True),
                           "accelerator": common.accelerator(), "sizes_mib": sizes,
                           "asked_mib": sizes_mib, "sized_down": note, "reps": reps,
                           "load_seconds": secs, "runs": []}  # fmt: skip
    with common.scratch_state("bench migrate", progress) as (tmp, store):
        files = list(_build(tmp))
        for mib in sizes:
            doc["runs"] += one_size(tmp, store, mib, reps, secs, files, progress)
            doc["table"] = report.table(doc["runs"])
            if partial is not None:
                partial.write_text(json.dumps(doc, indent=2) + "\n")
    return doc
