"""``hpvc migrate`` on one host, for real: TCG guests of the qemu backend.

One cluster for the module (head0 pinned 1:1 to one CPU, compute0 and compute1
floating, 256 MiB each, no ivshmem): a guest moves into a new QEMU while an MPI
ping-pong (native/bench/migloop.c, every answer checked) runs across the two
compute guests and ends right; a node that does not fit is refused with
exit 2 and nothing changed; a dying target (killed by its PID), a timeout and
Ctrl-C leave the node running where it was with nothing of the target left.
The migrations that must fail are slowed to 1 MiB/s so that they are still
under way when stopped. The cluster is taken down and checked clean even when
a test fails.
"""

from __future__ import annotations

import _thread
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.backends.vm.migration import MigrationFailed, MigrationSettings
from hpvc.cluster import lifecycle, ops
from hpvc.cluster.migrate import migrate
from hpvc.errors import DoesNotFit, InputError
from hpvc.host import procfs
from hpvc.store import Store
from tests.helpers import ROOT, requires
from tests.integration.test_cluster import clean_up, cli_env, image_ready
from tests.integration.test_vm_cluster import vm_leftovers

pytestmark = pytest.mark.integration
NAME = f"mg{os.getpid() % 10000}"
SLOW = {"bandwidth_mib_s": 1, "multifd": 0}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    requires("root", "qemu", "ip", "mpi")
    image_ready()
    tmp = tmp_path_factory.mktemp("migrate")
    store = Store(tmp / "state")
    spec = tmp / f"{NAME}.toml"
    spec.write_text(
        f'name = "{NAME}"\nkind = "vm"\n'
        f'[network]\nsubnet = "10.221.{os.getpid() % 250}.0/24"\nmtu = 9000\n'
        '[tuning]\npinning = "shared"\nhugepages = "2M"\npartition = "commodity"\n'
        'locality = "none"\n'
        '[[nodes]]\nrole = "head"\nvcpus = 1\nmemory = "256MiB"\npinning = "dedicated"\n'
        '[[nodes]]\nrole = "compute"\ncount = 2\nvcpus = 1\nmemory = "256MiB"\n'
    )
    try:
        lifecycle.up(str(spec), store)
        loop = tmp / "migloop"
        cc = ["mpicc", "-O2", "-o", str(loop), str(Path(ROOT) / "native" / "bench" / "migloop.c")]
        subprocess.run(cc, check=True)
        for node in ("compute0", "compute1"):
            with open(loop, "rb") as f:
                put = ["sh", "-c", "cat > /root/migloop && chmod +x /root/migloop"]
                argv = ops.exec_argv(NAME, node, put, store)
                subprocess.run(argv, stdin=f, check=True, timeout=60)
        yield store
    finally:
        clean_up(store, lambda name: vm_leftovers(name, store))
        assert not list(Path("/tmp").glob("hpvc-migrate-*"))


def answers(store: Store, node: str) -> bool:
    argv = ops.exec_argv(NAME, node, ["hostname"], store)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    return r.returncode == 0 and r.stdout.strip() == node


def target_left(store: Store, node: str) -> list[str]:
    """What a migration target of ``node`` could leave: its folders, socket folder, tap."""
    run = store.layout.node_run_dir(NAME, f"{node}~migrating")
    found = [str(p) for p in (run, store.node_dir(NAME, f"{node}~migrating")) if p.exists()]
    found += [str(p) for p in Path("/tmp").glob("hpvc-migrate-*")]
    from hpvc.render.context import tap_name

    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    plan = store.get(NAME).the_plan()
    ours = {tap_name(NAME, n.name) for n in plan.nodes} | {
        tap_name(NAME, f"{n.name}~migrating") for n in plan.nodes
    }
    taps = [t for t in ours if f" {t}:" in links or f" {t}@" in links]
    if len(taps) != len(plan.nodes):
        found.append(f"taps {sorted(taps)}")
    return found


def snapshot(store: Store) -> tuple[object, ...]:
    rec = store.get(NAME)
    return (
        rec.plan,
        rec.holdings,
        rec.pages,
        rec.status,
        Path("/proc/sys/vm/nr_hugepages").read_text(),
    )


