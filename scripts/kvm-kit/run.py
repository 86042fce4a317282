"""KVM figures for issues 27 and 29 on a bare KVM host (a lent device machine).

This host (HOST-NOTES) cannot boot guests under KVM, so hpvc's migration and
ivshmem figures here are TCG's. A lent device machine has KVM but no QEMU, no
network and no hpvc set-up; scripts/kvm-kit/make-kit.sh carries this host's
QEMU (with its libraries and loader), hpvc's guest kernel and a bare guest
(native/bench/kvmguest.c as /init) there, and this script measures:

- migration: hpvc's own migration code (``hpvc.backends.vm.migration``:
  ``MigrationSettings()`` defaults, ``apply_settings``, ``listen``, ``start``,
  ``wait``) moving a guest of 1, 2 and 4 GiB into a new QEMU on the same
  host, idle and with a writer dirtying 64 MiB over and over (hpvc bench
  migrate's ``memwrite`` size); QEMU's total and downtime, and the guest's
  pause seen from outside: the longest silence of its 1 ms ticker on a serial
  port (a kvmclock guest's own clock stops while it is paused);
- ivshmem: the round trip of a cache-line ping-pong between two guests
  through an ivshmem-plain region mapped as hpvc maps it (BAR 2), against the
  same program in two host processes on a shared file, each pinned to the
  same two host CPUs.

The QEMU command line keeps what hpvc renders for a node (render/qemu.py:
q35 with mem-merge=off, -cpu host,-arch-capabilities, a preallocated RAM
backend, store-global-state=off) but has no disk, network or pinning plan:
these are figures for hpvc's migration engine and region, not for a whole
hpvc cluster. Repetitions alternate; results go to OUT/kvm.json as they come.

Usage: python3 scripts/kvm-kit/run.py --kit build/kvmkit --out DIR
       [--accel kvm|tcg] [--sizes 1024,2048,4096] [--reps 3] [--budget-s 400]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CPU_EXTRA = ""  # --cpu-extra: e.g. ",-cx16" (a PVM host's emulator fails at cmpxchg16b)


def probe() -> dict:
    """The host, and hpvc's own KVM probe (``hpvc.host.probe``: /dev/kvm usable,
    vmx/svm, PVM), which ``hpvc up`` and ``hpvc doctor`` use too."""
    from dataclasses import asdict

    from hpvc.host.probe import cpu_flags, probe_kvm

    kvm = probe_kvm()
    info = Path("/proc/cpuinfo").read_text().splitlines()
    return {
        "python": platform.python_version(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "cpu_model": next(
            (ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")), ""
        ),
        "hypervisor": "hypervisor" in cpu_flags(),
        "kvm": asdict(kvm),
        "accelerator": kvm.accelerator,
        "mem_kib": os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 1024,
    }


class Qemu:
    """One bare guest: QEMU from the kit, console to a file, ticker to a socket."""

    def __init__(
        self, kit: Path, work: Path, name: str, accel: str, mib: int, smp: int,
        append: str, extra: list[str] | None = None, incoming: bool = False,
    ) -> None:  # fmt: skip
        self.name = name
        self.console = work / f"{name}.console"
        self.qmp_path = str(work / f"{name}.qmp")
        self.tick_path = str(work / f"{name}.tick")
        cpu = ("host,-arch-capabilities" if accel == "kvm" else "max") + CPU_EXTRA
        accel_arg = "kvm" if accel == "kvm" else "tcg,thread=multi"
        argv = [
            str(kit / "lib" / "ld-linux-x86-64.so.2"), "--library-path", str(kit / "lib"),
            str(kit / "qemu-system-x86_64"), "-L", str(kit / "fw"),
            "-machine", "q35,mem-merge=off,memory-backend=mem0", "-accel", accel_arg,
            "-cpu", cpu, "-smp", str(smp), "-m", f"{mib}M",
            "-object", f"memory-backend-ram,id=mem0,size={mib}M,prealloc=on",
            "-global", "migration.store-global-state=off",
            "-nodefaults", "-display", "none", "-no-reboot",
            "-kernel", str(kit / "vmlinuz"), "-initrd", str(kit / "initrd.img"),
            "-append", f"console=ttyS0 quiet panic=-1 {append}",
            "-serial", f"file:{self.console}",
            "-chardev", f"socket,id=tick,path={self.tick_path},server=on,wait=off",
            "-serial", "chardev:tick",
            "-qmp", f"unix:{self.qmp_path},server=on,wait=off",
            *(extra or []),
            *(["-incoming", "defer"] if incoming else []),
        ]  # fmt: skip
        self.err = open(work / f"{name}.stderr", "w")  # noqa: SIM115
        env = {**os.environ, "QEMU_MODULE_DIR": str(kit / "modules")}
        self.proc = subprocess.Popen(argv, stdout=self.err, stderr=subprocess.STDOUT, env=env)
        self.runner = None

    def qmp(self):
        from hpvc.backends.vm.migration import socket_runner

        if self.runner is None:
            deadline = time.monotonic() + 20
            while not os.path.exists(self.qmp_path):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name}: no QMP socket: {self.tail()}")
                time.sleep(0.02)
            self.runner = socket_runner(self.qmp_path, self.proc.pid, command_s=30.0)
        return self.runner

    def tail(self) -> str:
        out = ""
        for p in (self.console, Path(self.err.name)):
            with contextlib.suppress(OSError):
                out += p.read_text(errors="replace")[-600:]
        return out

    def wait_line(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                for line in self.console.read_text(errors="replace").splitlines():
                    if line.startswith(prefix):
                        return line
                    if line.startswith("kg-error"):
                        raise RuntimeError(f"{self.name}: {line}")
            except FileNotFoundError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"{self.name}: no '{prefix}' in {timeout:g} s: {self.tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.err.close()


class Ticks:
    """Arrival times of the guest's 1 ms ticks on one or more serial sockets."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def follow(self, path: str) -> None:
        s = socket.socket(socket.AF_UNIX)
        deadline = time.monotonic() + 20
        while True:
            try:
                s.connect(path)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        s.settimeout(0.1)

        def run() -> None:
            while not self.stop.is_set():
                try:
                    data = s.recv(4096)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                t = time.monotonic()
                with self.lock:
                    self.times.extend([t] * len(data))
            s.close()

        th = threading.Thread(target=run, daemon=True)
        th.start()
        self.threads.append(th)

    def longest_gap_ms(self, start: float, end: float) -> float:
        with self.lock:
            ts = sorted(t for t in self.times if start <= t <= end)
        if len(ts) < 2:
            return float("nan")
        return max(b - a for a, b in itertools.pairwise(ts)) * 1000

    def close(self) -> None:
        self.stop.set()
        for th in self.threads:
            th.join(timeout=1)


