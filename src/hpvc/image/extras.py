"""Extras: pinned software an image gets after debootstrap, and the presets that name them.

An extra is what Debian does not package the way hpvc needs it (Apache Spark,
pinned, the same bytes the native benchmarks run). Its name carries its pin
(``spark-3.5.3``), is part of the recipe's digest, and is recorded in
``image.json``; its installer copies files into the finished rootfs, never
outside it. An extra also names the Debian packages it needs, which join the
recipe's packages.

A preset is an image name that picks a recipe by itself: ``hpvc image build
spark`` is the default packages plus the ``spark-3.5.3`` extra. Any other name
keeps the plain default recipe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from hpvc.errors import HpvcError, InputError
from hpvc.image.model import (
    DEFAULT_PACKAGES,
    NFS_SERVER_PACKAGES,
    normalize_extras,
    normalize_packages,
)
from hpvc.progress import Progress

Installer = Callable[[Path, Progress], None]


@dataclass(frozen=True)
class Extra:
    """One extra: its pinned name, the Debian packages it needs, how it gets into a rootfs."""

    name: str
    packages: tuple[str, ...]
    install: Installer
    about: str
    # The digest of what it installs of hpvc's own, beyond its pinned name
    # (part of the image recipe's digest: hpvc.image.model.ImageSpec).
    content: Callable[[], str] | None = None


def _spark(rootfs: Path, progress: Progress) -> None:
    from hpvc.spark.install import install_spark  # Spark's code only when an image wants it

    install_spark(rootfs, progress)


def _spark_content() -> str:
    from hpvc.spark import cds
    from hpvc.spark.app import sources_digest  # the TeraSort jar's sources and Spark version

    return f"{sources_digest()}+cds-{cds.recipe()}"


SPARK_EXTRA = "spark-3.5.3"  # hpvc.spark.dist.VERSION; a test keeps the two equal
# Debian bookworm's OpenBLAS (libopenblas0-pthread 0.3.21): the pin is the suite's
# version, checked in the finished rootfs, so a suite with another one fails the build
# rather than give the hpcc suite a BLAS the host does not run.
OPENBLAS_EXTRA = "openblas-0.3.21"
OPENBLAS_LIB = "usr/lib/{arch}/openblas-pthread/libopenblasp-r0.3.21.so"


def _openblas(rootfs: Path, progress: Progress) -> None:
    """Nothing to install (the Debian package did); check that it is the pinned one."""
    import sysconfig

    arch = str(sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu")
    lib = rootfs / OPENBLAS_LIB.format(arch=arch)
    if not lib.is_file():
        raise HpvcError(
            f"extra {OPENBLAS_EXTRA!r}",
            f"/{OPENBLAS_LIB.format(arch=arch)} is not in the image (the suite has another"
            " OpenBLAS)",
            "build from bookworm (--suite bookworm) or leave the extra out",
        )
    progress(f"OpenBLAS: /{OPENBLAS_LIB.format(arch=arch)}")


EXTRAS: dict[str, Extra] = {
    SPARK_EXTRA: Extra(
        name=SPARK_EXTRA,
        # Java for Spark; ps for Spark's launch scripts (load-spark-env.sh); the
        # NFS server a VM cluster's shared directory needs (Spark's logs live there).
        packages=("openjdk-17-jre-headless", "procps", *NFS_SERVER_PACKAGES),
        install=_spark,
        about="Apache Spark 3.5.3 at /opt/spark, hpvc's TeraSort at /opt/hpvc/terasort.jar",
        content=_spark_content,
    ),
    OPENBLAS_EXTRA: Extra(
        name=OPENBLAS_EXTRA,
        packages=("libopenblas0-pthread",),
        install=_openblas,
        about="Debian's OpenBLAS 0.3.21 (pthread) beside the reference BLAS, for hpcc runs",
    ),
}


# Image names that pick a recipe by themselves: name -> its extras (with the
# default packages, and whatever --packages adds).
# ``hpc-openblas``: the nodes of ``hpvc bench run --suite hpcc`` (hpvc.bench.hpcc.blas).
PRESETS: dict[str, tuple[str, ...]] = {"spark": (SPARK_EXTRA,), "hpc-openblas": (OPENBLAS_EXTRA,)}


def content_digests(names: Iterable[str]) -> dict[str, str]:
    """{extra: digest of what it installs of hpvc's own} for the known ``names`` that have one."""
    out = {}
    for name in names:
        extra = EXTRAS.get(name)
        if extra is not None and extra.content is not None:
            out[name] = extra.content()
    return out


def preset_extras(name: str) -> tuple[str, ...]:
    """The extras the image name ``name`` stands for; () for a name that is no preset."""
    return PRESETS.get(name, ())


def lookup(names: Iterable[str]) -> list[Extra]:
    """The registered extras for ``names`` (sorted, unique); InputError for an unknown one."""
    out = []
    for name in normalize_extras(names):
        extra = EXTRAS.get(name)
        if extra is None:
            known = ", ".join(sorted(EXTRAS))
            raise InputError(f"extra {name!r}", "not known", f"known extras: {known}")
        out.append(extra)
    return out


def with_extras(packages: Iterable[str] | None, extras: Iterable[str]) -> tuple[str, ...] | None:
    """``packages`` plus what ``extras`` need; None (the defaults) stays None without extras."""
    found = lookup(extras)
    if not found:
        return None if packages is None else normalize_packages(packages)
    base = DEFAULT_PACKAGES if packages is None else tuple(packages)
    return normalize_packages([*base, *(p for e in found for p in e.packages)])
