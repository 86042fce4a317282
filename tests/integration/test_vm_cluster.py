"""VM clusters for real, under TCG here (KVM where the host has vmx/svm)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.backends.vm import guest
from hpvc.cluster import lifecycle, ops
from hpvc.errors import HpvcError
from hpvc.host import qemu_user
from hpvc.plan import Plan
from hpvc.render import files as render_files
from hpvc.store import Store
from tests.helpers import requires
from tests.integration.test_cluster import bridge_and_mounts, clean_up, image_ready


def vm_leftovers(name: str, store: Store) -> list[str]:
    found: list[str] = []
    ps = subprocess.run(["ps", "-eo", "pid,stat,args"], capture_output=True, text=True, check=True)
    found += [
        line
        for line in ps.stdout.splitlines()
        if f"hpvc-{name}-" in line and "qemu" in line and " Z" not in line
    ]
    found += bridge_and_mounts(name)
    if (store.root / "clusters" / name).exists():
        found.append("state directory")
    if (store.root / "run" / name).exists():
        found.append(f"run directory {store.root / 'run' / name}")
    return found


def qemu_confinement(marker: str) -> dict[int, tuple[list[int], int]]:
    """Every running QEMU whose command line holds ``marker``: PID -> (its real,
    effective, saved and file-system uids; its seccomp mode), from /proc."""
    found: dict[int, tuple[list[int], int]] = {}
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace")
            if not entry.name.isdigit() or "qemu" not in argv or marker not in argv:
                continue
            fields = dict(
                line.split(":", 1) for line in (entry / "status").read_text().splitlines()
            )
        except OSError:
            continue  # gone meanwhile
        if fields["State"].split()[0] == "Z":
            continue
        found[int(entry.name)] = ([int(u) for u in fields["Uid"].split()], int(fields["Seccomp"]))
    return found


def assert_confined(marker: str, count: int, uid: int | None = None) -> int:
    """``count`` QEMUs of ``marker`` run, all as one non-root uid of hpvc's range
    (``uid`` when given), in seccomp filter mode (2); returns that uid."""
    seen = qemu_confinement(marker)
    assert len(seen) == count, seen
    uids = {u for ids, _ in seen.values() for u in ids}
    assert len(uids) == 1, seen
    (got,) = uids
    assert got != 0 and qemu_user.FIRST_UID <= got < qemu_user.FIRST_UID + qemu_user.COUNT, seen
    assert uid is None or got == uid, (uid, seen)
    assert {mode for _, mode in seen.values()} == {2}, seen
    return got


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    requires("root", "qemu", "ip")
    s = Store(tmp_path / "state")
    yield s
    clean_up(s, lambda name: vm_leftovers(name, s))


def vm_spec(tmp_path: Path, name: str, computes: int = 2) -> str:
    p = tmp_path / f"{name}.toml"
    p.write_text(
        f'name = "{name}"\nkind = "vm"\n'
        f'[network]\nsubnet = "10.218.{os.getpid() % 250}.0/24"\nmtu = 9000\n'
        '[tuning]\npinning = "shared"\nhugepages = "2M"\npartition = "commodity"\n'
        '[[nodes]]\nrole = "head"\nvcpus = 1\nmemory = "256MiB"\n'
        f'[[nodes]]\nrole = "compute"\ncount = {computes}\nvcpus = 1\nmemory = "256MiB"\n'
    )
    return str(p)


def assert_agent_key_reached_the_guests(
    name: str, store: Store, capfd: pytest.CaptureFixture[str], src: str, dst: str
) -> None:
    """The cluster's agent key reached its guests by fw_cfg (root's file in each):
    guest ``src`` runs a command on ``dst`` through its agent (hpvc-rsh), and no
    QEMU command line holds the key, only the fw_cfg entry naming its file."""
    key = (store.cluster_dir(name) / "agent.key").read_bytes()
    capfd.readouterr()
    rsh = ["sh", "-c", f"stat -c %a /run/hpvc/agent-key; hpvc-rsh {dst} hostname"]
    assert ops.exec_node(name, src, rsh, store) == 0
    assert capfd.readouterr().out.split() == ["600", dst]
    seen = 0
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"qemu-system" in argv.split(b"\0")[0] and f"hpvc-{name}-".encode() in argv:
            seen += 1
            assert b"name=opt/hpvc/agent-key,file=" in argv
            assert key not in argv and key.hex().encode() not in argv
    assert seen > 0


def test_vm_up_exec_run_status_down(
    store: Store,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    image_ready()
    name = f"v{os.getpid() % 10000}"
    pages_before = Path("/proc/sys/vm/nr_hugepages").read_text()
    over_ssh: list[list[str]] = []
    real_configure = guest.configure

    def configure(st: Store, plan: Plan, names: list[str]) -> None:
        over_ssh.append(names)
        real_configure(st, plan, names)

    monkeypatch.setattr(guest, "configure", configure)
    lifecycle.up(vm_spec(tmp_path, name), store)
    # The guests' init made /etc/hosts and the ARP table from the command line:
    # no ssh round after boot.
    assert over_ssh == []
    # The backend's own split of its start, and no "nodes" remainder beside it.
    assert set(store.get(name).phases) == {"image", "plan", "host", "start", "boot", "configure"}
    plan = store.get(name).the_plan()
    capfd.readouterr()
    assert ops.exec_node(name, "compute0", ["cat", "/etc/hosts"], store) == 0
    assert capfd.readouterr().out == render_files.hosts(plan)
    assert ops.exec_node(name, "compute0", ["ip", "neigh", "show", "dev", "eth0"], store) == 0
    neigh = capfd.readouterr().out
    for n in plan.nodes:
        if n.name != "compute0":
            assert f"{n.ip} lladdr {n.mac} PERMANENT" in neigh, neigh
    st = ops.status(name, store)
    assert [n["state"] for n in st["nodes"]] == ["running"] * 3
    # Every QEMU runs as the cluster's own uid (not root), under seccomp.
    uid = qemu_user.find(store.root, name)
    assert uid is not None
    assert assert_confined(f"hpvc-{name}-", 3, uid) == uid
    # Hugepages read back from the pool: the guests' memory is preallocated there.
    assert st["hugepages"] and all(p["in_use"] >= p["planned"] > 0 for p in st["hugepages"])
    for n in st["nodes"]:  # read back from QEMU: threads where the plan put them
        vm = n["vm"]
        assert [v["cpus"] for v in vm["vcpus"]] == [n["planned"]["cpus"]]
        cells = [m for m in vm["memdevs"] if not m["id"].startswith("ivshmem")]
        assert all(m["policy"] == "bind" and m["prealloc"] for m in cells)
        assert sum(m["size"] for m in cells) == 256 * 2**20
    capfd.readouterr()
    assert ops.exec_node(name, "compute1", ["sh", "-c", "hostname; cat /etc/hosts"], store) == 0
    out = capfd.readouterr().out
    assert out.startswith("compute1\n") and "head0" in out and "compute0" in out
    assert ops.exec_node(name, "compute0", ["ping", "-c1", "-W5", "compute1"], store) == 0
    capfd.readouterr()
    assert ops.run(name, ["hostname"], None, store) == 0
    assert sorted(capfd.readouterr().out.split()) == ["compute0", "compute1"]
    # Co-resident guests share an ivshmem region: one writes, another reads.
    write = ["hpvc-shm", "write", "0", f"hello-{name}"]
    assert ops.exec_node(name, "compute0", write, store) == 0
    capfd.readouterr()
    assert (
        ops.exec_node(name, "compute1", ["hpvc-shm", "read", "0", str(6 + len(name))], store) == 0
    )
    assert capfd.readouterr().out.strip() == f"hello-{name}"
    assert_agent_key_reached_the_guests(name, store, capfd, "compute0", "compute1")
    lifecycle.down(name, store)
    assert vm_leftovers(name, store) == []
    assert qemu_user.find(store.root, name) is None  # the uid is given back
    assert Path("/proc/sys/vm/nr_hugepages").read_text() == pages_before


def test_vm_failure_half_way_leaves_nothing(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image_ready()
    name = f"w{os.getpid() % 10000}"
    monkeypatch.setenv("HPVC_FAIL_AT", "node:compute0")
    with pytest.raises(HpvcError, match="injected failure"):
        lifecycle.up(vm_spec(tmp_path, name, computes=1), store)
    assert vm_leftovers(name, store) == []


def test_vm_scale_adds_a_guest_and_down_after_a_crash(store: Store, tmp_path: Path) -> None:
    import sys

    from tests.helpers import ROOT

    image_ready()
    name = f"x{os.getpid() % 10000}"
    lifecycle.up(vm_spec(tmp_path, name, computes=1), store)
    uid = assert_confined(f"hpvc-{name}-", 2)
    lifecycle.scale(name, {"compute": 2}, store)
    st = ops.status(name, store)
    assert [n["name"] for n in st["nodes"]] == ["head0", "compute0", "compute1"]
    assert all(n["state"] == "running" for n in st["nodes"])
    # The new guest's QEMU runs as the cluster's uid too; repinning it worked (status).
    assert assert_confined(f"hpvc-{name}-", 3) == uid
    assert all(n["vm"]["vcpus"] for n in st["nodes"]), st
    assert ops.exec_node(name, "compute0", ["ping", "-c1", "-W5", "compute1"], store) == 0
    # A scale that dies half-way (the process is killed) is cleaned by down.
    from hpvc.image import default_store

    env = {
        **os.environ,
        "HPVC_STATE_DIR": str(store.root),
        "HPVC_IMAGE_DIR": str(default_store()),
        "HPVC_FAIL_AT": "crash:node:compute2",
    }
    hpvc = [sys.executable, "-m", "hpvc"]
    r = subprocess.run([*hpvc, "scale", name, "compute=3"], env=env, cwd=ROOT, check=False)
    assert r.returncode == 70
    env.pop("HPVC_FAIL_AT")
    r = subprocess.run([*hpvc, "down", name], env=env, cwd=ROOT, check=False)
    assert r.returncode == 0
    assert vm_leftovers(name, store) == []
    assert qemu_user.find(store.root, name) is None
