"""A root filesystem (a folder or a tarball) packed as a one-layer OCI image.

Neither skopeo nor umoci reads a bare root filesystem as an image, so hpvc
writes the layout itself: the layer is the rootfs's tar stream, uncompressed
(``tar`` makes it from a folder; a tarball is decompressed into it), stored
straight into the image store's shared blobs, with a config holding only the
layer and this host's platform. umoci then unpacks it like any other image,
so paths escaping the root are handled in one place for every source.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from hpvc.errors import InputError, MissingDependency
from hpvc.image import oci
from hpvc.image.store import Store

REF = "image"  # the tag of the one image in each stored OCI layout
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
CHUNK = 1 << 20


def _tool(name: str) -> str:
    exe = shutil.which(name)
    if exe is None:
        raise MissingDependency("image import", f"{name} not found", f"apt-get install {name}")
    return exe


def _stream(source: oci.Source) -> Iterator[IO[bytes]]:
    """The uncompressed tar stream of a rootfs folder or tarball."""
    path = Path(source.path)
    if source.kind == "dir":
        if not path.is_dir():
            raise InputError(
                f"image source {source.text!r}", "not a folder", "give a rootfs folder"
            )
        argv = ["tar", "-C", str(path), "--sort=name", "--numeric-owner", "--xattrs"]
        argv += ["--xattrs-include=*", "--acls", "-cf", "-", "."]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None
        yield proc.stdout
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise InputError(f"image source {source.text!r}", err.decode().strip(), "check it")
        return
    if not path.is_file():
        raise InputError(f"image source {source.text!r}", "no such file", "give a rootfs tarball")
    if source.path.endswith((".zst", ".zstd")):
        zstd = _tool("zstd")
        proc = subprocess.Popen([zstd, "-dcq", str(path)], stdout=subprocess.PIPE)
        assert proc.stdout is not None
        yield proc.stdout
        if proc.wait() != 0:
            raise InputError(f"image source {source.text!r}", "corrupt zstd data", "check it")
        return
    with open(path, "rb") as raw:
        magic = raw.read(2)
        raw.seek(0)
        yield gzip.GzipFile(fileobj=raw) if magic == b"\x1f\x8b" else raw  # type: ignore[misc]


def put_blob(store: Store, data: bytes) -> tuple[str, int]:
    """Store ``data`` as a blob (written aside, renamed into place); its digest and size."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    target = store.blob(digest)
    if not target.exists():
        tmp = target.with_name(f".tmp-{os.getpid()}")
        tmp.write_bytes(data)
        os.rename(tmp, target)
    return digest, len(data)


def _put_stream(store: Store, source: oci.Source) -> tuple[str, int]:
    """The rootfs's tar stream as a blob; its digest and size."""
    tmp = store.blobs_dir / "sha256" / f".tmp-{os.getpid()}"
    h = hashlib.sha256()
    size = 0
    try:
        with open(tmp, "wb") as out:
            for stream in _stream(source):
                while chunk := stream.read(CHUNK):
                    h.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
    except (EOFError, gzip.BadGzipFile, OSError) as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise InputError(
                f"image source {source.text!r}", "not enough free space", "free some"
            ) from None
        raise InputError(f"image source {source.text!r}", f"unreadable: {e}", "check it") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    digest = "sha256:" + h.hexdigest()
    os.rename(tmp, store.blob(digest))
    return digest, size


def pack_rootfs(store: Store, source: oci.Source, layout: Path) -> None:
    """A one-layer OCI image of a rootfs folder or tarball, in ``layout`` (tag REF).

    Its config holds only the layer and this host's platform, no date: the same
    root filesystem always gives the same digest (a second import reuses it).
    """
    layer, size = _put_stream(store, source)
    config = {
        "architecture": oci.host_arch(),
        "os": "linux",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": [layer]},
    }
    cdigest, csize = put_blob(store, json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": cdigest, "size": csize},
        "layers": [{"mediaType": LAYER_TYPE, "digest": layer, "size": size}],
    }
    mdigest, msize = put_blob(store, json.dumps(manifest, sort_keys=True).encode())
    layout.mkdir()
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}\n')
    desc: dict[str, Any] = {"mediaType": MANIFEST_TYPE, "digest": mdigest, "size": msize}
    desc["annotations"] = {"org.opencontainers.image.ref.name": REF}
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [desc]}))
    link_blobs(layout)


def link_blobs(layout: Path) -> None:
    """Point ``layout/blobs`` at the store's shared blobs (layout is by-digest/X/oci)."""
    blobs = layout / "blobs"
    if blobs.is_dir() and not blobs.is_symlink():
        shutil.rmtree(blobs)  # skopeo's own, empty: the blobs went to the shared folder
    blobs.symlink_to(Path("..", "..", "..", "blobs"))
