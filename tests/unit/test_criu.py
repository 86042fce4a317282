"""The host's CRIU verdict (hpvc.host.criu) and the crun backend's refusal built
from it (hpvc.backends.crun.checkpoint, docs/checkpoint.md "Containers")."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hpvc.backends.crun import checkpoint as crun_ckpt
from hpvc.errors import InputError, MissingDependency
from hpvc.host import criu

# criu 3.17.1's stderr for `criu check` on kernel 6.18 (this project's hosts).
CHECK_6_18 = """\
Error (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds
Error (criu/vdso.c:613): vdso: Failed to fill self vdso symtable
Error (criu/kerndat.c:1615): kerndat_vdso_fill_symtable failed when initializing kerndat.
Error (criu/crtools.c:260): Could not initialize kernel features detection.
"""


def test_first_error_takes_criu_s_first_error_line() -> None:
    assert criu.first_error(CHECK_6_18) == (
        "vdso: Unexpected rt vDSO area bounds (criu/vdso.c:381)"
    )


def test_first_error_reads_log_lines_with_timestamps() -> None:
    log = "(00.009512) vdso: Parsing at 7f84\n(00.009524) Error (criu/vdso.c:381): vdso: bad\n"
    assert criu.first_error(log) == "vdso: bad (criu/vdso.c:381)"


def test_first_error_without_an_error_line_is_the_first_line() -> None:
    assert criu.first_error("\n  Looks odd\nmore\n") == "Looks odd"
    assert criu.first_error("") == ""


def test_parse_version() -> None:
    assert criu.parse_version("Version: 3.17.1\n") == "3.17.1"
    assert criu.parse_version("Version: 4.1\nGitID: v4.1\n") == "4.1"
    assert criu.parse_version("nothing") == ""


def _fake_criu(tmp_path: Path, check_rc: int, check_err: str) -> Path:
    """A stand-in criu for the two verdicts this host cannot show (missing, passing)."""
    exe = tmp_path / "criu"
    exe.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "Version: 9.9"; exit 0; fi\n'
        f"printf '%s' '{check_err}' >&2\nexit {check_rc}\n"
    )
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_check_reads_a_failing_criu(tmp_path: Path) -> None:
    exe = _fake_criu(tmp_path, 1, "Error (criu/x.c:1): broken here\n")
    found = criu.check(which=lambda _: str(exe))
    assert found == criu.CriuCheck(True, False, "9.9", "broken here (criu/x.c:1)")


def test_check_reads_a_passing_criu(tmp_path: Path) -> None:
    exe = _fake_criu(tmp_path, 0, "")
    assert criu.check(which=lambda _: str(exe)) == criu.CriuCheck(True, True, "9.9", "")


def test_check_without_criu() -> None:
    found = criu.check(which=lambda _: None)
    assert not found.installed and not found.ok


def test_this_host_s_criu_gives_a_consistent_verdict() -> None:
    if shutil.which("criu") is None:
        pytest.fail("criu is not installed (make setup installs it)")
    found = criu.check()
    assert found.installed and found.version
    assert found.ok == (found.error == "")
    assert "\n" not in found.error


def test_refusal_names_criu_s_error_and_the_way_out() -> None:
    err = crun_ckpt.refusal(criu.CriuCheck(True, False, "3.17.1", "vdso: bad (criu/vdso.c:381)"))
    assert type(err) is InputError and err.exit_code == 2
    line = err.line()
    assert "CRIU 3.17.1 cannot run on this kernel" in line
    assert "vdso: bad (criu/vdso.c:381)" in line and "CRIU 4.2 or newer" in line
    assert "\n" not in line


def test_refusal_without_criu_is_a_missing_dependency() -> None:
    err = crun_ckpt.refusal(criu.CriuCheck(False, False, "", "criu not found"))
    assert isinstance(err, MissingDependency) and "make setup" in err.line()


def test_the_crun_backend_checkpoints_where_criu_runs() -> None:
    from hpvc.backends.crun.backend import CrunBackend

    assert CrunBackend.capabilities.checkpoint is True
    if criu.check().ok:
        crun_ckpt.usable()  # no refusal
    else:
        with pytest.raises(InputError):
            crun_ckpt.usable()


def _env(spec: dict[str, object]) -> Any:
    return SimpleNamespace(name="c", rec=SimpleNamespace(spec=spec))


def _plan(server: str) -> Any:
    return SimpleNamespace(shared=None, cluster="c", server=server)


def test_nodes_sharing_namespaces_are_not_refused_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """locality "shm" nodes are cut one by one (hpvc.backends.crun.shmcut)."""
    monkeypatch.setattr(crun_ckpt.shared, "shared_of", lambda plan: SimpleNamespace(server="host"))
    for spec in ({}, {"tuning": {"locality": "shm"}}, {"tuning": {"locality": "none"}}):
        crun_ckpt.refuse_unsupported(_env(spec), _plan("host"))


def test_a_shared_directory_on_an_nfs_node_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crun_ckpt.shared, "shared_of", lambda plan: SimpleNamespace(server="nfs"))
    with pytest.raises(InputError) as e:
        crun_ckpt.refuse_unsupported(_env({"tuning": {"locality": "none"}}), _plan("nfs"))
    assert "NFS" in e.value.line()


def test_stdio_keys_name_pipes_and_files_as_criu_does() -> None:
    r, w = os.pipe()
    child = subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL, stdout=w, stderr=w)
    try:
        keys = criu.stdio_keys(child.pid)
        ino = os.fstat(r).st_ino
        assert keys[1] == keys[2] == f"pipe:[{ino}]"
        assert re.fullmatch(r"file\[\d+:\d+\]", keys[0])
        assert keys[0].endswith(f":{os.stat('/dev/null').st_ino}]")
    finally:
        child.kill()
        child.wait()
        os.close(r)
        os.close(w)


# A node's mountinfo as crun 1.8 leaves it with cgroup v1 (lines cut to the
# fields read), and the host's cgroup mounts of the same hierarchies.
NODE_INFO = """\
700 690 0:52 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
712 700 0:60 / /sys/fs/cgroup rw - tmpfs cgroup rw,size=1024k
713 712 0:31 /hpvc/c1/head0 /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
714 712 0:32 /hpvc/c1/head0 /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
715 712 0:33 /hpvc/c1/head0 /sys/fs/cgroup/freezer ro - cgroup cgroup ro,freezer
716 712 0:34 /other /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
717 700 0:40 /clusters/c1/hosts /etc/hosts rw - ext4 /dev/loop0 rw
"""
HOST_INFO = """\
30 25 0:31 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
31 25 0:32 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd,xattr
32 25 0:33 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer
33 25 0:34 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
34 25 0:35 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
"""


def test_cgroup_mounts_of_a_node_map_to_the_host_s_hierarchies() -> None:
    found = criu.parse_cgroup_mounts(NODE_INFO, HOST_INFO, "/hpvc/c1/head0")
    assert found == {
        "/sys/fs/cgroup/cpu": "/sys/fs/cgroup/cpu",
        "/sys/fs/cgroup/systemd": "/sys/fs/cgroup/systemd",  # options in another order
        "/sys/fs/cgroup/freezer": "/sys/fs/cgroup/freezer",  # ro inside, rw outside
    }  # memory's root is another cgroup's; tmpfs, cgroup2 and binds are not cgroup v1 mounts
    assert criu.parse_cgroup_mounts(NODE_INFO, HOST_INFO, "/hpvc/c2/head0") == {}


def test_this_host_s_cgroup_hierarchies_are_listed_once() -> None:
    text = Path("/proc/self/mountinfo").read_text()
    mounts = criu.host_cgroup_mounts()
    assert len(mounts) == len(set(mounts))
    assert all(f" {m} " in text for m in mounts)
    assert all(":" not in criu.cgroup_key(m) for m in mounts)  # CRIU splits its maps at ':'


def test_binds_saved_in_the_old_cluster_s_folder_keep_their_mount_point(tmp_path: Path) -> None:
    old, new = tmp_path / "clusters" / "a", tmp_path / "clusters" / "b"
    binds = {str(new / "mpi"): str(new / "mpi"), "/etc/hosts": str(new / "hosts")}
    assert crun_ckpt.saved_binds(binds, old, new) == {
        str(old / "mpi"): str(new / "mpi"),  # Open MPI's session folder: saved at a's path
        "/etc/hosts": str(new / "hosts"),
    }
    assert crun_ckpt.saved_binds(binds, new, new) == binds  # the same name: as saved


def test_a_crun_record_without_what_restore_rewrites_is_refused() -> None:
    with pytest.raises(InputError) as e:
        crun_ckpt._check_state({"pid": 1, "bundle": "/b"})
    assert "process-start-time, cgroup-path" in e.value.line() and e.value.exit_code == 2
    crun_ckpt._check_state({"pid": 1, "bundle": "/b", "process-start-time": 1, "cgroup-path": "/x"})


def _recording_criu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A criu on PATH that writes its arguments, one a line, and a pidfile."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "criu"
    exe.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$@" > {tmp_path}/argv\n'
        'while [ $# -gt 0 ]; do [ "$1" = --pidfile ] && echo 4242 > "$2"; shift; done\n'
    )
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return tmp_path / "argv"


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def test_dump_names_each_cgroup_mount_by_its_host_hierarchy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _recording_criu(tmp_path, monkeypatch)
    criu.dump(1, tmp_path / "img", netns=Path("/proc/self/ns/net"), binds=["/etc/hosts"],
              stdio={}, freezer=tmp_path, root=tmp_path,
              cgroups={"/sys/fs/cgroup/cpu": "/sys/fs/cgroup/cpu"})  # fmt: skip
    maps = _pairs(out.read_text().splitlines(), "--ext-mount-map")
    assert maps == ["/etc/hosts:/etc/hosts", "/sys/fs/cgroup/cpu:hpvc-cgroup/sys/fs/cgroup/cpu"]
    assert _pairs(out.read_text().splitlines(), "--ghost-limit") == []  # CRIU's own default


def test_dump_keeps_deleted_files_up_to_the_limit_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _recording_criu(tmp_path, monkeypatch)
    criu.dump(1, tmp_path / "img", netns=Path("/proc/self/ns/net"), binds=[], stdio={},
              freezer=tmp_path, root=tmp_path, ghost_mib=256)  # fmt: skip
    assert _pairs(out.read_text().splitlines(), "--ghost-limit") == ["256M"]


def test_restore_under_another_name_moves_the_cgroups_and_their_mounts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _recording_criu(tmp_path, monkeypatch)
    r, w = os.pipe()
    try:
        pid = criu.restore(tmp_path, netns=Path("/proc/self/ns/net"),
                           binds={"/old/mpi": "/new/mpi"}, stdio={}, console_fd=w,
                           root=tmp_path, pidfile=tmp_path / "pid", cgroup="/hpvc/b/head0",
                           cgroup_mounts=["/sys/fs/cgroup/cpu"], move_cgroup=True)  # fmt: skip
        argv = out.read_text().splitlines()
        assert pid == 4242
        assert _pairs(argv, "--cgroup-root") == ["/hpvc/b/head0"]
        assert _pairs(argv, "--ext-mount-map") == [
            "auto",
            "/old/mpi:/new/mpi",
            "hpvc-cgroup/sys/fs/cgroup/cpu:/sys/fs/cgroup/cpu/hpvc/b/head0",
        ]
        criu.restore(tmp_path, netns=Path("/proc/self/ns/net"), binds={}, stdio={},
                     console_fd=w, root=tmp_path, pidfile=tmp_path / "pid",
                     cgroup="/hpvc/a/head0", cgroup_mounts=["/sys/fs/cgroup/cpu"])  # fmt: skip
        argv = out.read_text().splitlines()
        assert "--cgroup-root" not in argv  # the saved name: the saved cgroups
        assert "hpvc-cgroup/sys/fs/cgroup/cpu:/sys/fs/cgroup/cpu/hpvc/a/head0" in argv
    finally:
        os.close(r)
        os.close(w)


def test_mountinfo_is_read_until_two_reads_agree() -> None:
    """A read of mountinfo while mounts come and go can miss lines: the reader
    takes a text only once the next read gives the same (criu.stable_mountinfo)."""

    class Changing:
        def __init__(self, texts: list[str]) -> None:
            self.texts = texts

        def read_text(self) -> str:
            return self.texts.pop(0) if len(self.texts) > 1 else self.texts[0]

    assert criu.stable_mountinfo(Changing(["a", "a b", "a b c", "a b c"])) == "a b c"  # type: ignore[arg-type]
    assert criu.stable_mountinfo(Changing(["x"])) == "x"  # type: ignore[arg-type]
