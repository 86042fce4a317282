"""Which BLAS hpcc runs with, the same on every side of an A/B, and proof of which ran.

Debian's ``hpcc`` links ``libblas.so.3``, which the host's alternatives point
at one implementation (the Netlib reference BLAS unless an optimised one is
installed and chosen). HPC users run HPL with an optimised BLAS, so the suite
runs OpenBLAS (Debian's ``libopenblas0-pthread``) by default and picks it for
its own processes only: ``LD_LIBRARY_PATH`` to OpenBLAS' directory puts its
``libblas.so.3`` ahead of the alternatives' link, on the host, in container
nodes and in VM guests alike (their image, ``hpc-openblas``, carries the same
Debian package: ``hpvc.image.extras``), and the host's alternatives are left
as they are. One BLAS thread per rank everywhere (``OPENBLAS_NUM_THREADS=1``,
``OMP_NUM_THREADS=1``): the ranks are the parallelism, as in the suite's MPI
runs. ``system`` runs whatever ``libblas.so.3`` the alternatives give.

Which library ran is read at run time from the loader's own log of rank 0's
hpcc (``LD_DEBUG=files``: the libraries it loaded, not what ``ldd`` would
guess; ``hpvc.bench.hpcc.runner.NODE_SCRIPT``), their symlinks resolved, and
printed as ``HPVC_MAPPED <path>`` lines before hpcc's output; ``identify``
names it.
Pure but for ``missing``, which looks for the library on this host.
"""

from __future__ import annotations

import re
import sysconfig
from pathlib import Path
from typing import Any

# Debian's multiarch triplet (x86_64-linux-gnu): the images are the host's architecture.
MULTIARCH = str(sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu")
OPENBLAS_DIR = f"/usr/lib/{MULTIARCH}/openblas-pthread"
OPENBLAS_PACKAGE = "libopenblas0-pthread"
CHOICES = ("openblas", "system")
DEFAULT = "openblas"
MAPPED = "HPVC_MAPPED "
# The nodes' image per choice: ``hpc-openblas`` is ``hpc`` plus Debian's OpenBLAS.
IMAGE = {"openblas": "hpc-openblas", "system": "hpc"}


def library_dir(choice: str) -> str:
    """What LD_LIBRARY_PATH the ranks get for ``choice`` ("" = none: the alternatives)."""
    return OPENBLAS_DIR if choice == "openblas" else ""


def env(choice: str) -> dict[str, str]:
    """Environment of every rank for ``choice``: one BLAS thread per rank."""
    out = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    if library_dir(choice):
        out["LD_LIBRARY_PATH"] = library_dir(choice)
    return out


def missing(choice: str, root: Path = Path("/")) -> str | None:
    """Why ``choice`` cannot run on the host at ``root``; None when it can."""
    d = library_dir(choice)
    if d and not (root / d.lstrip("/") / "libblas.so.3").is_file():
        return f"{d}/libblas.so.3 not found ({OPENBLAS_PACKAGE} is not installed)"
    return None


def mapped_paths(text: str) -> list[str]:
    """The BLAS files rank 0 had mapped, from the ``HPVC_MAPPED`` lines of a run's output."""
    found = [line[len(MAPPED) :].strip() for line in text.splitlines() if line.startswith(MAPPED)]
    return sorted(set(p for p in found if p))


_OPENBLAS = re.compile(r"libopenblas([po]?)-r(\d+(?:\.\d+)*)\.so")


def identify(paths: list[str]) -> str:
    """A BLAS named from the files mapped: ``OpenBLAS 0.3.21 (pthread)``, ``Netlib
    reference BLAS``, or ``unknown (...)`` when no known library is among them."""
    for p in paths:
        m = _OPENBLAS.search(p)
        if m:
            flavour = {"p": "pthread", "o": "openmp", "": "serial"}[m.group(1)]
            return f"OpenBLAS {m.group(2)} ({flavour})"
    if any("openblas" in p for p in paths):
        return "OpenBLAS"
    if any(re.search(r"/blas/libblas\.so", p) for p in paths):
        return "Netlib reference BLAS"
    for name in ("blis", "mkl", "atlas"):
        if any(name in p.lower() for p in paths):
            return name.upper() if name != "blis" else "BLIS"
    return f"unknown ({', '.join(paths) or 'nothing mapped was seen'})"


def summary(choice: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The BLAS asked for, its settings, and what each config's runs had mapped."""
    ran: dict[str, list[str]] = {}
    for r in runs:
        names = ran.setdefault(r["config"], [])
        if r["blas"] not in names:
            names.append(r["blas"])
    return {
        "choice": choice,
        "env": env(choice),
        "image": IMAGE[choice],
        "ran": ran,
        "same_everywhere": len({b for v in ran.values() for b in v}) <= 1,
    }
