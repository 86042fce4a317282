"""What the host's CRIU can do: ``criu check`` asked once, its verdict in one line.

Container nodes would be checkpointed by CRIU driven directly (Debian's crun
1.8 is built without CRIU, so ``crun checkpoint`` is not there; HOST-NOTES).
Before anything is frozen, the crun backend asks this module whether CRIU runs
on this kernel at all: CRIU 3.17 (Debian bookworm's) stops at its kernel
feature detection on kernels 6.13 and newer (docs/checkpoint.md "Containers").
``criu check`` reads the kernel and changes nothing on the host (on success it
may cache what it found in /run/criu.kdat, CRIU's own cache).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

Which = Callable[[str], str | None]
TIMEOUT_S = 30
# CRIU's error lines: "Error (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds".
_ERROR = re.compile(r"^(?:\(\d+\.\d+\) )?Error \(([^)]*)\): (.*)$")
_VERSION = re.compile(r"^Version: (\S+)", re.MULTILINE)


@dataclass(frozen=True)
class CriuCheck:
    """``installed``: a criu binary was found; ``ok``: ``criu check`` passed;
    ``version`` as criu prints it ("3.17.1"); ``error``: CRIU's first error,
    one line, "" when ok."""

    installed: bool
    ok: bool
    version: str
    error: str


def parse_version(text: str) -> str:
    """The version in ``criu --version``'s output ("" when there is none)."""
    m = _VERSION.search(text)
    return m.group(1) if m else ""


def first_error(text: str) -> str:
    """CRIU's first error line in ``text`` as "<message> (<source>:<line>)"; the
    first non-empty line when CRIU wrote no error line; "" for no output."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        m = _ERROR.match(ln)
        if m:
            return f"{m.group(2)} ({m.group(1)})"
    return lines[0] if lines else ""


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=TIMEOUT_S)


def check(which: Which = shutil.which) -> CriuCheck:
    """Run ``criu --version`` and ``criu check`` on this host."""
    criu = which("criu")
    if criu is None:
        return CriuCheck(installed=False, ok=False, version="", error="criu not found")
    version = parse_version(_run([criu, "--version"]).stdout)
    done = _run([criu, "check"])
    if done.returncode == 0:
        return CriuCheck(installed=True, ok=True, version=version, error="")
    why = first_error(done.stderr + "\n" + done.stdout) or f"exit status {done.returncode}"
    return CriuCheck(installed=True, ok=False, version=version, error=why)
