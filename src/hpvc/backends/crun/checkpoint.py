"""Checkpoint of container nodes (issue 28): why the crun backend refuses.

Container nodes would be checkpointed by CRIU driven directly, since
Debian's crun 1.8 is built without CRIU (no ``crun checkpoint``; HOST-NOTES).
On this project's hosts CRIU 3.17 cannot run at all on the kernel (6.18):
it stops at its kernel feature detection, before any process is looked at
(docs/checkpoint.md "Containers", scripts/checkpoint/criu-repro.sh). So
``capabilities.checkpoint`` stays False for crun and every checkpoint method
raises ``refusal()``: one line naming what CRIU said and the way out, exit 2,
asked before any node is frozen. Nothing of the freeze/dump/restore design
in docs/checkpoint.md is built: none of it could be run here.
"""

from __future__ import annotations

import platform

from hpvc.errors import InputError, MissingDependency
from hpvc.host import criu

WHAT = "checkpoint of crun (container) nodes"
DOC = "docs/checkpoint.md, Containers"


def refusal(found: criu.CriuCheck | None = None) -> InputError:
    """The one-line refusal, built from ``criu check`` on this host (run when
    ``found`` is not given)."""
    found = found if found is not None else criu.check()
    if not found.installed:
        return MissingDependency(WHAT, "criu is not installed", "apt-get install criu; " + DOC)
    if not found.ok:
        return InputError(
            WHAT,
            f"CRIU {found.version or '?'} cannot run on this kernel "
            f"({platform.release()}): {found.error}",
            f"needs CRIU 4.1 or newer on kernels 6.13+; {DOC}",
        )
    return InputError(
        WHAT,
        f"CRIU {found.version} runs here, but hpvc's container checkpoint is not built",
        f"it could not be developed on a host where CRIU fails; {DOC}",
    )
