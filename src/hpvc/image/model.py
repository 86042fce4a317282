"""What an image is: its recipe (``ImageSpec``), the recipe's digest, and ``Image``.

Pure: no file, no subprocess. The digest is the sha256 of a canonical JSON of
the recipe, so the same recipe always lands in the same store directory and a
change of suite, package set, mirror, extras or builder format lands in a new
one. Extras (pinned software installed after debootstrap, ``hpvc.image.extras``)
enter the canonical JSON only when there are some, so every recipe without
extras keeps the digest it had before extras existed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpvc.errors import InputError

# Bump when the builder changes what ends up in a rootfs: every digest changes,
# so old images are rebuilt instead of silently reused.
FORMAT_VERSION = 1
VARIANT = "minbase"
DEFAULT_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_NAME = "hpc"
# MPI and the HPC Challenge for jobs, iproute2/procps/ping for the network and
# process checks, fio for block-I/O tests inside nodes.
DEFAULT_PACKAGES: tuple[str, ...] = (
    "openmpi-bin",
    "libopenmpi3",
    "hpcc",
    "iproute2",
    "procps",
    "iputils-ping",
    "fio",
    # VM nodes: hpvc reaches the guests over ssh (containers do not use it).
    "openssh-server",
    "openssh-client",
)

# What a VM guest needs to serve a cluster's shared directory over NFS
# (``[shared] server = "nfs"`` with ``kind = "vm"``): not in the defaults, which
# every container image carries too; the spark extra brings them.
NFS_SERVER_PACKAGES: tuple[str, ...] = ("nfs-ganesha", "nfs-ganesha-vfs", "rpcbind")

_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
_PACKAGE_RE = re.compile(r"[a-z0-9][a-z0-9+.-]+")
_SUITE_RE = re.compile(r"[a-z][a-z0-9-]{0,31}")
_MIRROR_RE = re.compile(r"(https?|file)://[^\s,'\"]+")
_EXTRA_RE = re.compile(r"[a-z0-9][a-z0-9.+-]{0,62}")


def check_name(name: str) -> str:
    """Return ``name`` if it is a usable image name, else raise InputError."""
    if not _NAME_RE.fullmatch(name):
        raise InputError(
            f"image name {name!r}",
            "not a valid name",
            "use lower-case letters, digits, '.', '_' and '-', up to 63 characters, e.g. hpc",
        )
    return name


def is_suite_name(suite: str) -> bool:
    """Whether ``suite`` is spelled like a Debian suite (``bookworm``, ``trixie``)."""
    return bool(_SUITE_RE.fullmatch(suite))


def normalize_packages(packages: Iterable[str]) -> tuple[str, ...]:
    """Sorted, de-duplicated, validated Debian package names."""
    out = set()
    for raw in packages:
        pkg = raw.strip()
        if not pkg:
            continue
        if not _PACKAGE_RE.fullmatch(pkg):
            raise InputError(
                f"package {pkg!r}", "not a Debian package name", "write e.g. --packages vim,strace"
            )
        out.add(pkg)
    return tuple(sorted(out))


def normalize_extras(extras: Iterable[str]) -> tuple[str, ...]:
    """Sorted, de-duplicated extra names (``spark-3.5.3``); whether they exist is the
    registry's business (``hpvc.image.extras``), their spelling is checked here."""
    out = set()
    for raw in extras:
        name = raw.strip()
        if not name:
            continue
        if not _EXTRA_RE.fullmatch(name):
            raise InputError(f"extra {name!r}", "not an extra's name", "e.g. --extras spark-3.5.3")
        out.add(name)
    return tuple(sorted(out))


def split_packages(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]`` (the CLI's --packages notation)."""
    return [p.strip() for p in text.split(",") if p.strip()]


def _extras_content(names: list[str]) -> dict[str, str]:
    from hpvc.image.extras import content_digests  # here: extras imports this module

    return content_digests(names)


@dataclass(frozen=True)
class ImageSpec:
    """The recipe of a rootfs; everything that decides its content, nothing else."""

    suite: str = DEFAULT_SUITE
    packages: tuple[str, ...] = DEFAULT_PACKAGES
    mirror: str = DEFAULT_MIRROR
    variant: str = VARIANT
    format_version: int = FORMAT_VERSION
    extras: tuple[str, ...] = ()

    @classmethod
    def make(
        cls,
        packages: Iterable[str] | None = None,
        suite: str = DEFAULT_SUITE,
        mirror: str = "",
        extras: Iterable[str] = (),
    ) -> ImageSpec:
        """Validated and normalized: packages sorted and unique, no trailing '/' on the mirror."""
        if not is_suite_name(suite):
            raise InputError(
                f"suite {suite!r}",
                "not a Debian suite name",
                "lower-case letters, digits and '-', e.g. --suite bookworm or --suite trixie",
            )
        url = (mirror or DEFAULT_MIRROR).rstrip("/")
        if not _MIRROR_RE.fullmatch(url):
            raise InputError(
                f"mirror {mirror!r}", "not a URL", "e.g. --mirror http://deb.debian.org/debian"
            )
        pkgs = normalize_packages(DEFAULT_PACKAGES if packages is None else packages)
        return cls(suite=suite, packages=pkgs, mirror=url, extras=normalize_extras(extras))

    def canonical_json(self) -> str:
        doc: dict[str, Any] = {
            "format": self.format_version,
            "mirror": self.mirror,
            "packages": sorted(set(self.packages)),
            "suite": self.suite,
            "variant": self.variant,
        }
        if self.extras:  # absent, not empty: recipes without extras keep their digests
            doc["extras"] = sorted(set(self.extras))
            # What an extra installs of hpvc's own (the spark extra's TeraSort
            # jar), by digest: changed sources are a new recipe, not a reuse.
            content = _extras_content(doc["extras"])
            if content:
                doc["extras_content"] = content
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))

    @property
    def digest(self) -> str:
        import hashlib  # here: `hpvc image ls` reads digests, it computes none (issue 33)

        return hashlib.sha256(self.canonical_json().encode()).hexdigest()


