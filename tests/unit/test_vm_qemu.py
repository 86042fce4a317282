"""The direct-QEMU backend without root or QEMU: command-line bookkeeping, thread
classification on fake /proc trees, readiness, and the
start/pin/stop cycle against a fake QEMU (a small Python program that speaks
QMP on the -qmp socket and reports its own threads as vCPUs).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.backends.qemu import process as vm_qemu
from hpvc.backends.qemu import qmp
from hpvc.backends.vm import console
from hpvc.errors import HpvcError
from hpvc.host import procfs
from hpvc.host.journal import Journal
from hpvc.plan.model import NetworkPlan, NumaCell, Plan, PlannedNode, VcpuPin
from hpvc.render.context import RenderContext
from hpvc.render.qemu import QemuLaunch, QemuPinning, render_qemu

FAKE_QEMU = r"""
import json, os, signal, socket, sys, threading, time
argv = sys.argv[1:]
def opt(flag):
    return argv[argv.index(flag) + 1] if flag in argv else None
if "-fail" in argv:
    print("qemu-system-x86_64: -object memory-backend-ram: cannot allocate", file=sys.stderr)
    sys.exit(1)
if "-stubborn" in argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(float(opt("-delay") or 0))
tids, stop = [], threading.Event()
def vcpu():
    tids.append(threading.get_native_id())
    stop.wait()
for _ in range(int(opt("-vcpus") or 2)):
    threading.Thread(target=vcpu, daemon=True).start()
while len(tids) < int(opt("-vcpus") or 2):
    time.sleep(0.01)
path = opt("-qmp").split(",")[0][len("unix:"):]
with open(opt("-pidfile"), "w") as f:
    f.write(f"{os.getpid()}\n")
srv = socket.socket(socket.AF_UNIX)
srv.bind(path)
srv.listen(1)
cpus = [{"cpu-index": i, "thread-id": t, "qom-path": "", "target": "x86_64"}
        for i, t in enumerate(sorted(tids))]
mem = [{"id": "mem0", "size": 268435456, "merge": False, "dump": True, "prealloc": True,
        "share": False, "host-nodes": [0], "policy": "bind"}]
replies = {"query-cpus-fast": cpus, "query-memdev": mem,
           "query-memory-size-summary": {"base-memory": 268435456, "plugged-memory": 0},
           "query-kvm": {"enabled": False, "present": True},
           "query-status": {"status": "running", "running": True}}
greeting = {"QMP": {"version": {"qemu": {"major": 7, "minor": 2, "micro": 0},
                                "package": ""}, "capabilities": []}}
def serve(conn):
    conn.sendall(json.dumps(greeting).encode() + b"\n")
    buf, dec = "", json.JSONDecoder()
    while data := conn.recv(65536):
        buf += data.decode()
        while buf.strip():  # QMP is a stream of JSON objects, not lines
            try:
                msg, end = dec.raw_decode(buf.lstrip())
            except ValueError:
                break
            buf = buf.lstrip()[end:]
            reply = {"return": replies.get(msg["execute"], {})}
            if "id" in msg:
                reply["id"] = msg["id"]
            conn.sendall(json.dumps(reply).encode() + b"\n")
            if msg["execute"] == "quit" and "-stubborn" not in argv:
                sys.exit(0)
while True:
    conn, _ = srv.accept()
    serve(conn)
    conn.close()
