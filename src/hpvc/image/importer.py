"""``import_image``: a node image from an OCI/Docker image or a root filesystem.

Debian's tools do the image work: skopeo reads every transport (a docker or
OCI archive, an OCI layout, Podman's storage) and copies the image into the
store, checking each blob's digest; umoci unpacks it into a root filesystem
(whiteouts, hard links, xattrs, and paths kept inside the root: a ``../``
entry or a link pointing out is resolved within it, never followed onto the
host). hpvc writes no layer unpacker.

The store keeps every imported blob once, in ``blobs/sha256/`` (skopeo's
``--dest-shared-blob-dir``): two images on a common base share its layers
there. An image is named by its config's digest (its "image ID": the same
layers and config give the same digest whatever archive format carried them)
and has ``by-digest/<digest>/`` with its unpacked ``rootfs/``, its
``image.json`` and an ``oci/`` layout whose ``blobs`` links to the shared
blobs. The unpacked rootfs is per image (what a container node's overlay
mounts as its lower directory); stacking unpacked layers would share those
too, but umoci 0.4.7 applies whiteouts as deletions, not in overlayfs' form,
so layer folders could not be stacked without writing that conversion here.

Imports run one at a time (``Store.import_lock``) in
``by-digest/import.tmp-<pid>/``, renamed into place when complete; on any
failure the folder and any blob no image uses are removed, and a folder an
import killed outright left is swept by the next import (or ``hpvc gc``).
A source whose manifest names a config already in the store is not copied or
unpacked again: the name is pointed at it at once.

A root filesystem (``dir:`` or a tarball) is the one thing neither tool reads
as an image, so hpvc packs it itself into a one-layer OCI image (the layer is
the tar stream, uncompressed: ``tar`` makes it from a folder, a tarball is
decompressed into it), then umoci unpacks that like any other image (``hpvc.image.pack``).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.faults import inject
from hpvc.image import oci, pack, rootfs
from hpvc.image.builder import _sigterm_interrupts
from hpvc.image.catalog import StoreArg, as_store
from hpvc.image.model import Image, check_name
from hpvc.image.store import InUse, Store, remove_tree
from hpvc.progress import Progress, quiet

REF = pack.REF  # the tag of the one image in each stored OCI layout
# Room kept free beyond what an import's blobs and rootfs take.
SPARE_BYTES = 64 << 20


def _tool(name: str) -> str:
    exe = shutil.which(name)
    if exe is None:
        raise MissingDependency("image import", f"{name} not found", f"apt-get install {name}")
    return exe


def _run(argv: list[str], what: str) -> str:
    """Run skopeo or umoci; a failure is bad input (the source), said in one line."""
    r = subprocess.run(argv, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        lines = [ln.strip() for ln in (r.stderr or r.stdout).splitlines() if ln.strip()]
        why = lines[-1] if lines else f"{Path(argv[0]).name} exit code {r.returncode}"
        if "no space left on device" in why.lower():
            raise InputError(what, "not enough free space in the image store", "free some space")
        raise InputError(what, _message(why), "check the source")
    return r.stdout


def _message(line: str) -> str:
    """skopeo's ``time=... level=fatal msg="..."`` -> what is inside msg; umoci's
    error line -> the text after its mark (a cross); anything else as it is."""
    if 'msg="' in line:
        inner = line.split('msg="', 1)[1].rsplit('"', 1)[0]
        return inner.replace('\\"', '"')
    return line.lstrip("\u2a2f\u2022 ").strip()  # umoci marks errors with a cross


def _json(text: str | bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise InputError(what, f"unreadable JSON: {e}", "check the source") from None
    if not isinstance(doc, dict):
        raise InputError(what, "its manifest or config is not a JSON object", "check the source")
    return doc


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def check_space(store: Store, layers: list[tuple[str, int]], what: str) -> None:
    """Refuse an import whose blobs to copy plus its unpacked layers (at least
    their stored size) do not fit in the store's free space, before writing."""
    new = sum(size for digest, size in layers if not store.blob(digest).exists())
    need = new + sum(size for _, size in layers) + SPARE_BYTES
    free = free_bytes(store.root)
    if need > free:
        raise InputError(
            what,
            f"needs about {need >> 20} MiB, the image store has {free >> 20} MiB free",
            f"free space in {store.root} or use another --store",
        )