def one_move(kit: Path, work: Path, accel: str, mib: int, write_mib: int, tag: str) -> dict:
    from hpvc.backends.vm import migration

    append = f"kg.mode=tick kg.write={write_mib}"
    src = Qemu(kit, work, f"src-{tag}", accel, mib, 2, append)
    dst = None
    ticks = Ticks()
    try:
        src.wait_line("kg-ready", 60)
        ticks.follow(src.tick_path)
        time.sleep(1.0)  # the writer has touched its pages: a steady dirtying rate
        dst = Qemu(kit, work, f"dst-{tag}", accel, mib, 2, append, incoming=True)
        settings = migration.MigrationSettings()
        uri = migration.unix_uri(str(work / f"mig-{tag}.sock"))
        migration.listen(dst.qmp(), settings, uri)
        ticks.follow(dst.tick_path)
        migration.apply_settings(src.qmp(), settings)
        t0 = time.monotonic()
        paused = migration.start(src.qmp(), uri)
        stats = migration.wait(src.qmp(), settings.timeout_s, paused=paused)
        t1 = time.monotonic()
        time.sleep(1.0)  # the target's ticks after the switch
        st = dst.qmp()("query-status")[0]
        gap = ticks.longest_gap_ms(t0 - 0.5, t1 + 0.9)
        after = len([t for t in ticks.times if t > t1])
        return {
            "mib": mib, "write_mib": write_mib, "accel": accel,
            "wall_ms": round((t1 - t0) * 1000, 1), "guest_gap_ms": round(gap, 1),
            "target_status": st.get("status") if isinstance(st, dict) else st,
            "ticks_after": after, **stats.as_dict(),
        }  # fmt: skip
    finally:
        ticks.close()
        for q in (src, dst):
            if q is not None:
                q.stop()


def shm_vm(kit: Path, work: Path, accel: str, cpus: tuple[int, int], n: int, tag: str) -> dict:
    region = Path("/dev/shm") / f"kvmkit-{os.getpid()}-{tag}"
    region.write_bytes(b"\0" * (1 << 20))
    extra = [
        "-object", f"memory-backend-file,id=ivshmem0,mem-path={region},size=1M,share=on",
        "-device", "ivshmem-plain,memdev=ivshmem0,master=on",
    ]  # fmt: skip
    guests: list[Qemu] = []
    try:
        for role, cpu in (("pong", cpus[1]), ("ping", cpus[0])):
            q = Qemu(kit, work, f"{role}-{tag}", accel, 256, 1, f"kg.mode={role} kg.n={n}", extra)
            guests.append(q)
            subprocess.run(["taskset", "-a", "-p", "-c", str(cpu), str(q.proc.pid)],
                           check=True, capture_output=True)  # fmt: skip
        line = guests[1].wait_line("kg-shm n=", 60)
        guests[0].wait_line("kg-shm pong", 30)
        return parse_shm(line)
    finally:
        for q in guests:
            q.stop()
        region.unlink(missing_ok=True)