"""


# --- command line and plan bookkeeping ---------------------------------------------------


def _plan(pinning: str = "dedicated") -> Plan:
    dedicated = pinning == "dedicated"
    node = PlannedNode(
        name="compute0",
        role="compute",
        kind="vm",
        host="local",
        partition="hpc",
        pinning=pinning,
        vcpus=(VcpuPin(0, 2 if dedicated else None, 0), VcpuPin(1, 3 if dedicated else None, 0)),
        cpuset=(2, 3),
        emulator_cpus=(0,) if dedicated else (2, 3),
        numa=(NumaCell(0, 0, 512, (0, 1)),),
        memory_mib=512,
        hugepages=None,
        mac="52:54:00:00:00:02",
        ip="10.217.0.2",
    )
    network = NetworkPlan("10.217.0.0/24", "10.217.0.1", 24, 9000, "hpvc-demo")
    return Plan("demo", "vm", "hpc", network, (node,), ())


def _launch(tmp: Path, pinning: str = "dedicated") -> QemuLaunch:
    plan = _plan(pinning)
    ctx = RenderContext(base_dir=str(tmp / "base"), run_dir=str(tmp / "run, with comma"))
    return render_qemu(plan, plan.nodes[0], ctx)


def test_name_and_files_of_a_rendered_command_line(tmp_path: Path) -> None:
    launch = _launch(tmp_path)
    assert vm_qemu.name_of(launch.argv) == "hpvc-demo-compute0,debug-threads=on"
    files = vm_qemu.launch_files(launch.argv)
    run = tmp_path / "run, with comma" / "demo" / "compute0"
    # The renderer doubles the comma in option strings; the paths come back whole.
    assert files.sockets == (str(run / "qmp.sock"), str(run / "console.sock"))
    assert launch.qmp_socket == str(run / "qmp.sock")
    assert files.pidfile == launch.pidfile == str(run / "qemu.pid")
    node_dir = tmp_path / "base" / "clusters" / "demo" / "nodes" / "compute0"
    # QEMU logs the serial console to a FIFO in the run folder, which hpvc's
    # console reader copies into the node's console.log, kept to its cap.
    assert files.logs == (str(run / "console.fifo"),)
    assert launch.console_fifo == str(run / "console.fifo")
    assert launch.console_log == str(node_dir / "console.log")


def test_the_serial_console_is_logged_to_the_fifo(tmp_path: Path) -> None:
    launch = _launch(tmp_path)
    chardevs = [launch.argv[i + 1] for i, a in enumerate(launch.argv) if a == "-chardev"]
    (console,) = [c for c in chardevs if c.startswith("socket,id=console0,")]
    fifo = str(tmp_path / "run,, with comma" / "demo" / "compute0" / "console.fifo")
    assert f",logfile={fifo}" in console
    assert "console.log" not in " ".join(launch.argv)  # QEMU never writes the log itself
    assert "logappend" not in console  # a new start's log starts empty: the reader's choice


def test_name_of_wants_exactly_one_name() -> None:
    with pytest.raises(HpvcError, match="one -name"):
        vm_qemu.name_of(["qemu", "-m", "1G"])


@pytest.mark.parametrize(
    ("pinning", "vcpus", "emulator"),
    [("dedicated", {10: {2}, 11: {3}}, (0,)), ("shared", {10: {2, 3}, 11: {2, 3}}, (2, 3))],
)
def test_vcpu_affinity_follows_the_plan(
    tmp_path: Path, pinning: str, vcpus: dict[int, set[int]], emulator: tuple[int, ...]
) -> None:
    launch = _launch(tmp_path, pinning)
    assert launch.pinning.emulator == emulator
    assert vm_qemu.vcpu_affinity(launch.pinning, {0: 10, 1: 11}) == vcpus


def test_vcpus_sharing_one_thread_get_the_union() -> None:
    pinning = QemuPinning(vcpus=((0, (2,)), (1, (3,))), emulator=(0,))
    assert vm_qemu.vcpu_affinity(pinning, {0: 7, 1: 7}) == {7: {2, 3}}


def test_vcpu_count_mismatch_is_an_error() -> None:
    pinning = QemuPinning(vcpus=((0, (2,)), (1, (3,))), emulator=(0,))
    with pytest.raises(HpvcError, match=r"plan has vCPUs 0-1, QEMU has 0"):
        vm_qemu.vcpu_affinity(pinning, {0: 7})


def test_planned_cpus_must_be_available() -> None:
    pinning = QemuPinning(vcpus=((0, (2,)), (1, (3,))), emulator=(0,))
    vm_qemu.check_cpus(pinning, {0, 1, 2, 3})
    with pytest.raises(HpvcError, match=r"planned CPUs 2-3 are not available .*may use 0-1"):
        vm_qemu.check_cpus(pinning, {0, 1})


def test_vcpu_threads_from_query_cpus_fast() -> None:
    reply = [{"cpu-index": 1, "thread-id": 21}, {"cpu-index": 0, "thread-id": 20}]
    assert qmp.vcpu_threads(reply) == {0: 20, 1: 21}
    with pytest.raises(HpvcError, match="thread-id"):
        qmp.vcpu_threads([{"cpu-index": 0}])
    with pytest.raises(HpvcError, match="unexpected reply"):
        qmp.vcpu_threads({"return": []})


def test_memdevs_are_typed() -> None:
    reply = [{"id": "mem0", "size": 1 << 27, "host-nodes": [1], "policy": "bind", "prealloc": True}]
    (m,) = qmp.memdevs(reply)
    assert m == {
        "id": "mem0",
        "size": 1 << 27,
        "host_nodes": [1],
        "policy": "bind",
        "prealloc": True,
        "share": False,
        "merge": False,
    }


# --- fake /proc ----------------------------------------------------------------------


def _fake_proc(root: Path, pid: int, tids: list[int], argv: list[str], state: str = "S") -> None:
    d = root / str(pid)
    for tid in tids:
        (d / "task" / str(tid)).mkdir(parents=True)
        (d / "task" / str(tid) / "comm").write_text(f"thread{tid}\n")
    (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    (d / "stat").write_text(f"{pid} (qemu-system-x86) {state} 1 {pid} {pid} 0 -1\n")


def test_emulator_threads_are_the_ones_without_a_vcpu(tmp_path: Path) -> None:
    _fake_proc(tmp_path, 100, [100, 101, 102, 103, 104], ["qemu"])
    tasks = procfs.task_ids(100, tmp_path)
    assert tasks == [100, 101, 102, 103, 104]
    assert vm_qemu.emulator_threads(tasks, [102, 103]) == [100, 101, 104]
    assert procfs.task_ids(999, tmp_path) == []


def test_qemu_is_recognised_by_its_name(tmp_path: Path) -> None:
    name = "hpvc-demo-compute0,debug-threads=on"
    _fake_proc(tmp_path, 100, [100], ["qemu", "-name", name, "-m", "1G"])
    _fake_proc(tmp_path, 200, [200], ["qemu", "-name", "hpvc-demo-compute1,debug-threads=on"])
    _fake_proc(tmp_path, 300, [300], ["bash", name])  # the name, but not after -name
    _fake_proc(tmp_path, 400, [400], [], state="Z")  # a zombie has no command line
    assert procfs.is_qemu(100, name, tmp_path)
    assert not procfs.is_qemu(300, name, tmp_path)
    assert not procfs.is_qemu(555, name, tmp_path)
    assert procfs.find_qemu(name, tmp_path) == [100]
    assert procfs.running(100, tmp_path)
    assert not procfs.running(400, tmp_path)
    assert not procfs.running(555, tmp_path)


# --- readiness -----------------------------------------------------------------------


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_wait_ready_sees_the_marker_appear(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    log.write_bytes(b"SeaBIOS\r\nhpvc-ready compute10\r\n")

    def boot() -> None:
        time.sleep(0.2)
        with open(log, "ab") as f:
            f.write(b"[ 1.0] init\r\nhpvc-ready compute1")  # no newline yet

    writer = threading.Thread(target=boot)
    writer.start()
    waited = console.wait_ready(log, "hpvc-ready compute1", 10, os.getpid())
    writer.join()
    assert 0.15 < waited < 10


def test_wait_ready_fails_early_when_qemu_exits(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    log.write_text("".join(f"line {i}\n" for i in range(30)) + "Kernel panic - not syncing\n")
    start = time.monotonic()
    with pytest.raises(HpvcError, match=r"exited before .*line 29 \| Kernel panic") as e:
        console.wait_ready(log, "hpvc-ready head0", 30, _dead_pid())
    assert time.monotonic() - start < 5
    assert "line 18 " not in e.value.why  # only the last lines


def test_wait_ready_times_out(tmp_path: Path) -> None:
    log = tmp_path / "missing.log"
    with pytest.raises(HpvcError, match=r"no 'hpvc-ready head0' after 0.2 s .*is empty"):
        console.wait_ready(log, "hpvc-ready head0", 0.2, os.getpid())


# --- a fake QEMU ---------------------------------------------------------------------


def _fake_launch(tmp: Path, name: str, *extra: str, vcpus: int = 2) -> QemuLaunch:
    script = tmp / "fake_qemu.py"
    script.write_text(FAKE_QEMU)
    run = tmp / "run"
    qmp, pidfile = str(run / "qmp.sock"), str(run / "qemu.pid")
    argv = (sys.executable, str(script), "-name", name, "-vcpus", str(vcpus), *extra)
    argv += ("-qmp", f"unix:{qmp},server=on,wait=off", "-pidfile", pidfile)
    allowed = sorted(os.sched_getaffinity(0))
    pins = tuple((i, (allowed[i % len(allowed)],)) for i in range(vcpus))
    pinning = QemuPinning(vcpus=pins, emulator=tuple(allowed))
    return QemuLaunch(argv=argv, pinning=pinning, tap="", qmp_socket=qmp, pidfile=pidfile)


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[tuple[Path, Journal, str]]:
    """A journal and a unique QEMU name; whatever is left is undone and checked."""
    journal = Journal(tmp_path / "journal")
    name = f"hpvc-fake{os.getpid()}-{tmp_path.name},debug-threads=on"
    yield tmp_path, journal, name
    errors = journal.undo_all()
    left = procfs.find_qemu(name)
    for pid in left:  # last resort, our own fake only
        if procfs.is_qemu(pid, name):
            os.kill(pid, 9)
    assert errors == []
    assert left == []


def test_start_pin_read_back_and_undo(fake: tuple[Path, Journal, str]) -> None:
    tmp, journal, name = fake
    launch = _fake_launch(tmp, name, "-delay", "0.3")
    pid = vm_qemu.start_qemu(journal, launch, log=tmp / "qemu.log")
    assert procfs.is_qemu(pid, name)
    assert Path(launch.pidfile).read_text().strip() == str(pid)
    pinned = vm_qemu.apply_pinning(launch.qmp_socket, pid, launch.pinning)
    for v in pinned["vcpus"]:
        assert os.sched_getaffinity(v["tid"]) == set(dict(launch.pinning.vcpus)[v["vcpu"]])
    assert pid in pinned["emulator_threads"]
    back = vm_qemu.read_back(pid, launch.qmp_socket)
    assert [v["cpus"] for v in back["vcpus"]] == [v["cpus"] for v in pinned["vcpus"]]
    assert {t["tid"] for t in back["emulator"]} >= {pid}
    assert back["memdevs"][0]["policy"] == "bind"
    assert back["kvm"] == {"enabled": False, "present": True}
    assert journal.undo_all() == []
    assert not procfs.running(pid)
    assert not Path(launch.qmp_socket).exists()
    assert not Path(launch.pidfile).exists()


def test_a_failing_qemu_reports_its_log(fake: tuple[Path, Journal, str]) -> None:
    tmp, journal, name = fake
    launch = _fake_launch(tmp, name, "-fail", "1")
    with pytest.raises(HpvcError, match=r"exited while starting.*cannot allocate"):
        vm_qemu.start_qemu(journal, launch, log=tmp / "qemu.log")
    assert [c.kind for c in journal.entries()] == ["qemu"]


def test_a_second_start_of_the_same_node_is_refused(fake: tuple[Path, Journal, str]) -> None:
    tmp, journal, name = fake
    launch = _fake_launch(tmp, name)
    pid = vm_qemu.start_qemu(journal, launch, log=tmp / "qemu.log")
    with pytest.raises(HpvcError, match=f"already running as PID {pid}"):
        vm_qemu.start_qemu(journal, launch, log=tmp / "qemu.log")


def test_stop_escalates_to_sigkill(
    fake: tuple[Path, Journal, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp, journal, name = fake
    monkeypatch.setattr(vm_qemu, "STOP_WAIT_S", (0.3, 0.3, 2.0))
    launch = _fake_launch(tmp, name, "-stubborn", "1")
    pid = vm_qemu.start_qemu(journal, launch, log=tmp / "qemu.log")
    start = time.monotonic()
    assert journal.undo_all() == []
    assert not procfs.running(pid)
    assert time.monotonic() - start > 0.5  # quit and SIGTERM were ignored


def test_undo_never_signals_a_reused_pid(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    pidfile = run / "qemu.pid"
    pidfile.write_text(f"{os.getpid()}\n")  # this test process: not the QEMU named below
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(run / "qmp.sock"))
    sock.close()
    journal = Journal(tmp_path / "journal")
    name = f"hpvc-gone{os.getpid()},debug-threads=on"
    qmp = str(run / "qmp.sock")
    journal.record("qemu", name=name, pidfile=str(pidfile), qmp=qmp, sockets=[qmp])
    assert journal.undo_all() == []
    assert not pidfile.exists()
    assert not (run / "qmp.sock").exists()


def test_qmp_waits_for_a_late_socket(tmp_path: Path) -> None:
    launch = _fake_launch(tmp_path, f"hpvc-late{os.getpid()}", "-delay", "0.5", vcpus=1)
    (tmp_path / "run").mkdir()
    child = subprocess.Popen(list(launch.argv))
    try:
        (reply,) = qmp.qmp(launch.qmp_socket, "query-status", pid=child.pid)
        assert reply == {"status": "running", "running": True}
    finally:
        child.kill()
        child.wait()


def test_qmp_gives_up_when_nothing_listens(tmp_path: Path) -> None:
    with pytest.raises(HpvcError, match=r"no answer after 0.2 s"):
        qmp.qmp(tmp_path / "none.sock", "query-status", connect_s=0.2)
