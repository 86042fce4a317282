"""A dead node comes back (issue 17, point 7): `hpvc restart` on real crun,
QEMU and libvirt nodes whose process was killed outright (SIGKILL, by the PID
hpvc reports for the node: only processes of the test's own cluster).

Each cluster here has its own state directory and a subnet no other test uses
(10.223/10.224/10.225.<pid>.0/24); the fixtures take down what a failed test
left and check that nothing of it remains. Traffic only between the nodes on
the cluster's own bridge. One VM test per VM backend, smallest clusters: under
TCG every boot costs seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.cluster import lifecycle, ops
from hpvc.cluster.restart import restart
from hpvc.errors import HpvcError
from hpvc.host import qemu_user
from hpvc.store import Store
from hpvc.units import format_cpulist
from tests.helpers import ROOT, requires
from tests.integration.test_cluster import clean_up, cli_env, image_ready, leftovers, spec_file
from tests.integration.test_vm_cluster import assert_confined, store, vm_leftovers, vm_spec
from tests.integration.test_vm_libvirt import (
    PrivateLibvirtd,
    answers_then_goes,
    domain_names,
    libvirtd,
    teardown_all,
)

# Fixtures shared with test_vm_libvirt (a private libvirtd) and test_vm_cluster
# (the VM clusters' state, torn down after each test).
__all__ = ["libvirtd", "store"]

NET = os.getpid() % 250
HPVC = [sys.executable, "-m", "hpvc"]


@pytest.fixture
def ct_store(tmp_path: Path) -> Iterator[Store]:
    requires("root", "crun", "ip")
    s = Store(tmp_path / "state")
    yield s
    clean_up(s)


def state_of(store: Store, name: str, node: str) -> str:
    """The node's state as its runtime reports it (what status and exec read)."""
    backend, env = lifecycle.open_env(store, store.get(name))
    plan = env.rec.the_plan()
    return backend.node_state(env, plan, plan.node(node))


def kill_node(store: Store, name: str, node: str) -> int:
    """SIGKILL the node's main process (container init, QEMU); wait until it is dead."""
    pid = ops.node_pid(name, node, store)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while state_of(store, name, node) == "running":
        assert time.monotonic() < deadline, f"{node} still runs after SIGKILL"
        time.sleep(0.1)
    return pid


