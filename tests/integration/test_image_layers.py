"""What an imported image's layers mean comes out right in its root filesystem
(issue 26, item 1): whiteouts and opaque directories of an upper layer remove
what a lower one had, hard links stay one inode, and extended attributes,
file capabilities among them, are kept.

The layers are written here with tarfile (PAX records ``SCHILY.xattr.*`` are
how OCI layers carry xattrs) into an OCI layout, and imported through the same
path as every skopeo source (``oci:DIR:TAG``): skopeo copies, umoci unpacks.
"""

from __future__ import annotations

import gzip
import io
import os
import struct
import tarfile
from pathlib import Path

import pytest

from hpvc.image import Store
from hpvc.image.importer import import_image
from tests.helpers import requires
from tests.integration.test_image_import import write_layout

# struct vfs_cap_data, revision 2 (linux/capability.h): magic | effective flag,
# then (permitted, inheritable) for capabilities 0-31 and 32-63. CAP_NET_RAW is 13.
CAP_NET_RAW_EP = struct.pack("<5I", 0x02000000 | 0x1, 1 << 13, 0, 0, 0)


def _add(
    tar: tarfile.TarFile,
    name: str,
    data: bytes | None = None,
    *,
    kind: bytes = tarfile.REGTYPE,
    link: str = "",
    xattrs: dict[str, bytes] | None = None,
    mode: int = 0o644,
) -> None:
    info = tarfile.TarInfo(name)
    info.mtime, info.mode, info.type, info.linkname = 0, mode, kind, link
    # Binary values travel as surrogate escapes; tarfile then marks the record BINARY.
    info.pax_headers = {
        f"SCHILY.xattr.{k}": v.decode("utf-8", "surrogateescape") for k, v in (xattrs or {}).items()
    }
    if kind == tarfile.DIRTYPE:
        info.mode = 0o755
    if data is None:
        tar.addfile(info)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def _layer(build: list[tuple[str, dict[str, object]]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kw in build:
            _add(tar, name, **kw)  # type: ignore[arg-type]
    return gzip.compress(buf.getvalue(), mtime=0)


def test_whiteouts_hard_links_xattrs_and_capabilities(tmp_path: Path) -> None:
    requires("root", "skopeo", "umoci")
    lower = _layer(
        [
            ("bin", {"kind": tarfile.DIRTYPE}),
            (
                "bin/ping",
                {
                    "data": b"ping\n",
                    "mode": 0o755,
                    "xattrs": {"security.capability": CAP_NET_RAW_EP},
                },
            ),
            ("etc", {"kind": tarfile.DIRTYPE}),
            ("etc/tagged", {"data": b"x\n", "xattrs": {"user.hpvc": b"kept"}}),
            ("etc/gone", {"data": b"removed by the upper layer\n"}),
            ("etc/one", {"data": b"linked\n"}),
            ("etc/two", {"kind": tarfile.LNKTYPE, "link": "etc/one"}),
            ("opq", {"kind": tarfile.DIRTYPE}),
            ("opq/old", {"data": b"hidden by the opaque marker\n"}),
        ]
    )
    upper = _layer(
        [
            ("etc", {"kind": tarfile.DIRTYPE}),
            ("etc/.wh.gone", {"data": b""}),
            ("opq", {"kind": tarfile.DIRTYPE}),
            ("opq/.wh..wh..opq", {"data": b""}),
            ("opq/new", {"data": b"from the upper layer\n"}),
        ]
    )
    write_layout(tmp_path / "layout", [lower, upper])
    image = import_image("layers", f"oci:{tmp_path / 'layout'}:t", store=Store(tmp_path / "s"))
    root = image.rootfs

    # whiteouts: the file is gone, and no marker is left behind
    assert not (root / "etc/gone").exists()
    assert not any(p.name.startswith(".wh.") for p in root.rglob("*"))
    # an opaque directory keeps only the upper layer's entries
    assert sorted(p.name for p in (root / "opq").iterdir()) == ["new"]
    # a hard link is one inode with two names
    one, two = (root / "etc/one").stat(), (root / "etc/two").stat()
    assert (one.st_ino, one.st_nlink) == (two.st_ino, 2)
    assert (root / "etc/two").read_bytes() == b"linked\n"
    # extended attributes and file capabilities come through byte for byte
    assert os.getxattr(root / "etc/tagged", "user.hpvc") == b"kept"
    try:
        cap = os.getxattr(root / "bin/ping", "security.capability")
    except OSError as e:  # pragma: no cover - says which attribute went missing
        pytest.fail(f"bin/ping lost its capability: {e}")
    assert cap == CAP_NET_RAW_EP
    assert (root / "bin/ping").stat().st_mode & 0o777 == 0o755
