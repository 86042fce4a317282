"""Container clusters for real: crun, namespaces, cgroups, bridge, MPI.

Each test gets its own state directory; a finalizer tears down whatever is
left even when the test fails, then checks that nothing of it remains on the
host (containers, netns, veths, bridge, cgroups, mounts, holder process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hpvc.cluster import lifecycle, ops
from hpvc.errors import DoesNotFit, HpvcError
from hpvc.store import Store
from tests.helpers import ROOT, requires

CGROUPS = Path("/sys/fs/cgroup")


def hpvc_cgroups(pattern: str) -> list[str]:
    """hpvc's cgroups named ``pattern`` in every hierarchy. A teardown running
    meanwhile may remove a hierarchy's hpvc folder under the walk: gone is gone."""
    found: list[str] = []
    for hierarchy in CGROUPS.iterdir():
        try:
            found += [str(p) for p in (hierarchy / "hpvc").glob(pattern) if p.exists()]
        except (FileNotFoundError, NotADirectoryError):
            continue
    return found


def leftovers(name: str) -> list[str]:
    """Everything a cluster called ``name`` could have left on this host."""
    found: list[str] = []
    r = subprocess.run(["crun", "list", "-q"], capture_output=True, text=True, check=False)
    found += [c for c in r.stdout.split() if c.startswith(f"hpvc-{name}-")]
    netns = Path("/run/netns")
    if netns.is_dir():
        found += [p.name for p in netns.iterdir() if p.name.startswith(f"hpvc-{name}-")]
    found += hpvc_cgroups(name)
    return found + bridge_and_mounts(name)


def bridge_and_mounts(name: str) -> list[str]:
    """The cluster's bridge and its mounts, if still there (any kind of cluster)."""
    found: list[str] = []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    if f" hpvc-{name}:" in links.stdout or f" hpvc-{name}@" in links.stdout:
        found.append(f"bridge hpvc-{name}")
    mounts = Path("/proc/self/mounts").read_text()
    found += [line.split()[1] for line in mounts.splitlines() if f"/clusters/{name}/" in line]
    return found


def clean_up(s: Store, left: Callable[[str], list[str]] = leftovers) -> None:
    """After a test: every cluster ``s`` still knows is torn down and leaves
    nothing (``left(name)`` lists what it would have left), then the host-wide
    changes of this state dir (kept while in use) go."""
    names = s.names() + [p.name for p in (s.root / "clusters").glob("*")]
    problems: list[str] = []
    for name in sorted(set(names)):  # every one, even after one fails
        try:
            lifecycle.teardown(s, name)
        except Exception as e:  # said below, once the others went too
            problems.append(f"teardown of {name}: {e}")
        if left(name):
            problems.append(f"left behind by {name}: {left(name)}")
    if not problems:
        s.host_journal().undo_all()
    assert problems == []


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    requires("root", "crun", "ip")
    s = Store(tmp_path / "state")
    yield s
    clean_up(s)


def spec_file(tmp_path: Path, name: str, extra: str = "", computes: int = 2) -> str:
    p = tmp_path / f"{name}.toml"
    p.write_text(
        f'name = "{name}"\nkind = "container"\n'
        f'[network]\nsubnet = "10.214.{os.getpid() % 250}.0/24"\nmtu = 9000\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        f"{extra}"
        '[[nodes]]\nrole = "head"\nvcpus = 1\nmemory = "256MiB"\n'
        f'[[nodes]]\nrole = "compute"\ncount = {computes}\nvcpus = 1\nmemory = "256MiB"\n'
    )
    return str(p)


def cli_env(store: Store) -> dict[str, str]:
    """Environment for `python -m hpvc` on this test's state, with the shared images."""
    from hpvc.image import default_store

    return {**os.environ, "HPVC_STATE_DIR": str(store.root), "HPVC_IMAGE_DIR": str(default_store())}


def image_ready() -> None:
    from hpvc.image import resolve_image

    requires("debootstrap")
    try:
        resolve_image("hpc")
    except HpvcError:
        from hpvc.image import build_image

        build_image("hpc")  # the first run on a machine builds it (cached afterwards)