def cpus_allowed(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list for {pid}")


def hpvc(store: Store, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HPVC, *args], env=cli_env(store), cwd=ROOT, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


def node_pids(store: Store, name: str, nodes: list[str]) -> dict[str, int]:
    return {n: ops.node_pid(name, n, store) for n in nodes}


def test_a_dead_container_comes_back_with_its_address_and_cpus(
    ct_store: Store, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    store = ct_store
    image_ready()
    name = f"rc{os.getpid() % 10000}"
    spec = Path(spec_file(tmp_path, name, computes=2))
    spec.write_text(spec.read_text().replace('"10.214.', '"10.223.'))
    lifecycle.up(str(spec), store)
    plan = store.get(name).the_plan()
    node = plan.node("compute1")
    before = node_pids(store, name, ["head0", "compute0", "compute1"])
    assert cpus_allowed(before["compute1"]) == format_cpulist(node.cpuset)

    dead = kill_node(store, name, "compute1")
    assert dead == before["compute1"]
    r = hpvc(store, "exec", name, "compute1", "--", "true")
    assert r.returncode == 1 and "is stopped, not running" in r.stderr, r

    r = hpvc(store, "restart", name, "--json")  # no node named: every node that is down
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [(d["node"], d["was"], d["restarted"], d["state"]) for d in out["nodes"]] == [
        ("head0", "running", False, "running"),
        ("compute0", "running", False, "running"),
        ("compute1", "stopped", True, "running"),
    ]
    assert out["status"]["status"] == "running"
    after = node_pids(store, name, ["head0", "compute0", "compute1"])
    assert after["compute1"] != dead
    assert {n: after[n] for n in ("head0", "compute0")} == {
        n: before[n] for n in ("head0", "compute0")
    }  # the others were not touched
    # Same CPUs, address, MAC and limits, read back from the kernel.
    assert cpus_allowed(after["compute1"]) == format_cpulist(node.cpuset)
    st = {n["name"]: n for n in ops.status(name, store)["nodes"]}["compute1"]
    assert (st["state"], st["network"]["address"], st["network"]["mac"]) == (
        "running", node.ip, node.mac,
    )  # fmt: skip
    assert st["limits"]["memory_limit"] == 256 * 2**20
    capfd.readouterr()
    assert ops.exec_node(name, "compute1", ["ip", "-4", "-o", "addr", "show", "eth0"], store) == 0
    assert f" {node.ip}/{plan.network.prefixlen} " in capfd.readouterr().out
    assert ops.exec_node(name, "compute0", ["ping", "-c1", "-W5", "compute1"], store) == 0
    assert ops.exec_node(name, "compute1", ["ping", "-c1", "-W5", "head0"], store) == 0
    capfd.readouterr()
    assert ops.run(name, ["hostname"], 2, store) == 0  # MPI over both computes again
    assert sorted(capfd.readouterr().out.split()) == ["compute0", "compute1"]

    # A node that runs is left alone unless --force; an unknown node is refused.
    r = hpvc(store, "restart", name, "compute0")
    assert r.returncode == 0 and "node compute0 runs: left as it is" in r.stderr, r
    assert ops.node_pid(name, "compute0", store) == before["compute0"]
    r = hpvc(store, "restart", name, "compute7")
    assert r.returncode == 2, r
    assert r.stderr.strip().splitlines() == [
        f"hpvc: node 'compute7': not in cluster {name!r} (one of: head0, compute0, compute1)"
    ]
    done = restart(name, ["compute0"], store, force=True)
    assert [(d.node, d.restarted, d.state) for d in done] == [("compute0", True, "running")]
    assert ops.node_pid(name, "compute0", store) != before["compute0"]

    lifecycle.down(name, store)
    assert leftovers(name) == []


def test_a_restart_that_fails_leaves_the_node_stopped_and_can_be_retried(
    ct_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ct_store
    image_ready()
    name = f"rf{os.getpid() % 10000}"
    spec = Path(spec_file(tmp_path, name, computes=1))
    spec.write_text(spec.read_text().replace('"10.214.', '"10.223.'))
    lifecycle.up(str(spec), store)
    head = ops.node_pid(name, "head0", store)
    kill_node(store, name, "compute0")
    monkeypatch.setenv("HPVC_FAIL_AT", "node:compute0")
    with pytest.raises(HpvcError, match="injected failure"):
        restart(name, None, store)
    monkeypatch.delenv("HPVC_FAIL_AT")
    assert state_of(store, name, "compute0") == "missing"
    assert store.node_journal(name, "compute0").entries() == []  # all of it undone
    left = [x for x in leftovers(name) if x.endswith("compute0")]
    assert left == []
    assert store.get(name).status == "running" and ops.node_pid(name, "head0", store) == head
    done = restart(name, None, store)
    assert [(d.node, d.was, d.restarted) for d in done] == [
        ("head0", "running", False),
        ("compute0", "missing", True),
    ]
    assert state_of(store, name, "compute0") == "running"
    lifecycle.down(name, store)
    assert leftovers(name) == []


def test_a_dead_qemu_comes_back_pinned_and_reachable(
    store: Store, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    image_ready()
    name = f"rv{os.getpid() % 10000}"
    spec = Path(vm_spec(tmp_path, name, computes=1))
    spec.write_text(spec.read_text().replace('"10.218.', '"10.224.'))
    lifecycle.up(str(spec), store)
    head = ops.node_pid(name, "head0", store)
    dead = kill_node(store, name, "compute0")
    with pytest.raises(HpvcError, match="is stopped, not running"):
        ops.exec_argv(name, "compute0", ["true"], store)

    done = restart(name, None, store)
    assert [(d.node, d.was, d.restarted, d.state) for d in done] == [
        ("head0", "running", False, "running"),
        ("compute0", "stopped", True, "running"),
    ]
    assert ops.node_pid(name, "head0", store) == head
    assert ops.node_pid(name, "compute0", store) != dead
    # The new QEMU drops to the cluster's uid again, sandboxed like the head's.
    uid = qemu_user.find(store.root, name)
    assert uid is not None
    assert_confined(f"hpvc-{name}-", 2, uid)
    status = ops.status(name, store)
    # The pages the dead QEMU held went back to the pool; the new one holds them again.
    assert status["hugepages"]
    assert all(p["in_use"] >= p["planned"] > 0 for p in status["hugepages"])
    st = {n["name"]: n for n in status["nodes"]}["compute0"]
    vm = st["vm"]  # read back from QEMU: its threads where the plan put them
    assert [v["cpus"] for v in vm["vcpus"]] == [st["planned"]["cpus"]]
    cells = [m for m in vm["memdevs"] if not m["id"].startswith("ivshmem")]
    assert all(m["policy"] == "bind" and m["prealloc"] for m in cells)
    assert sum(m["size"] for m in cells) == 256 * 2**20  # on the cluster's hugepages again
    capfd.readouterr()
    assert ops.exec_node(name, "compute0", ["hostname"], store) == 0
    assert capfd.readouterr().out.strip() == "compute0"
    assert ops.exec_node(name, "head0", ["ping", "-c1", "-W5", "compute0"], store) == 0
    assert ops.exec_node(name, "compute0", ["ping", "-c1", "-W5", "head0"], store) == 0

    lifecycle.down(name, store)
    assert vm_leftovers(name, store) == []


def test_a_dead_libvirt_domain_comes_back(
    libvirtd: PrivateLibvirtd,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    image_ready()
    monkeypatch.setenv("HPVC_LIBVIRT_URI", libvirtd.uri)
    store = Store(tmp_path / "state")
    name = f"rl{os.getpid() % 10000}"
    spec = tmp_path / f"{name}.toml"
    spec.write_text(
        f'name = "{name}"\nkind = "vm"\nbackend = "libvirt"\n'
        f'[network]\nsubnet = "10.225.{NET}.0/24"\nmtu = 9000\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        '[[nodes]]\nrole = "compute"\nvcpus = 1\nmemory = "256MiB"\n'
    )
    try:
        lifecycle.up(str(spec), store)
        uid = assert_confined(f"guest=hpvc-{name}-", 1)  # libvirt's QEMU: the cluster's uid
        dead = kill_node(store, name, "compute0")
        done = restart(name, ["compute0"], store)
        assert [(d.node, d.was, d.restarted, d.state) for d in done] == [
            ("compute0", "stopped", True, "running")
        ]
        assert domain_names(libvirtd) == [f"hpvc-{name}-compute0"]
        assert ops.node_pid(name, "compute0", store) != dead
        assert_confined(f"guest=hpvc-{name}-", 1, uid)
        st = ops.status(name, store)["nodes"][0]
        assert [v["cpus"] for v in st["vm"]["vcpus"]] == [st["planned"]["cpus"]]
        answers_then_goes(libvirtd, store, name, capfd)
    finally:
        teardown_all(store)
