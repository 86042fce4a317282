"""Which MPI an image carries (``hpvc.image.mpi``), how hydra is driven
(``hpvc.cluster.hydra``) and ``hpvc run``'s refusal of an image without MPI."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpvc.backends.crun.ranks import RANK_SCRIPT
from hpvc.cluster import hydra, ops
from hpvc.errors import HpvcError, InputError
from hpvc.image.mpi import MPICH, OPEN_MPI, find_mpi
from tests.unit.test_render import make_node

DPKG_MPICH = (
    "Package: libc6\nStatus: install ok installed\nVersion: 2.36-9\n\n"
    "Package: mpich\nStatus: install ok installed\nVersion: 4.0.2-3+b1\n"
)


def touch(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def mpich_root(root: Path) -> Path:
    """Debian's way: /usr/bin/mpiexec -> /etc/alternatives/mpiexec -> mpiexec.hydra."""
    touch(root / "usr/bin/mpiexec.hydra")
    (root / "etc/alternatives").mkdir(parents=True)
    (root / "etc/alternatives/mpiexec").symlink_to("/usr/bin/mpiexec.hydra")
    (root / "usr/bin/mpiexec").symlink_to("/etc/alternatives/mpiexec")
    touch(root / "var/lib/dpkg/status", DPKG_MPICH)
    return root


def test_mpich_through_the_images_alternatives(tmp_path: Path) -> None:
    found = find_mpi(mpich_root(tmp_path))
    assert found is not None and (found.kind, found.version) == (MPICH, "4.0.2")
    assert found.launcher == "/usr/bin/mpiexec"
    assert found.describe("mine") == "MPICH 4.0.2 (image mine, /usr/bin/mpiexec)"


def test_the_link_is_followed_in_the_image_never_on_the_host(tmp_path: Path) -> None:
    """An absolute link is the image's: /usr/bin/mpirun -> /opt/ompi/bin/orterun in it."""
    touch(tmp_path / "opt/ompi/bin/orterun")
    touch(tmp_path / "opt/ompi/lib/pkgconfig/ompi.pc", "Name: Open MPI\nVersion: 5.0.3\n")
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/bin/mpirun").symlink_to("/opt/ompi/bin/orterun")
    found = find_mpi(tmp_path)
    assert found is not None and found.kind == OPEN_MPI and found.launcher == "/usr/bin/mpirun"
    assert (tmp_path / "usr/bin/mpirun").resolve() != (tmp_path / "opt/ompi/bin/orterun")


def test_open_mpi_by_its_library_and_the_images_path(tmp_path: Path) -> None:
    touch(tmp_path / "opt/mpi/bin/mpiexec")  # a name that says nothing: the library does
    touch(tmp_path / "usr/lib/x86_64-linux-gnu/libmpi.so.40.30.4")
    touch(tmp_path / "usr/lib/x86_64-linux-gnu/pkgconfig/ompi.pc", "Version: 4.1.4\n")
    assert find_mpi(tmp_path) is None  # not on the usual PATH
    found = find_mpi(tmp_path, ("PATH=/opt/mpi/bin:/usr/bin",))
    assert found is not None and (found.kind, found.version) == (OPEN_MPI, "4.1.4")
    assert found.launcher == "/opt/mpi/bin/mpiexec"


def test_no_launcher_or_an_unknown_one(tmp_path: Path) -> None:
    touch(tmp_path / "bin/sh")
    assert find_mpi(tmp_path) is None
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/bin/mpirun").symlink_to("/nowhere")  # dangling in the image
    touch(tmp_path / "usr/bin/mpiexec")  # neither MPI's name nor library
    assert find_mpi(tmp_path) is None


def test_run_refuses_an_image_without_mpi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    touch(tmp_path / "bin/sh")
    image = SimpleNamespace(rootfs=tmp_path, env=())
    monkeypatch.setattr(ops, "resolve_image", lambda name: image)
    with pytest.raises(InputError, match=r"image 'bb': has no MPI launcher \(mpiexec or mpirun"):
        ops.image_mpi("bb")
    assert InputError.exit_code == 2
    mpich_root(tmp_path)
    assert ops.image_mpi("bb").kind == MPICH


def test_hydra_manual_launch_lines() -> None:
    a, b = make_node("compute0", 0), make_node("compute1", 1)
    argv = hydra.mpiexec_argv("/usr/bin/mpiexec", [(a, 2), (b, 1)], ["hostname"])
    assert argv == [
        "/usr/bin/mpiexec",
        "-launcher",
        "manual",
        "-hosts",
        f"{a.ip}:2,{b.ip}:1",
        "-n",
        "3",
        "hostname",
    ]
    out = io.StringIO(
        "HYDRA_LAUNCH: /usr/bin/hydra_pmi_proxy --control-port h:1 --proxy-id 0\n"
        "HYDRA_LAUNCH: /usr/bin/hydra_pmi_proxy --control-port h:1 --proxy-id 1\n"
        "HYDRA_LAUNCH_END\nrank output\n"
    )
    launches = hydra.read_launches(out)
    assert [x[-1] for x in launches] == ["0", "1"] and launches[0][0] == "/usr/bin/hydra_pmi_proxy"
    assert out.read() == "rank output\n"  # the job's own output is left to pass through
    with pytest.raises(HpvcError, match="ended before it named its proxies"):
        hydra.read_launches(io.StringIO("error\n"))


def test_rank_script_is_posix_sh() -> None:
    script = RANK_SCRIPT.format(crun="crun", path="PATH=/bin", client="")
    assert script.startswith("#!/bin/sh\n") and "<(" not in script and "+=(" not in script
