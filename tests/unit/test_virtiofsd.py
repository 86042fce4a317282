"""hpvc.host.virtiofsd: the daemon's command line, its refusals, how its
processes are found again (the real daemon serving a guest: the integration
test tests/integration/test_vm_binds.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpvc.backends.base import ClusterEnv, State
from hpvc.backends.vm import binds as vm_binds
from hpvc.errors import InputError, MissingDependency
from hpvc.host import virtiofsd
from hpvc.store import ClusterRecord, Store


def test_argv_drops_to_the_user_then_maps_it_to_root_of_a_user_namespace() -> None:
    argv = virtiofsd.argv(7, "/home", 1234, 5678)
    sep = [i for i, a in enumerate(argv) if a == "--"]
    setpriv, unshare, daemon = argv[: sep[0]], argv[sep[0] + 1 : sep[1]], argv[sep[1] + 1 :]
    assert setpriv == ["setpriv", "--reuid=1234", "--regid=5678", "--clear-groups"]
    assert unshare == ["unshare", "--user", "--map-root-user"]
    assert daemon[0] == virtiofsd.VIRTIOFSD
    assert "--fd=7" in daemon and "source=/home" in daemon and "sandbox=namespace" in daemon
    assert "--rlimit-nofile=0" in daemon


def test_root_is_never_the_one_serving_a_bind(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="ordinary uid"):
        virtiofsd.check(str(tmp_path), 0)


def test_a_bind_that_is_no_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    for source in (str(tmp_path / "f"), str(tmp_path / "missing"), "relative"):
        with pytest.raises(InputError, match="absolute host folder"):
            virtiofsd.check(source, 1000)


def test_no_virtiofsd_is_said(tmp_path: Path) -> None:
    with pytest.raises(MissingDependency, match="qemu-system-common"):
        virtiofsd.check(str(tmp_path), 1000, binary=str(tmp_path / "virtiofsd"))


def fake_proc(root: Path, envs: dict[int, dict[str, str]]) -> Path:
    for pid, env in envs.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "environ").write_bytes(
            b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())
        )
    (root / "self").mkdir()
    return root


def test_the_daemons_processes_are_found_by_their_mark_alone(tmp_path: Path) -> None:
    proc = fake_proc(
        tmp_path,
        {
            10: {"PATH": "/bin", virtiofsd.MARK_ENV: "j1-0/compute0/hpvcfs0"},
            11: {virtiofsd.MARK_ENV: "j1-0/compute0/hpvcfs0"},  # its sandbox's child
            12: {virtiofsd.MARK_ENV: "j1-0/compute0/hpvcfs1"},
            13: {virtiofsd.MARK_ENV: "j1-0/compute0/hpvcfs0x"},
            14: {"PATH": "/bin"},
        },
    )
    assert virtiofsd.processes("j1-0/compute0/hpvcfs0", proc) == [10, 11]
    assert virtiofsd.processes("j1-0/compute1/hpvcfs0", proc) == []


# ---- which binds a VM cluster's guests get (hpvc.backends.vm.binds) ----------------


def env_with(tmp_path: Path, backend: str, user: dict[str, object] | None) -> ClusterEnv:
    rec = ClusterRecord("c", {}, "c.toml", {}, "running", 1.0, 2.0, backend=backend)
    rec.binds = [str(tmp_path)]
    rec.user = user
    return ClusterEnv(Store(tmp_path / "state"), rec, State())


def test_a_jobs_binds_become_tags_at_the_same_paths(tmp_path: Path) -> None:
    said: list[str] = []
    env = env_with(tmp_path, "qemu", {"uid": 1000, "gid": 1000, "name": "u"})
    assert vm_binds.shares(env, said.append) == (("hpvcfs0", str(tmp_path)),)
    assert said == []


def test_no_binds_without_an_ordinary_user_and_the_step_is_told(tmp_path: Path) -> None:
    for user in (None, {"uid": 0, "gid": 0, "name": "root"}):
        said: list[str] = []
        assert vm_binds.shares(env_with(tmp_path, "qemu", user), said.append) == ()
        assert len(said) == 1 and "not shared" in said[0]


def test_binds_for_libvirt_guests_are_refused(tmp_path: Path) -> None:
    env = env_with(tmp_path, "libvirt", {"uid": 1000, "gid": 1000, "name": "u"})
    with pytest.raises(InputError, match="qemu backend"):
        vm_binds.shares(env, lambda _m: None)