def test_up_exec_status_run_scale_down(
    store: Store, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    image_ready()
    name = f"it{os.getpid() % 10000}"
    rec = lifecycle.up(spec_file(tmp_path, name), store)
    assert rec.status == "running"
    st = ops.status(name, store)
    assert [n["state"] for n in st["nodes"]] == ["running"] * 3
    for n in st["nodes"]:
        assert n["network"]["address"] == n["planned"]["ip"] and n["network"]["mtu"] == 9000
        assert n["limits"]["memory_limit"] == 256 * 2**20
    assert ops.exec_node(name, "compute0", ["sh", "-c", "grep -c compute /etc/hosts"], store) == 0
    assert capfd.readouterr().out.strip() == "2"
    assert ops.exec_node(name, "compute0", ["nosuchcmd"], store) == 127  # as shells say
    assert ops.exec_node(name, "compute0", ["/etc/hosts"], store) == 126
    assert ops.exec_node(name, "compute0", ["sh", "-c", "exit 255"], store) == 255
    capfd.readouterr()
    assert ops.run(name, ["hostname"], 2, store) == 0
    assert sorted(capfd.readouterr().out.split()) == ["compute0", "compute1"]
    done = ops.run(name, ["hostname"], 1, store, capture=True)
    assert not isinstance(done, int) and done.stdout.split() == ["compute0"]

    lifecycle.scale(name, {"compute": 3}, store)
    assert ops.status(name, store)["nodes"][-1]["state"] == "running"
    assert ops.exec_node(name, "compute0", ["sh", "-c", "grep -c compute /etc/hosts"], store) == 0
    assert capfd.readouterr().out.strip() == "3"
    lifecycle.scale(name, {"compute": 1}, store)
    assert [n["name"] for n in ops.status(name, store)["nodes"]] == ["head0", "compute0"]
    assert not any(x.endswith(("compute1", "compute2")) for x in leftovers(name))

    lifecycle.down(name, store)
    assert leftovers(name) == [] and store.names() == []


def test_failure_half_way_leaves_nothing(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image_ready()
    name = f"if{os.getpid() % 10000}"
    monkeypatch.setenv("HPVC_FAIL_AT", "node:compute0")
    with pytest.raises(HpvcError, match="injected failure"):
        lifecycle.up(spec_file(tmp_path, name), store)
    assert leftovers(name) == [] and store.names() == []


def test_crash_half_way_then_down_cleans(store: Store, tmp_path: Path) -> None:
    image_ready()
    name = f"ic{os.getpid() % 10000}"
    env = {**cli_env(store), "HPVC_FAIL_AT": "crash:node:compute0"}
    hpvc = [sys.executable, "-m", "hpvc"]
    r = subprocess.run([*hpvc, "up", spec_file(tmp_path, name)], env=env, cwd=ROOT, check=False)
    assert r.returncode == 70  # the process died mid-way, state and host changes remain
    assert leftovers(name) != [] and store.names() == [name]
    env.pop("HPVC_FAIL_AT")
    r = subprocess.run([*hpvc, "down", name], env=env, cwd=ROOT, check=False)
    assert r.returncode == 0
    assert leftovers(name) == [] and store.names() == []


def test_spec_that_does_not_fit_changes_nothing(store: Store, tmp_path: Path) -> None:
    image_ready()
    name = f"nf{os.getpid() % 10000}"
    path = Path(spec_file(tmp_path, name))
    path.write_text(path.read_text().replace('pinning = "shared"', 'pinning = "dedicated"'))
    path.write_text(path.read_text().replace("count = 2\nvcpus = 1", "count = 2\nvcpus = 64"))
    with pytest.raises(DoesNotFit, match="needs 64 dedicated CPUs"):
        lifecycle.up(str(path), store)
    assert leftovers(name) == [] and store.names() == []
    assert not (store.root / "clusters" / name).exists()


def test_cli_json_status_and_ls(store: Store, tmp_path: Path) -> None:
    image_ready()
    name = f"ij{os.getpid() % 10000}"
    env = cli_env(store)
    hpvc = [sys.executable, "-m", "hpvc"]
    out = subprocess.run(
        [*hpvc, "up", spec_file(tmp_path, name, computes=1), "--json"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out)["cluster"] == name
    ls = subprocess.run(
        [*hpvc, "ls", "--json"], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert [c["name"] for c in json.loads(ls.stdout)] == [name]
    subprocess.run([*hpvc, "down", name], env=env, cwd=ROOT, check=True)


def test_concurrent_ups_never_share_a_pinned_cpu(store: Store, tmp_path: Path) -> None:
    image_ready()
    cpus = len(os.sched_getaffinity(0))
    names = [f"cc{i}{os.getpid() % 1000}" for i in range(cpus + 1)]
    specs = []
    for i, name in enumerate(names):
        p = Path(spec_file(tmp_path, name, computes=1))
        text = p.read_text().replace('pinning = "shared"', 'pinning = "dedicated"')
        text = text.replace(f".{os.getpid() % 250}.0/24", f".{(os.getpid() + i) % 250}.0/24")
        p.write_text(
            text.replace('role = "head"\nvcpus = 1', 'role = "head"\ncount = 0\nvcpus = 1')
        )
        specs.append(str(p))
    hpvc = [sys.executable, "-m", "hpvc"]
    procs = [
        subprocess.Popen([*hpvc, "up", s], env=cli_env(store), cwd=ROOT, stderr=subprocess.PIPE)
        for s in specs
    ]
    errs = [p.communicate(timeout=120)[1].decode(errors="replace") for p in procs]
    codes = [p.returncode for p in procs]
    # One 1-vCPU pinned node per CPU fits; the one too many is refused (exit 2).
    assert sorted(codes) == [0] * cpus + [2], list(zip(codes, errs, strict=True))
    pinned = [
        c
        for name in store.names()
        for n in ops.status(name, store)["nodes"]
        for c in n["planned"]["cpus"]
    ]
    assert sorted(pinned) == sorted(os.sched_getaffinity(0))
    for name in store.names():  # and the kernel holds each node to its CPU
        for n in ops.status(name, store)["nodes"]:
            assert n["limits"]["cpus"] == str(n["planned"]["cpus"][0])
    for name in store.names():
        lifecycle.down(name, store)


def test_failed_scale_takes_back_its_nodes(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image_ready()
    name = f"is{os.getpid() % 10000}"
    lifecycle.up(spec_file(tmp_path, name, computes=1), store)
    monkeypatch.setenv("HPVC_FAIL_AT", "node:compute1")
    with pytest.raises(HpvcError, match="injected failure"):
        lifecycle.scale(name, {"compute": 2}, store)
    assert not any("compute1" in x for x in leftovers(name))
    assert store.get(name).status == "failed"
    monkeypatch.delenv("HPVC_FAIL_AT")
    lifecycle.down(name, store)
    assert leftovers(name) == []