# ---- images skopeo reads -----------------------------------------------------


def _skopeo_ref(source: oci.Source) -> str:
    if source.file and not os.path.exists(source.file):
        raise InputError(f"image source {source.text!r}", f"{source.file} not found", "check it")
    return source.ref


def known_digest(skopeo: str, source: oci.Source, store: Store, what: str) -> str | None:
    """Check the source's platform and size before copying anything; the digest
    of its config when it is already in the store (then nothing is copied)."""
    ref = _skopeo_ref(source)
    raw = _json(_run([skopeo, "inspect", "--raw", ref], what), what)
    if oci.is_index(raw):
        oci.pick_platform(raw, what)  # refuses a list without this platform
        info = _json(_run([skopeo, "inspect", ref], what), what)
        layers = [(str(x["Digest"]), int(x.get("Size", 0))) for x in info.get("LayersData", [])]
    else:
        digest = oci.hex_of(str((raw.get("config") or {}).get("digest", "")), what)
        if store.is_complete(digest):
            return digest
        layers = oci.layer_sizes(raw)
    config = _json(_run([skopeo, "inspect", "--config", "--raw", ref], what), what)
    oci.check_config(config, what)
    check_space(store, layers, what)
    return None


def copy_in(skopeo: str, source: oci.Source, store: Store, layout: Path, what: str) -> None:
    """skopeo copies the image into ``layout``, its blobs into the shared folder.

    Plain tar layers (a docker archive's, Podman storage's) stay plain
    (``--dest-oci-accept-uncompressed-layers``): compressing them here only to
    have umoci decompress them again doubled the time of a big import (docs/
    benchmarks.md, "Image import"). skopeo 1.9 labels such a layer ``tar+gzip``
    all the same, which umoci cannot read, so ``_relabel_plain`` writes the
    manifest again with the plain label where the blob is no gzip stream.
    ``--insecure-policy``: the sources are local files and storage, with no
    signatures to check, and a host without /etc/containers/policy.json must
    still import.
    """
    argv = [skopeo, "--insecure-policy", "copy", "--quiet", "--dest-oci-accept-uncompressed-layers"]
    argv += ["--dest-shared-blob-dir", str(store.blobs_dir), source.ref, f"oci:{layout}:{REF}"]
    _run(argv, what)
    pack.link_blobs(layout)
    _relabel_plain(store, layout, what)


GZIP_MAGIC = b"\x1f\x8b"


def _relabel_plain(store: Store, layout: Path, what: str) -> None:
    """Point ``layout``'s index at a manifest that labels its plain tar layers as
    plain (``oci.relabel_plain``); the blobs themselves are not touched, and
    the manifest skopeo wrote, used by no image then, goes with the next prune."""
    index = _json((layout / "index.json").read_text(), what)
    desc = index["manifests"][0]
    manifest = _read_blob(store, str(desc["digest"]), what)
    plain = set()
    for lay in manifest.get("layers", []):
        with store.blob(str(lay["digest"])).open("rb") as f:
            if f.read(2) != GZIP_MAGIC:
                plain.add(str(lay["digest"]))
    fixed = oci.relabel_plain(manifest, plain)
    if fixed is None:
        return
    digest, size = pack.put_blob(store, json.dumps(fixed, sort_keys=True).encode())
    index["manifests"][0] = {**desc, "digest": digest, "size": size}
    (layout / "index.json").write_text(json.dumps(index))


# ---- the import ----------------------------------------------------------------


def _read_blob(store: Store, digest: str, what: str) -> dict[str, Any]:
    data = store.blob(digest).read_bytes()
    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        raise InputError(what, f"blob {digest[:19]} does not match its digest", "check the source")
    return _json(data, what)


def _unpack(layout: Path, target: Path, what: str) -> None:
    _run([_tool("umoci"), "raw", "unpack", "--image", f"{layout}:{REF}", str(target)], what)


