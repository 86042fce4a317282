"""Other users reach nothing of a node (issue 13), on real crun nodes.

A review planted files in another job's /tmp and /dev/shm through the state
directory: its folders were 0755 and led to every node's overlay root and
shared memory. Here a container cluster is brought up in a state directory
that everyone may enter (as /var/lib/hpvc is when a package or an older hpvc
made it), and nobody (uid 65534) tries to list, read and write the cluster's
folder, a node's root, the backing of its /tmp and /dev/shm, and its state
files: every attempt must fail with EACCES, while the node keeps working for
root and for an ordinary user inside it (as a Slurm task is).

A tenant's cluster (``up_spec(..., tenant=True)``, what Slurm shares use) has
its nodes' roots mounted nosuid,nodev: a setuid binary of the image run by an
ordinary user inside gains nothing; root's own cluster is unchanged.

Each test has its own state directory; the fixture tears down whatever is
left, even when the test fails, and checks nothing remains on the host.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpvc.cluster import lifecycle, ops
from hpvc.spec import load_spec
from hpvc.store import Store
from tests.helpers import ROOT, requires
from tests.integration.test_cluster import image_ready, leftovers, spec_file

NOBODY = 65534

# Runs as nobody: each (operation, path) -> "ok" or the errno's name.
PROBE = r"""
import errno, json, os, sys
out = []
for op, path in json.loads(sys.argv[1]):
    try:
        if op == "list":
            os.listdir(path)
        elif op == "read":
            open(path, "rb").close()
        elif op == "plant":
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        elif op == "append":
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
        out.append("ok")
    except OSError as e:
        out.append(errno.errorcode.get(e.errno, str(e.errno)))
print(json.dumps(out))
"""


@pytest.fixture
def open_store() -> Iterator[Store]:
    """A state directory every user may enter and list (like a 0755 /var/lib/hpvc):
    what keeps other users out must be hpvc's own folders in it."""
    requires("root", "crun", "ip")
    base = Path(tempfile.mkdtemp(prefix="hpvc-tenant-test-"))
    try:
        os.chmod(base, 0o755)
        (base / "state").mkdir()
        os.chmod(base / "state", 0o755)
        s = Store(base / "state")
        try:
            yield s
        finally:
            clusters = s.root / "clusters"
            names = s.names() + ([p.name for p in clusters.iterdir()] if clusters.is_dir() else [])
            left: dict[str, list[str]] = {}
            for name in set(names):
                lifecycle.teardown(s, name)
                left[name] = leftovers(name)
            s.host_journal().undo_all()
            assert all(v == [] for v in left.values()), f"left behind: {left}"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@functools.cache
