"""``hpvc doctor``'s whole report: the host's checks, then hpvc's own on this host.

The host's checks are ``hpvc.host.doctor``'s (read-only; the CLI may import that
module for its ``Report`` type, docs/architecture.md rule 2). What this module
adds is a check that is not about the host but about hpvc on it: on the live
host (not a snapshot), whether a resident hpvc (``hpvc serve``, hpvc.resident)
answers for this state directory.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import replace

from hpvc.host.doctor import Check, Report
from hpvc.host.doctor import run_checks as host_checks
from hpvc.host.probe import Which
from hpvc.sysroot import HOST, RootLike, as_root


def resident_check(path: str | None = None) -> Check:
    """Whether a resident hpvc listens on this state directory's socket."""
    from hpvc import resident

    path = path or resident.socket_path()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError:
        return Check(
            "resident hpvc",
            "warn",
            f"none on {path}: each command starts Python (about 0.45 s)",
            "hpvc serve (as root; systemd: docs/slurm.md)",
        )
    finally:
        s.close()
    return Check("resident hpvc", "ok", f"hpvc serve answers on {path}")


def run_checks(
    root: RootLike = HOST, which: Which | None = None, env: Mapping[str, str] | None = None
) -> Report:
    """The host's checks (``hpvc.host.doctor.run_checks``), and on the live
    host whether a resident hpvc answers."""
    report = host_checks(root, which, env)
    if not as_root(root).is_host:
        return report
    return replace(report, checks=(*report.checks, resident_check()))
