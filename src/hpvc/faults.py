"""Fault injection for tests: ``HPVC_FAIL_AT`` names a step of ``up``/``scale``.

``<step>`` raises an ``HpvcError`` right after that step, ``crash:<step>``
kills the process outright (as ``kill -9`` would), so tests prove that every
host change made before it is undone by the rollback or by a later ``down``.
Steps: ``cgroup``, ``hugepages``, ``bridge``, ``node:<name>``.
"""

from __future__ import annotations

import os

from hpvc.errors import HpvcError

ENV = "HPVC_FAIL_AT"


def inject(step: str) -> None:
    """Fail (or crash) right after ``step`` when $HPVC_FAIL_AT names it."""
    want = os.environ.get(ENV, "")
    if want == step:
        raise HpvcError("injected failure", f"{ENV}={step}")
    if want == f"crash:{step}":
        os._exit(70)