def _populate(name: str, source: oci.Source, store: Store, tmp: Path, what: str) -> Image:
    """Copy (or pack) the image into ``tmp/oci``, unpack it into ``tmp/rootfs``,
    write ``tmp/image.json``; the Image (its digest may already be stored)."""
    started = time.monotonic()
    layout = tmp / "oci"
    if source.kind == "skopeo":
        copy_in(_tool("skopeo"), source, store, layout, what)
    else:
        pack.pack_rootfs(store, source, layout)
    inject("import:copied")  # tests: crash:import:copied is a kill -9 mid-import
    index = _json((layout / "index.json").read_text(), what)
    mdigest = str(index["manifests"][0]["digest"])
    manifest = _read_blob(store, mdigest, what)
    cdigest = str(manifest["config"]["digest"])
    config = _read_blob(store, cdigest, what)
    oci.check_config(config, what)
    digest = oci.hex_of(cdigest, what)
    image = Image(
        name=name,
        digest=digest,
        path=store.digest_dir(digest),
        suite="",
        packages=(),
        mirror="",
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        size_bytes=0,
        build_seconds=0.0,
        debootstrap_version="",
        source=source.text,
        manifest=mdigest,
        layers=tuple(oci.layer_sizes(manifest)),
        architecture=str(config.get("architecture", "")),
        config=oci.node_config(config),
    )
    if store.is_complete(digest):
        return image
    _unpack(layout, tmp / "rootfs", what)
    size = rootfs.tree_size(tmp / "rootfs")
    image = replace(image, size_bytes=size, build_seconds=time.monotonic() - started)
    store.write_metadata(tmp, image.metadata())
    return image


def _install(store: Store, name: str, tmp: Path, digest: str, in_use: InUse) -> None:
    with store.lock():
        if store.is_complete(digest):
            remove_tree(tmp)
        else:
            os.rename(tmp, store.digest_dir(digest))
        store.point(name, digest, in_use)


def _reuse(store: Store, name: str, digest: str, in_use: InUse) -> Image:
    with store.lock():
        store.point(name, digest, in_use)
        return replace(store.load(name, digest), reused=True)


def require_importer() -> None:
    """Only root imports, into the site's store, before anything is read or written.

    The store is the site's: every host (or a shared ``image_dir``) reads it,
    and a Slurm job names an image by name from the site's list (``images=``
    in plugstack.conf). An image is software the site runs for its users, so
    the site vets it before it imports it, as it vets what it lists; a user's
    own images would need a namespace of images per user, which hpvc does not
    have (docs/slurm.md, "Imported images under Slurm").
    """
    if os.geteuid() != 0:
        raise InputError(
            "image import",
            "needs root",
            "the site's administrators vet and import the images every host runs;"
            " ask them to import it, then name it in your spec",
        )


def import_image(
    name: str,
    source: str,
    *,
    store: StoreArg = None,
    progress: Progress = quiet,
    in_use: InUse = lambda d: False,
) -> Image:
    """Import ``source`` (``hpvc.image.oci.parse_source``) as the image ``name``.

    Bad input (a corrupt archive, a digest mismatch, another architecture, a
    manifest list without this platform, too little space) is an InputError
    and leaves the store as it was. An image already stored is reused at once.
    """
    require_importer()
    check_name(name)
    src = oci.parse_source(source)
    what = f"image import {source}"
    s = as_store(store)
    s.ensure()
    (s.blobs_dir / "sha256").mkdir(parents=True, exist_ok=True)
    _tool("umoci")
    with s.import_lock():
        swept = s.sweep_imports()
        if swept:
            progress(f"removed {len(swept)} interrupted import(s)")
            s.prune_blobs()
        if src.kind == "skopeo":
            progress(f"inspecting {source}")
            known = known_digest(_tool("skopeo"), src, s, what)
            if known is not None:
                progress(f"reusing {known[:12]}")
                return _reuse(s, name, known, in_use)
        tmp = s.digests_dir / f"import.tmp-{os.getpid()}"
        tmp.mkdir()
        try:
            with _sigterm_interrupts():
                progress(f"copying {source}")
                image = _populate(name, src, s, tmp, what)
                if s.is_complete(image.digest):
                    remove_tree(tmp)
                    progress(f"reusing {image.short_digest}")
                    return _reuse(s, name, image.digest, in_use)
                _install(s, name, tmp, image.digest, in_use)
        except BaseException as e:
            progress("removing the unfinished import")
            remove_tree(tmp, unmount=True)
            s.prune_blobs()
            if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise InputError(what, "no space left in the image store", "free some") from None
            if isinstance(e, (KeyError, TypeError, ValueError)) and not isinstance(e, HpvcError):
                raise InputError(what, f"malformed image: {e!r}", "check the source") from None
            raise
        s.prune_blobs()
    return s.load(name, image.digest)