def shm_native(kit: Path, cpus: tuple[int, int], n: int, tag: str) -> dict:
    region = Path("/dev/shm") / f"kvmkit-{os.getpid()}-{tag}"
    region.write_bytes(b"\0" * 4096)
    prog = str(kit / "kvmguest")
    try:
        pong = subprocess.Popen(["taskset", "-c", str(cpus[1]), prog, "pong", str(region), str(n)],
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
        ping = subprocess.run(["taskset", "-c", str(cpus[0]), prog, "ping", str(region), str(n)],
                              capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
        pong.communicate(timeout=30)
        return parse_shm(ping.stdout)
    finally:
        region.unlink(missing_ok=True)


def parse_shm(line: str) -> dict:
    fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
    return {k: int(fields[k]) for k in ("n", "min", "median", "p99")}


def summary(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kit", type=Path, default=ROOT / "build" / "kvmkit")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--accel", choices=("kvm", "tcg"), default="kvm")
    ap.add_argument("--sizes", default="1024,2048,4096")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--shm-n", type=int, default=200000)
    ap.add_argument("--budget-s", type=float, default=400)
    ap.add_argument("--cpu-extra", default="", help="appended to -cpu, e.g. ,-cx16")
    a = ap.parse_args()
    global CPU_EXTRA
    CPU_EXTRA = a.cpu_extra
    sys.path[:0] = [str(ROOT / "src"), str(a.kit / "py")]
    start = time.monotonic()
    a.out.mkdir(parents=True, exist_ok=True)
    work = Path(f"/tmp/kvmkit-{os.getpid()}")
    work.mkdir()
    res: dict = {"probe": probe(), "migrate": [], "shm": [], "errors": []}

    def save() -> None:
        (a.out / "kvm.json").write_text(json.dumps(res, indent=1) + "\n")

    save()
    print(json.dumps(res["probe"]), flush=True)
    if a.accel == "kvm" and not res["probe"]["kvm"]["usable"]:
        print("no usable /dev/kvm: nothing measured", flush=True)
        return 0
    ver = subprocess.run([str(a.kit / "lib" / "ld-linux-x86-64.so.2"), "--library-path",
                          str(a.kit / "lib"), str(a.kit / "qemu-system-x86_64"), "-version"],
                         capture_output=True, text=True)  # fmt: skip
    res["qemu"] = (ver.stdout or ver.stderr).splitlines()[0] if (ver.stdout or ver.stderr) else ""
    ncpu = os.cpu_count() or 2
    cpus = (ncpu - 2, ncpu - 1) if ncpu >= 4 else (0, 1)
    left = lambda: a.budget_s - (time.monotonic() - start)  # noqa: E731

    def measure(part: str, what: str, row: dict, run: Callable[[], dict]) -> None:
        """One measurement into res[part], or its error into res["errors"] (the
        next one runs); saved and printed as it comes."""
        try:
            row = {**row, **run()}
            res[part].append(row)
        except Exception as e:
            row = {"error": f"{what}: {e}"[:800]}
            res["errors"].append(row["error"])
        save()
        print(row, flush=True)

    try:
        for rep in range(a.reps):  # alternated: native and VM ping-pong, one each a round
            for kind in ("native", "vm") if rep % 2 == 0 else ("vm", "native"):
                if left() < 60:
                    break
                measure(
                    "shm", f"shm {kind} rep {rep}", {"kind": kind, "rep": rep, "cpus": list(cpus)},
                    lambda: shm_native(a.kit, cpus, a.shm_n, f"n{rep}") if kind == "native"  # noqa: B023
                    else shm_vm(a.kit, work, a.accel, cpus, a.shm_n, f"v{rep}"),  # noqa: B023
                )  # fmt: skip
        sizes = [int(s) for s in a.sizes.split(",")]
        cases = [(mib, w) for mib in sizes for w in (0, 64)]
        for rep in range(a.reps):  # alternated: every case once a round, rotated
            for i in range(len(cases)):
                mib, w = cases[(i + rep) % len(cases)]
                if left() < 40 + mib / 100:
                    res["errors"].append(f"budget: {mib} MiB write={w} rep {rep} not run")
                    continue
                measure(
                    "migrate", f"migrate {mib} MiB write={w} rep {rep}", {"rep": rep},
                    lambda: one_move(a.kit, work, a.accel, mib, w, f"{mib}-{w}-{rep}"),  # noqa: B023
                )  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
        res["wall_s"] = round(time.monotonic() - start, 1)
        save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
