"""hpvc.host.sysmount: mount(8)'s option words split into mount(2)'s flags and data."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpvc.errors import HpvcError
from hpvc.host import sysmount


def test_the_flags_hpvc_passes_become_bits_and_the_rest_stays_the_file_system_s() -> None:
    assert sysmount.split("nosuid,nodev,lowerdir=/a,upperdir=/b,workdir=/c") == (
        0x2 | 0x4,
        "lowerdir=/a,upperdir=/b,workdir=/c",
    )
    assert sysmount.split("size=64m,mode=1777") == (0, "size=64m,mode=1777")
    assert sysmount.split("") == (0, "")


def test_options_past_one_page_are_refused_before_the_call(tmp_path: Path) -> None:
    target = tmp_path / "never"
    with pytest.raises(HpvcError, match="more than mount"):
        sysmount.mount("tmpfs", str(target), "tmpfs", "x" * 5000, "tmpfs test")
    assert not target.exists()


def test_a_refused_mount_names_the_target_and_the_kernel_s_reason(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder"  # ENOENT as root, EPERM as a user: nothing mounted
    with pytest.raises(HpvcError, match=f"tmpfs test: mount: {missing}: "):
        sysmount.mount("tmpfs", str(missing), "tmpfs", "size=1m", "tmpfs test")
    assert not missing.exists()
