"""nftables tables hpvc makes: one table's text loaded with ``nft -f -``, a table deleted.

Two host modules keep tables of their own: ``host/vxlan.py`` (a VNI's filter,
undo kind ``"vxlan-filter"``) and ``host/migration_guard.py`` (who reaches a
migration target's port, ``"migration-guard"``). Each writes its own rules'
text and journals its own undo kind (architecture rule 5) before calling
``load``; what they shared (finding ``nft``, feeding it a table, deleting
a table that may already be gone) is here, spelled once. ``nft`` is
Debian's command (package nftables): there is no kept Python binding of
libnftables on PyPI, and the command's text is what render/network.py
shows users. Architecture: docs/architecture.md (``host/``).
"""

from __future__ import annotations

import shutil
import subprocess

from hpvc.errors import HpvcError, MissingDependency


def find(what: str) -> str:
    """The path of ``nft``; ``MissingDependency`` naming ``what`` needs it."""
    path = shutil.which("nft")
    if path is None:
        raise MissingDependency(what, "nft not found", "apt-get install nftables")
    return path


def load(nft: str, table: str, text: str) -> None:
    """Feed ``text`` (one table's commands) to ``nft -f -``; its last error line
    as an ``HpvcError`` naming ``table``."""
    r = subprocess.run([nft, "-f", "-"], input=text, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        raise HpvcError(f"nftables table {table}", why)


def delete(table: str) -> None:
    """Delete ``inet table``; nothing when it (or ``nft``) is gone already."""
    nft = shutil.which("nft")
    if nft is None:
        return
    r = subprocess.run(
        [nft, "delete", "table", "inet", table], capture_output=True, text=True, check=False
    )
    if r.returncode != 0 and "No such file" not in r.stderr:
        raise HpvcError(f"nftables table {table}", r.stderr.strip() or f"exit {r.returncode}")
