"""The coordinator's site file (hpvc.coordinator.site) and its plan (coordinator.plan).

A good file parses into disks, rates and priorities; every bad one is one
InputError (exit 2) naming the file and the key; from the CLI a bad file is
one line, exit 2, and changes nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from hpvc.coordinator import coordinator
from hpvc.coordinator.site import DEFAULT_PATH, ENV, load_site, parse_site
from hpvc.coordinator.state import Member, Override
from hpvc.errors import InputError
from hpvc.host import io_coord
from hpvc.host.cgroupfs.v1 import V1Manager
from hpvc.host.probe import CgroupLayout

GOOD = """
[devices.disk0]
path = "/"
write = "70MB/s"
read = "200MiB"

[devices.disk1]
device = "8:16"
write = "10MB"

[priority]
default = 2
users = { alice = 4 }
clusters = { big = 8 }
"""


def site_file(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "io.toml"
    p.write_text(text)
    return p


def test_a_good_site_file(tmp_path: Path) -> None:
    path, site = load_site(site_file(tmp_path, GOOD))
    assert site is not None and path == tmp_path / "io.toml"
    d0, d1 = site.devices["disk0"], site.devices["disk1"]
    assert (d0.write, d0.read) == (70_000_000, 200 * 2**20)
    assert d1.numbers() == (8, 16) and d1.read is None and d1.capacity("write") == 10_000_000
    assert site.priority.of("big", "alice") == (8, "site: cluster")
    assert site.priority.of("x", "alice") == (4, "site: user alice")
    assert site.priority.of("x", None) == (2, "site: default")


def test_the_site_path_option_env_and_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    if not DEFAULT_PATH.exists():
        assert load_site(None) == (DEFAULT_PATH, None)  # absent default: nothing managed
    monkeypatch.setenv(ENV, str(site_file(tmp_path, GOOD)))
    assert load_site(None)[1] is not None
    with pytest.raises(InputError, match="file not found"):
        load_site(tmp_path / "missing.toml")  # named: must exist


@pytest.mark.parametrize(
    ("text", "key", "why"),
    [
        ('[devices.d]\npath = "/"\nwrite = "1MB"\nspeed = 3\n', "devices.d.speed", "unknown key"),
        ('[devices.d]\nwrite = "1MB"\n', "devices.d", "either path"),
        ('[devices.d]\npath = "/"\ndevice = "8:0"\nwrite = "1MB"\n', "devices.d", "either path"),
        ('[devices.d]\ndevice = "sda"\nwrite = "1MB"\n', "devices.d", "MAJOR:MINOR"),
        ('[devices.d]\npath = "rel"\nwrite = "1MB"\n', "devices.d", "not absolute"),
        ('[devices.d]\npath = "/"\n', "devices.d", "read, write or both"),
        ('[devices.d]\npath = "/"\nwrite = "fast"\n', "devices.d.write", "not a size"),
        ('[devices.d]\npath = "/"\nwrite = 70\n', "devices.d.write", "a rate must be"),
        ('[devices.d]\npath = "/"\nwrite = "0MB"\n', "devices.d.write", "not a positive"),
        ("[priority]\ndefault = 1\n", "devices", "required key"),
        ("[devices]\n", "devices", "at least 1"),
        (GOOD + "\n[x]\n", "x", "unknown key"),
        (GOOD.replace("default = 2", "default = 0"), "priority.default", "greater than"),
        (GOOD.replace("alice = 4", "alice = 1001"), "priority.users.alice", "less than"),
        (GOOD.replace("alice = 4", 'alice = "4"'), "priority.users.alice", "integer"),
        (GOOD.replace("alice = 4", '"a b" = 4'), "priority", "not a user or cluster"),
    ],
)
def test_bad_site_files_name_the_key(tmp_path: Path, text: str, key: str, why: str) -> None:
    with pytest.raises(InputError) as err:
        load_site(site_file(tmp_path, text))
    e = err.value
    assert e.exit_code == 2
    assert e.what == f"site file {tmp_path / 'io.toml'}: {key}", e.line()
    assert why in e.why, e.line()


def test_not_toml(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not valid TOML"):
        load_site(site_file(tmp_path, "[devices\n"))


def test_a_path_with_no_such_folder_is_refused_when_resolved(tmp_path: Path) -> None:
    site = parse_site({"devices": {"d": {"path": str(tmp_path / "nope"), "write": "1MB"}}})
    with pytest.raises(InputError, match=r"devices\.d\.path: .* does not exist"):
        coordinator.resolve(site, Path("io.toml"))


def test_one_disk_declared_twice_is_refused(tmp_path: Path) -> None:
    st = os.stat(tmp_path)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    site = parse_site({"devices": {"a": {"device": dev, "write": "1MB"},
                                   "b": {"device": dev, "read": "1MB"}}})  # fmt: skip
    with pytest.raises(InputError, match="declare each disk once"):
        coordinator.resolve(site, Path("io.toml"))


# --- the plan: who gets what -------------------------------------------------------------


def member(tmp_path: Path, name: str, owner: str | None = None, **demand: int) -> Member:
    layout = CgroupLayout("v1", {"blkio": "/sys/fs/cgroup/blkio"})
    cg = io_coord.ServerCgroup(name, tmp_path / name, V1Manager(tmp_path, layout))
    full = {d: demand.get(d) for d in ("read", "write")}
    return Member(name, owner, tmp_path, True, full, cg)


def test_plan_shares_by_priority_demand_and_override(tmp_path: Path) -> None:
    st = os.stat(tmp_path)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    storage = io_coord.storage(tmp_path)
    if storage is None or io_coord.key(storage.disk) != dev:
        pytest.skip(f"{tmp_path} is not on a plain disk here")
    site = parse_site(
        {
            "devices": {"d": {"device": dev, "write": "70MB"}},
            "priority": {"clusters": {"a": 1, "b": 2, "c": 4}, "users": {"eve": 2}},
        }
    )
    devices = coordinator.resolve(site, Path("io.toml"))
    found = [member(tmp_path, n) for n in ("a", "b", "c")]
    got = {t.cluster: t for t in coordinator.plan(site, devices, found, {})}
    assert [got[n].allocation["write"] for n in "abc"] == [10**7, 2 * 10**7, 4 * 10**7]
    assert got["a"].allocation["read"] is None  # read is not declared: not limited
    # c asks for 5 MB/s: it gets that, a and b share the rest 1:2
    found[2] = member(tmp_path, "c", write=5 * 10**6)
    got = {t.cluster: t for t in coordinator.plan(site, devices, found, {})}
    assert [got[n].allocation["write"] for n in "abc"] == [65 * 10**6 // 3, 130 * 10**6 // 3, 5e6]
    # an operator's override wins over the site and the spec
    over = {"c": Override(priority=1, write=60 * 10**6)}
    got = {t.cluster: t for t in coordinator.plan(site, devices, found, over)}
    assert got["c"].priority_from == "hpvc io set" and got["c"].demand["write"] == 60 * 10**6
    assert got["c"].allocation["write"] == 70 * 10**6 // 4
    # a user's priority applies to a cluster the site does not name
    got = {
        t.cluster: t for t in coordinator.plan(site, devices, [member(tmp_path, "z", "eve")], {})
    }
    assert got["z"].priority == 2 and got["z"].allocation["write"] == 70 * 10**6
    # alone it may take the whole disk: no limit, so no synchronous writes either
    assert coordinator.limited(got["z"]) == {"read": False, "write": False}
    lone = replace(got["z"], member=replace(got["z"].member, stable_writes=False))
    assert coordinator.write_mode(lone) == "buffered"
    assert coordinator.write_mode(got["z"]) == "through"  # a folder's NFS_Commit: for life


def test_limits_and_write_modes_under_contention(tmp_path: Path) -> None:
    st = os.stat(tmp_path)
    folder = io_coord.Storage((os.major(st.st_dev), os.minor(st.st_dev)))
    loop = replace(folder, loop=(7, 3))
    site = parse_site({"devices": {"d": {"device": io_coord.key(folder.disk), "write": "70MB"}}})
    devices = coordinator.resolve(site, Path("io.toml"))
    found = [replace(member(tmp_path, n), stable_writes=False) for n in "ab"]
    targets = [replace(t, storage=loop) for t in coordinator.plan(site, devices, found, {})]
    if any(t.device is None for t in targets):
        pytest.skip(f"{tmp_path} is not on a plain disk here")
    for t in targets:  # two compete: each is limited to half, its loop file system synchronous
        assert t.allocation["write"] == 35 * 10**6
        assert coordinator.limited(t) == {"read": False, "write": True}  # read: not declared
        assert coordinator.write_mode(t) == "sync"
    (a,) = [replace(t, storage=loop) for t in coordinator.plan(site, devices, found[:1], {})]
    assert coordinator.limited(a)["write"] is False and coordinator.write_mode(a) == "buffered"
    capped = [replace(found[0], demand={"read": None, "write": 10**7})]
    (c,) = [replace(t, storage=loop) for t in coordinator.plan(site, devices, capped, {})]
    assert c.allocation["write"] == 10**7 and coordinator.write_mode(c) == "sync"  # its demand
    (f,) = [replace(t, storage=folder) for t in coordinator.plan(site, devices, capped, {})]
    assert coordinator.write_mode(f) == "buffered"  # a folder cannot switch: not started managed


def test_plan_floors_at_min_rate_and_leaves_other_disks_alone(tmp_path: Path) -> None:
    site = parse_site({"devices": {"d": {"device": "4095:999", "write": "1MB"}}})
    devices = coordinator.resolve(site, Path("io.toml"))
    (t,) = coordinator.plan(site, devices, [member(tmp_path, "a")], {})
    assert t.device is None and t.allocation == {"read": None, "write": None}  # not on "d"
    storage = io_coord.storage(tmp_path)
    if storage is None:
        pytest.skip(f"{tmp_path} has no block device here")
    site = parse_site({"devices": {"d": {"device": io_coord.key(storage.disk), "write": "2MB"}}})
    devices = coordinator.resolve(site, Path("io.toml"))
    found = [member(tmp_path, n) for n in "abc"]
    got = coordinator.plan(site, devices, found, {})
    assert {t.allocation["write"] for t in got} == {coordinator.MIN_RATE}


# --- the command line ---------------------------------------------------------------------


def hpvc(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HPVC_STATE_DIR": str(tmp_path / "state"), "HPVC_RESIDENT": "0"}
    return subprocess.run(
        [sys.executable, "-m", "hpvc", *args], capture_output=True, text=True, env=env, check=False
    )


def test_cli_refuses_a_bad_site_file_in_one_line_and_changes_nothing(tmp_path: Path) -> None:
    bad = site_file(tmp_path, '[devices.d]\npath = "/"\nwrite = "lots"\n')
    for args in (["io", "status"], ["io", "set", "c1", "--priority", "3"]):
        r = hpvc([*args, "--site", str(bad)], tmp_path)
        if r.returncode == 2 and "needs root" in r.stderr:
            continue  # io set as an ordinary user: refused before the site file
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip() == (
            f"hpvc: site file {bad}: devices.d.write: 'lots' is not a size"
            " (write e.g. '2GiB', '512MiB', '50MB') (see docs/io.md)"
        )
    assert not (tmp_path / "state" / "io" / "overrides.json").exists()


def test_cli_status_with_no_cluster_here(tmp_path: Path) -> None:
    r = hpvc(["io", "status", "--json", "--site", str(site_file(tmp_path, GOOD))], tmp_path)
    assert r.returncode == 0, r.stderr
    assert '"clusters": []' in r.stdout