def nobody_python() -> str | None:
    """A Python of this version that nobody may run (this one may sit in /root)."""
    want = f"{sys.version_info[0]}.{sys.version_info[1]}"
    candidates = [sys.executable, getattr(sys, "_base_executable", ""), "/usr/bin/python3"]
    candidates += [shutil.which(f"python{want}") or "", shutil.which("python3") or ""]
    for exe in dict.fromkeys(c for c in candidates if c):
        try:
            r = as_nobody([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
        except OSError:
            continue
        if r.returncode == 0 and r.stdout.strip() == want:
            return exe
    return None


def as_nobody(
    argv: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        cwd="/",
        env=env or {"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def probe(what: list[tuple[str, Path]]) -> dict[str, str]:
    exe = nobody_python()
    if exe is None:
        pytest.fail("no Python that uid 65534 may run (install python3)")
    r = as_nobody([exe, "-c", PROBE, json.dumps([(op, str(p)) for op, p in what])])
    assert r.returncode == 0, r.stderr
    return {f"{op} {p}": got for (op, p), got in zip(what, json.loads(r.stdout), strict=True)}


def hpvc_as_nobody(store: Store, *args: str) -> subprocess.CompletedProcess[str]:
    """``hpvc ARGS`` run by nobody on ``store`` (this checkout, this venv's packages)."""
    exe = nobody_python()
    if exe is None:
        pytest.fail("no Python that uid 65534 may run (install python3)")
    paths = [os.path.join(ROOT, "src"), sysconfig.get_paths()["purelib"]]
    code = f"import sys; sys.path[:0] = {paths!r}; from hpvc.cli import main; main()"
    env = {
        "PATH": "/usr/bin:/bin",
        "HPVC_STATE_DIR": str(store.root),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return as_nobody([exe, "-c", code, *args], env=env)


def in_node_as_nobody(pid: int, script: str) -> subprocess.CompletedProcess[str]:
    """``sh -c script`` inside the node's mount namespace as uid 65534, as a
    Slurm task runs there (nsenter: the node's root is its root)."""
    return subprocess.run(
        ["nsenter", "-t", str(pid), "-m", "-S", str(NOBODY), "-G", str(NOBODY), "--",
         "/bin/sh", "-c", script],
        env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def test_other_users_reach_nothing_of_a_running_cluster(
    open_store: Store, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    image_ready()
    store = open_store
    name = f"tp{os.getpid() % 10000}"
    lifecycle.up(spec_file(tmp_path, name), store)

    # The nodes work: root inside, files in /tmp, /dev/shm shared by co-resident nodes.
    assert (
        ops.exec_node(name, "compute0", ["sh", "-c", "echo in > /tmp/in; cat /tmp/in"], store) == 0
    )
    assert ops.exec_node(name, "compute0", ["sh", "-c", "echo shm > /dev/shm/in"], store) == 0
    assert ops.exec_node(name, "compute1", ["cat", "/dev/shm/in"], store) == 0
    assert capfd.readouterr().out.split() == ["in", "shm"]
    # ... and for an ordinary user inside: "/" is 0755 there, /tmp and /dev/shm writable.
    pid = ops.node_pid(name, "compute0", store)
    user = "stat -c %a /; ls / >/dev/null; id -u; echo u > /tmp/u && cat /tmp/u;"
    r = in_node_as_nobody(pid, user + " echo s > /dev/shm/u && cat /dev/shm/u")
    assert r.returncode == 0 and r.stdout.split() == ["755", str(NOBODY), "u", "s"], r

    # The state root itself is open here: what closes the rest is hpvc's own folders.
    assert probe([("list", store.root)]) == {f"list {store.root}": "ok"}
    cdir, ndir = store.cluster_dir(name), store.node_dir(name, "compute0")
    attempts = [
        ("list", store.root / "clusters"),  # who runs what
        ("list", cdir),
        ("plant", cdir / "planted"),
        ("list", ndir / "rootfs"),  # the node's root (merged)
        ("read", ndir / "rootfs" / "etc" / "hostname"),
        ("list", ndir / "rootfs" / "tmp"),
        ("read", ndir / "rootfs" / "tmp" / "in"),
        ("plant", ndir / "rootfs" / "tmp" / "planted"),
        ("list", ndir / "upper" / "tmp"),  # the backing of its /tmp
        ("plant", ndir / "upper" / "tmp" / "planted"),
        ("list", cdir / "shm"),  # the backing of its /dev/shm
        ("read", cdir / "shm" / "in"),
        ("plant", cdir / "shm" / "planted"),
        ("read", cdir / "cluster.json"),  # its state
        ("append", cdir / "cluster.json"),
        ("read", cdir / "journal.jsonl"),
        ("read", ndir / "journal.jsonl"),
        ("read", ndir / "config.json"),
        ("read", cdir / "hosts"),
        ("read", cdir / "holder.pid"),
        ("list", store.root / "locks"),
        ("read", store.root / "locks" / f"{name}.lock"),
    ]
    got = probe(attempts)
    assert {k: v for k, v in got.items() if v != "EACCES"} == {}
    assert ops.exec_node(name, "compute0", ["sh", "-c", "ls /tmp /dev/shm"], store) == 0
    assert "planted" not in capfd.readouterr().out

    # The CLI, run by nobody: one line, exit 2, and no cluster of anyone's.
    for args in (["ls"], ["ls", "--json"], ["status", name]):
        r = hpvc_as_nobody(store, *args)
        assert r.returncode == 2, (args, r)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"hpvc: {args[0]}: needs root:")
        assert "permission denied" in lines[0], lines
        assert lines[0].endswith("(run as root)") and name not in r.stdout, r
    lifecycle.down(name, store)
    assert leftovers(name) == []


def root_options(pid: int, mount_point: str = "/") -> set[str]:
    """Per-mount options of the top mount at ``mount_point`` as ``pid`` sees it."""
    found: set[str] = set()
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == mount_point:
            found = set(fields[5].split(","))
    return found


def setuid_euid(pid: int, binary: str = "/usr/bin/su") -> int:
    """The effective uid ``binary`` (setuid root in the image) gets when uid
    65534 runs it inside the node: su waits for a password, so it is read
    from /proc while it waits."""
    p = subprocess.Popen(
        ["nsenter", "-t", str(pid), "-m", "-S", str(NOBODY), "-G", str(NOBODY), "--",
         binary, "root", "-c", "true"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and p.poll() is None:
            if Path(f"/proc/{p.pid}/comm").read_text().strip() == Path(binary).name:
                status = Path(f"/proc/{p.pid}/status").read_text().splitlines()
                uid = next(line for line in status if line.startswith("Uid:"))
                return int(uid.split()[2])  # real, effective, saved, fs
            time.sleep(0.02)
        raise AssertionError(f"{binary} did not wait for a password: {p.communicate()}")
    finally:
        p.kill()
        p.communicate()


@pytest.mark.parametrize("tenant", [True, False], ids=["tenant", "root-own"])
def test_a_tenants_nodes_give_setuid_nothing(
    tenant: bool, open_store: Store, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    image_ready()
    store = open_store
    name = f"tn{int(tenant)}{os.getpid() % 1000}"
    path = spec_file(tmp_path, name, computes=1)
    doc = tomllib.loads(Path(path).read_text())
    lifecycle.up_spec(load_spec(path), doc, path, store, tenant=tenant)
    assert store.get(name).tenant is tenant
    lifecycle.scale(name, {"compute": 2}, store)  # the new node follows the record
    assert ops.exec_node(name, "compute1", ["stat", "-c", "%a", "/usr/bin/su"], store) == 0
    assert capfd.readouterr().out.strip() == "4755"  # the image's own setuid su
    for node in ("head0", "compute0", "compute1"):
        pid = ops.node_pid(name, node, store)
        for where in ("/", "/shared", "/etc/hosts"):
            hardened = {"nosuid", "nodev"} <= root_options(pid, where)
            assert hardened is tenant, (node, where, root_options(pid, where))
        assert setuid_euid(pid) == (NOBODY if tenant else 0), node
        # Still a usable node for that user: programs run, /tmp is theirs.
        r = in_node_as_nobody(pid, "id -u && echo t > /tmp/t && cat /tmp/t")
        assert r.returncode == 0 and r.stdout.split() == [str(NOBODY), "t"], r
    lifecycle.down(name, store)
    assert leftovers(name) == []