def test_a_node_moves_while_an_mpi_job_runs_across_it(cluster: Store) -> None:
    store = cluster
    before = store.get(NAME).the_plan().node("compute1")
    old_pid = ops.node_pid(NAME, "compute1", store)
    job = subprocess.Popen(
        [sys.executable, "-m", "hpvc", "run", NAME, "-n", "2", "--", "/root/migloop", "120",
         "/root/stop"],
        env=cli_env(store), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        time.sleep(8)  # the ranks start (ssh into TCG guests) and loop
        assert job.poll() is None, job.communicate()[0]
        out = migrate(NAME, "compute1", store=store)
        out2 = migrate(NAME, "compute1", store=store)  # and again: the node's second tap
        time.sleep(2)  # round trips after the second move
        for node in ("compute0", "compute1"):  # rank 0 ends the loop within a second
            stop = ops.exec_argv(NAME, node, ["touch", "/root/stop"], store)
            subprocess.run(stop, check=True, timeout=60)
        text, _ = job.communicate(timeout=180)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 0, text
    assert "loop done:" in text and " 0 wrong" in text, text
    assert out["migration"]["bytes_sent"] > 0 and out["migration"]["total_ms"] > 0
    new_pid = ops.node_pid(NAME, "compute1", store)
    assert new_pid not in (old_pid, out["pid"]) and new_pid == out2["pid"]
    assert not procfs.running(old_pid)
    after = store.get(NAME).the_plan().node("compute1")
    assert (after.mac, after.ip, after.memory_mib, len(after.vcpus)) == (
        before.mac, before.ip, before.memory_mib, len(before.vcpus)
    )  # fmt: skip
    st = {n["name"]: n for n in ops.status(NAME, store)["nodes"]}
    assert st["compute1"]["state"] == "running"
    assert [v["cpus"] for v in st["compute1"]["vm"]["vcpus"]] == [list(after.cpuset)]
    assert answers(store, "compute1") and answers(store, "compute0")
    assert target_left(store, "compute1") == []
    assert store.get(NAME).status == "running"


def test_a_node_that_does_not_fit_is_refused_and_nothing_changes(cluster: Store) -> None:
    store = cluster
    head = store.get(NAME).the_plan().node("head0")
    pinned = list(head.cpuset)  # head0's CPU: a floating node may not use it
    was = snapshot(store)
    with pytest.raises(DoesNotFit) as e:
        migrate(NAME, "compute0", cpus=pinned, store=store)
    assert e.value.exit_code == 2 and "compute0 does not fit" in e.value.line()
    r = subprocess.run(
        [sys.executable, "-m", "hpvc", "migrate", NAME, "compute0", "--cpus", str(pinned[0])],
        env=cli_env(store), cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    with pytest.raises(InputError, match="lives on this host"):
        migrate(NAME, "compute0", to="elsewhere", store=store)
    assert snapshot(store) == was
    assert target_left(store, "compute0") == []


def _kill_target(store: Store, node: str, copying: threading.Event | None) -> threading.Thread:
    """Kill the target QEMU by its PID: once ``copying`` is set (the migration
    reported progress), or, without it, as soon as its pid file appears."""
    pidfile = store.layout.node_run_dir(NAME, f"{node}~migrating") / "qemu.pid"

    def kill() -> None:
        if copying is not None and not copying.wait(120):
            return
        for _ in range(12000):
            pid = procfs.read_pidfile(pidfile)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)  # the target QEMU, by its PID
                return
            time.sleep(0.01)

    t = threading.Thread(target=kill)
    t.start()
    return t


@pytest.mark.parametrize("how", ["target-died", "target-died-starting", "timeout", "interrupted"])
def test_a_failed_migration_leaves_the_node_running_where_it_was(cluster: Store, how: str) -> None:
    """The target dying mid-copy or while it starts, a timeout and Ctrl-C all
    end in one ``MigrationFailed``: the guest as it was, the target gone."""
    store = cluster
    was = snapshot(store)
    pid = ops.node_pid(NAME, "compute0", store)
    settings = MigrationSettings(**SLOW, timeout_s=3.0 if how == "timeout" else 120.0)
    copying = threading.Event()
    killer = None
    if how.startswith("target-died"):
        killer = _kill_target(store, "compute0", copying if how == "target-died" else None)
    timer = threading.Timer(3.0, _thread.interrupt_main) if how == "interrupted" else None
    if timer:
        timer.start()
    lines: list[str] = []

    def progress(line: str) -> None:
        lines.append(line)
        if line.startswith("migrating:"):
            copying.set()

    try:
        with pytest.raises(MigrationFailed) as e:
            migrate(NAME, "compute0", settings=settings, store=store, progress=progress)
    finally:
        copying.set()  # a killer still waiting ends
        if killer:
            killer.join()
        if timer:
            timer.cancel()
    reason = "target-died" if how.startswith("target-died") else how
    assert e.value.reason == reason or (reason == "target-died" and e.value.reason == "failed")
    if reason == "target-died":
        assert "the target QEMU exited" in e.value.why
    if how == "target-died-starting":
        assert not any(line.startswith("migrating:") for line in lines), lines
    assert "keeps running where it was" in e.value.line()
    assert ops.node_pid(NAME, "compute0", store) == pid
    assert answers(store, "compute0")
    assert snapshot(store) == was
    assert target_left(store, "compute0") == []


def test_a_container_node_is_refused_in_one_line_and_nothing_changes(tmp_path: Path) -> None:
    """Container nodes cannot move (Debian's crun has no CRIU): refused before
    anything is booked, exit 2, the node and the record as they were."""
    from tests.integration.test_cluster import spec_file

    requires("root", "crun", "ip")
    store = Store(tmp_path / "state")
    name = f"mc{os.getpid() % 10000}"
    try:
        lifecycle.up(spec_file(tmp_path, name, computes=1), store)
        rec = store.get(name)
        was = (rec.plan, rec.holdings, rec.pages, rec.status)
        pid = ops.node_pid(name, "compute0", store)
        r = subprocess.run(
            [sys.executable, "-m", "hpvc", "migrate", name, "compute0"],
            env=cli_env(store), cwd=ROOT, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "container nodes cannot be live-migrated" in r.stderr
        rec = store.get(name)
        assert (rec.plan, rec.holdings, rec.pages, rec.status) == was
        assert ops.node_pid(name, "compute0", store) == pid
        st = {n["name"]: n["state"] for n in ops.status(name, store)["nodes"]}
        assert st["compute0"] == "running"
    finally:
        clean_up(store)


USERFAULTFD = Path("/proc/sys/vm/unprivileged_userfaultfd")


def _put_memwrite(store: Store, tmp: Path) -> None:
    exe = tmp / "memwrite"
    src = Path(ROOT) / "native" / "bench" / "memwrite.c"
    subprocess.run(["cc", "-O2", "-Wall", "-Werror", "-o", str(exe), str(src)], check=True)
    with open(exe, "rb") as f:
        put = ["sh", "-c", "cat > /root/memwrite && chmod +x /root/memwrite"]
        argv = ops.exec_argv(NAME, "compute1", put, store)
        subprocess.run(argv, stdin=f, check=True, timeout=60)


def _copied_stopped(store: Store, node: str) -> bool:
    """Whether ``node``'s QEMU gets a stopped copy (TCG before QEMU 9.0)."""
    from hpvc.backends.vm import migration

    sock = store.layout.node_run_dir(NAME, node) / "qmp.sock"
    return migration.copied_stopped(
        migration.socket_runner(str(sock), ops.node_pid(NAME, node, store))
    )


def test_postcopy_moves_a_node_under_the_memory_writer(cluster: Store, tmp_path: Path) -> None:
    """--postcopy. Where the node's QEMU copies it stopped (TCG before QEMU 9.0:
    a live copy loses guest writes, docs/vms.md) it is refused in one line, exit
    2, nothing changed, whatever the sysctl says. Elsewhere (KVM): refused in
    one line while the host keeps userfaultfd from the QEMU's uid (nothing
    changed); with it allowed, compute1 moves while native/bench/memwrite.c
    writes 64 MiB in it, the switch to postcopy is made (precopy cannot
    converge: 1 ms downtime, 64 MiB/s), and every page the writer checks
    afterwards holds what it wrote. The sysctl is put back."""
    store = cluster
    settings = MigrationSettings(
        postcopy=True, multifd=0, bandwidth_mib_s=64, downtime_ms=1, auto_converge=False
    )
    if _copied_stopped(store, "compute1"):
        was = snapshot(store)
        r = subprocess.run(
            [sys.executable, "-m", "hpvc", "migrate", NAME, "compute1", "--postcopy"],
            env=cli_env(store), cwd=ROOT, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "there is no postcopy phase" in r.stderr and "KVM host" in r.stderr, r.stderr
        assert snapshot(store) == was and target_left(store, "compute1") == []
        return
    _put_memwrite(store, tmp_path)
    sysctl_was = USERFAULTFD.read_text()
    writer: subprocess.Popen[str] | None = None
    try:
        USERFAULTFD.write_text("0\n")
        was = snapshot(store)
        with pytest.raises(InputError) as e:
            migrate(NAME, "compute1", settings=settings, store=store)
        assert e.value.exit_code == 2 and "vm.unprivileged_userfaultfd=1" in e.value.line()
        assert snapshot(store) == was and target_left(store, "compute1") == []
        USERFAULTFD.write_text("1\n")
        old_pid = ops.node_pid(NAME, "compute1", store)
        argv = ops.exec_argv(NAME, "compute1", ["/root/memwrite", "64", "25"], store)
        writer = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(4)  # the writer holds its memory and loops
        assert writer.poll() is None, writer.communicate()[0]
        out = migrate(NAME, "compute1", settings=settings, store=store)
        text, _ = writer.communicate(timeout=180)
    finally:
        USERFAULTFD.write_text(sysctl_was)
        if writer is not None and writer.poll() is None:
            writer.kill()
            writer.wait()
    assert out["migration"]["postcopy"] is True, out["migration"]
    assert writer.returncode == 0 and " 0 wrong" in text, text
    assert ops.node_pid(NAME, "compute1", store) == out["pid"] != old_pid
    assert not procfs.running(old_pid)
    assert answers(store, "compute1")
    assert target_left(store, "compute1") == []
    assert store.get(NAME).status == "running"


def _mac(ifname: str) -> str:
    out = subprocess.run(["ip", "-j", "link", "show", ifname], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    return str(json.loads(out)[0]["address"])


def test_the_host_keeps_its_mac_on_the_bridge_when_a_node_moves(cluster: Store) -> None:
    """The moving node's tap is given the lowest MAC on the bridge, which a bridge
    whose address was never set would take as its own and lose with the tap at
    the switch: the guests' ARP entry for the host (their gateway, ssh's and
    mpirun's peer) would point nowhere. The bridge keeps its MAC through the
    move, and each guest's entry for the host still names it."""
    from hpvc.backends.qemu.migrate import current_tap

    store = cluster
    net = store.get(NAME).the_plan().network
    tap = current_tap(procfs.cmdline(ops.node_pid(NAME, "compute1", store)) or [])
    assert tap is not None
    subprocess.run(["ip", "link", "set", tap, "address", "02:00:00:00:00:01"], check=True)
    before = _mac(net.bridge)
    out = migrate(NAME, "compute1", store=store)
    assert _mac(net.bridge) == before
    assert out["answers_ping"] is True  # hpvc migrate's own look after the switch
    for node in ("compute0", "compute1"):
        look = ["sh", "-c", f"ip neigh show {net.gateway} dev eth0"]
        argv = ops.exec_argv(NAME, node, look, store)
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        assert r.returncode == 0, (node, r.stderr)
        assert before in r.stdout or not r.stdout.strip(), (node, r.stdout)
    assert target_left(store, "compute1") == []