@dataclass(frozen=True)
class Image:
    """A built image in the store, as its ``image.json`` and ``names/`` describe it."""

    name: str
    digest: str
    path: Path
    suite: str
    packages: tuple[str, ...]
    mirror: str
    created: str
    size_bytes: int
    build_seconds: float
    debootstrap_version: str
    names: tuple[str, ...] = ()
    reused: bool = field(default=False, compare=False)
    extras: tuple[str, ...] = ()
    # Imported images (``hpvc image import``, hpvc.image.importer) only: the
    # SOURCE given, the manifest's digest, the layers' (digest, size), the
    # config's architecture and the parts of its config a node honours.
    source: str = ""
    manifest: str = ""
    layers: tuple[tuple[str, int], ...] = ()
    architecture: str = ""
    config: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def imported(self) -> bool:
        return bool(self.source)

    @property
    def env(self) -> tuple[str, ...]:
        """The image config's Env (empty for built images)."""
        return tuple(str(kv) for kv in self.config.get("Env", ()))

    @property
    def workdir(self) -> str:
        """The image config's WorkingDir, else ``/``."""
        return str(self.config.get("WorkingDir") or "/")

    @property
    def rootfs(self) -> Path:
        """The root filesystem; backends mount it read-only (overlayfs lower dir)."""
        return self.path / "rootfs"

    @property
    def short_digest(self) -> str:
        return self.digest[:12]

    def metadata(self) -> dict[str, Any]:
        """The content of ``image.json``."""
        if self.imported:
            return {
                "names": list(self.names),
                "digest": self.digest,
                "source": self.source,
                "manifest": self.manifest,
                "architecture": self.architecture,
                "layers": [{"digest": d, "size": n} for d, n in self.layers],
                "config": self.config,
                "created": self.created,
                "size_bytes": self.size_bytes,
                "import_seconds": round(self.build_seconds, 3),
            }
        return {
            "names": list(self.names),
            "digest": self.digest,
            "suite": self.suite,
            "variant": VARIANT,
            "packages": list(self.packages),
            "extras": list(self.extras),
            "mirror": self.mirror,
            "created": self.created,
            "size_bytes": self.size_bytes,
            "build_seconds": round(self.build_seconds, 3),
            "debootstrap_version": self.debootstrap_version,
        }

    def as_dict(self) -> dict[str, Any]:
        """What ``--json`` prints: the metadata plus name, rootfs and whether it was reused."""
        doc: dict[str, Any] = {"name": self.name, "short_digest": self.short_digest}
        doc.update(self.metadata())
        doc["rootfs"] = str(self.rootfs)
        doc["reused"] = self.reused
        return doc

    @classmethod
    def from_metadata(cls, name: str, path: Path, doc: dict[str, Any]) -> Image:
        if doc.get("source"):  # imported (hpvc.image.importer)
            return cls(
                name=name,
                digest=str(doc["digest"]),
                path=path,
                suite="",
                packages=(),
                mirror="",
                created=str(doc["created"]),
                size_bytes=int(doc["size_bytes"]),
                build_seconds=float(doc.get("import_seconds", 0.0)),
                debootstrap_version="",
                names=tuple(doc.get("names", ())),
                source=str(doc["source"]),
                manifest=str(doc.get("manifest", "")),
                layers=tuple((str(x["digest"]), int(x["size"])) for x in doc.get("layers", ())),
                architecture=str(doc.get("architecture", "")),
                config=dict(doc.get("config") or {}),
            )
        return cls(
            name=name,
            digest=str(doc["digest"]),
            path=path,
            suite=str(doc["suite"]),
            packages=tuple(doc["packages"]),
            mirror=str(doc["mirror"]),
            created=str(doc["created"]),
            size_bytes=int(doc["size_bytes"]),
            build_seconds=float(doc["build_seconds"]),
            debootstrap_version=str(doc.get("debootstrap_version", "unknown")),
            names=tuple(doc.get("names", ())),
            extras=tuple(doc.get("extras", ())),
        )
