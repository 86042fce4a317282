"""What ``hpvc image import`` reads: its SOURCE notation and OCI manifests and configs.

Pure: no file, no subprocess. ``parse_source`` turns the user's SOURCE into
what the importer does with it (a transport skopeo reads, or a root filesystem
hpvc packs itself); ``pick_platform`` chooses this host's image from a manifest
list; ``check_config`` refuses an image built for another machine; ``node_config``
keeps the parts of an image's config a node honours.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Any

from hpvc.errors import InputError

INDEX_TYPES = frozenset(
    {
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    }
)
# The parts of an image's config kept in its metadata (the rest stays in its blob).
CONFIG_KEYS = ("Env", "WorkingDir", "User", "Entrypoint", "Cmd", "Labels")
# What `uname -m` says -> the architecture names of OCI (Go's GOARCH).
_GOARCH = {
    "x86_64": "amd64",
    "aarch64": "arm64",
    "armv7l": "arm",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
}
_TARBALL_ENDS = (".tar", ".tar.gz", ".tgz", ".tar.zst", ".tar.zstd")
# SOURCE prefixes hpvc hands to skopeo, and the transport skopeo knows them by.
_SKOPEO = {
    "docker-archive": "docker-archive",
    "oci-archive": "oci-archive",
    "oci": "oci",
    "podman": "containers-storage",
    "containers-storage": "containers-storage",
}
SOURCE_HELP = (
    "docker-archive:PATH, oci-archive:PATH, oci:DIR[:TAG], podman:IMAGE,"
    " containers-storage:IMAGE, dir:ROOTFS or a rootfs tarball (tar:PATH, *.tar[.gz|.zst])"
)


def host_arch(machine: str | None = None) -> str:
    """This host's architecture as OCI names it (``amd64`` on x86_64)."""
    m = machine or platform.machine()
    return _GOARCH.get(m, m)


@dataclass(frozen=True)
class Source:
    """A parsed SOURCE: ``kind`` is ``skopeo`` (``ref`` is skopeo's image
    reference), ``dir`` or ``tar`` (``path`` is a root filesystem to pack);
    ``text`` is what the user wrote, kept in the image's metadata."""

    kind: str
    text: str
    ref: str = ""
    path: str = ""
    # a path skopeo will open (an archive or layout): checked to exist first
    file: str = ""


def parse_source(text: str) -> Source:
    """The SOURCE of ``hpvc image import``; InputError for a notation not known."""
    prefix, sep, rest = text.partition(":")
    if sep and prefix in _SKOPEO and rest:
        ref = f"{_SKOPEO[prefix]}:{rest}"
        if prefix in ("docker-archive", "oci-archive"):
            return Source("skopeo", text, ref=ref, file=rest)
        if prefix == "oci":
            return Source("skopeo", text, ref=ref, file=rest.split(":", 1)[0])
        return Source("skopeo", text, ref=ref)
    if sep and prefix == "dir" and rest:
        return Source("dir", text, path=rest)
    if sep and prefix == "tar" and rest:
        return Source("tar", text, path=rest)
    if text.endswith(_TARBALL_ENDS):
        return Source("tar", text, path=text)
    raise InputError(f"image source {text!r}", "not a source hpvc knows", f"use {SOURCE_HELP}")


def platform_name(entry: dict[str, Any]) -> str:
    p = entry.get("platform") or {}
    name = f"{p.get('os', '?')}/{p.get('architecture', '?')}"
    return f"{name}/{p['variant']}" if p.get("variant") else name


def is_index(manifest: dict[str, Any]) -> bool:
    """A manifest list (OCI index or Docker list) rather than one image's manifest."""
    if manifest.get("mediaType") in INDEX_TYPES:
        return True
    return "manifests" in manifest and "layers" not in manifest


def pick_platform(index: dict[str, Any], what: str, arch: str | None = None) -> dict[str, Any]:
    """The entry of a manifest list for linux on this host's architecture."""
    want = arch or host_arch()
    entries = [e for e in index.get("manifests", []) if isinstance(e, dict)]
    for e in entries:
        p = e.get("platform") or {}
        if p.get("os") == "linux" and p.get("architecture") == want:
            return e
    have = ", ".join(sorted({platform_name(e) for e in entries})) or "no images"
    raise InputError(
        what, f"its manifest list has no linux/{want} image (it has {have})", "import another"
    )


def check_config(config: dict[str, Any], what: str, arch: str | None = None) -> None:
    """Refuse an image whose config is for another OS or architecture."""
    want = arch or host_arch()
    os_, got = config.get("os", "linux"), config.get("architecture", "")
    if os_ != "linux" or got != want:
        raise InputError(
            what,
            f"the image is for {os_}/{got or 'an unknown CPU'}, this host runs linux/{want}",
            f"import the linux/{want} variant",
        )


def node_config(config: dict[str, Any]) -> dict[str, Any]:
    """Env, WorkingDir, User, Entrypoint, Cmd and Labels of an image config, where set."""
    inner = config.get("config") or {}
    return {k: inner[k] for k in CONFIG_KEYS if inner.get(k)}


PLAIN_LAYER = "application/vnd.oci.image.layer.v1.tar"
GZIP_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def relabel_plain(manifest: dict[str, Any], plain: set[str]) -> dict[str, Any] | None:
    """``manifest`` with each layer in ``plain`` (digests of blobs that are a
    plain tar stream) labelled as the plain tar it is rather than ``tar+gzip``;
    None when no label changes."""
    layers = manifest.get("layers", [])
    wrong = [i for i, lay in enumerate(layers) if lay.get("mediaType") == GZIP_LAYER
             and lay.get("digest") in plain]  # fmt: skip
    if not wrong:
        return None
    fixed = [
        dict(lay, mediaType=PLAIN_LAYER) if i in wrong else lay for i, lay in enumerate(layers)
    ]
    return {**manifest, "layers": fixed}


def layer_sizes(manifest: dict[str, Any]) -> list[tuple[str, int]]:
    """(digest, size) of each layer an image manifest lists."""
    return [(str(lay["digest"]), int(lay.get("size", 0))) for lay in manifest.get("layers", [])]


def hex_of(digest: str, what: str) -> str:
    """``sha256:<hex>`` -> ``<hex>``; InputError for any other algorithm or spelling."""
    algo, _, value = digest.partition(":")
    if algo != "sha256" or len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise InputError(what, f"unsupported digest {digest!r}", "only sha256 digests are imported")
    return value


def merged_env(
    image_env: list[str] | tuple[str, ...], defaults: tuple[str, ...]
) -> tuple[str, ...]:
    """The image's Env, with each default variable whose name it does not set."""
    names = {kv.split("=", 1)[0] for kv in image_env}
    return (*image_env, *(kv for kv in defaults if kv.split("=", 1)[0] not in names))
