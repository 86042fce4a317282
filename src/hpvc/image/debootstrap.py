"""Running debootstrap: its command line, its progress lines, its failure log."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import deque
from pathlib import Path

from hpvc.errors import HpvcError
from hpvc.image.model import ImageSpec
from hpvc.progress import Progress

TAIL_LINES = 200
# How long a debootstrap that was told to stop may take to clean up (its EXIT
# trap unmounts /proc and /sys in the target) before it is killed.
STOP_GRACE_S = 20.0


def parse_progress(line: str) -> str | None:
    """The user-facing part of a debootstrap output line, or None for noise.

    ``I: Retrieving libc6 2.36-9`` -> ``Retrieving libc6 2.36-9``; warnings keep a
    ``warning:`` prefix; everything else (dpkg chatter, blank lines) is None.

    >>> parse_progress("I: Configuring fio...")
    'Configuring fio...'
    >>> parse_progress("W: Failure trying to run: chroot")
    'warning: Failure trying to run: chroot'
    """
    text = line.rstrip("\r\n")
    if text.startswith("I: "):
        return text[3:].strip() or None
    if text.startswith("W: "):
        return "warning: " + text[3:].strip()
    return None


def argv(exe: str, spec: ImageSpec, target: Path, cache_dir: Path | None) -> list[str]:
    """``debootstrap --variant=minbase --include=PKGS [--cache-dir=DIR] SUITE DIR MIRROR``."""
    cmd = [exe, f"--variant={spec.variant}"]
    if spec.packages:
        cmd.append("--include=" + ",".join(spec.packages))
    if cache_dir is not None:
        cmd.append(f"--cache-dir={cache_dir}")
    return [*cmd, spec.suite, str(target), spec.mirror]


def version(exe: str) -> str:
    """``1.0.128+nmu2+deb12u2`` from ``debootstrap --version``; ``unknown`` if it says nothing."""
    try:
        out = subprocess.run(
            [exe, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out[-1] if out else "unknown"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(LC_ALL="C", LANG="C", DEBIAN_FRONTEND="noninteractive")
    return env


def _stop(proc: subprocess.Popen[str]) -> None:
    """Stop debootstrap and everything it started (its own process group), then reap it."""
    for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run(cmd: list[str], log_path: Path, progress: Progress) -> tuple[int, list[str]]:
    """Run ``cmd``, copy its output to ``log_path``, feed progress; return (rc, last lines).

    It runs in its own session so that Ctrl-C reaches only us; on any exception
    (KeyboardInterrupt included) it is stopped and reaped before we re-raise.
    """
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env=_env(),
            start_new_session=True,
        )
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                tail.append(line.rstrip("\n"))
                step = parse_progress(line)
                if step:
                    progress(step)
            rc = proc.wait()
        except BaseException:
            _stop(proc)
            raise
        finally:
            if proc.stdout is not None:
                proc.stdout.close()
    return rc, list(tail)


def _last_error(tail: list[str]) -> str:
    """debootstrap's last ``E:`` line, else its last non-empty line."""
    for line in reversed(tail):
        if line.startswith("E: "):
            return line[3:].strip()
    for line in reversed(tail):
        if line.strip():
            return line.strip()
    return "no output"


def _target_log_tail(target: Path) -> list[str]:
    """The tail of debootstrap's own log inside the target (dpkg errors end up there)."""
    try:
        text = (target / "debootstrap" / "debootstrap.log").read_text(errors="replace")
    except OSError:
        return []
    return text.splitlines()[-TAIL_LINES:]


def failure(
    name: str, rc: int, tail: list[str], target: Path, logs_dir: Path, digest: str
) -> HpvcError:
    """Save what debootstrap said to ``logs_dir`` and return the one-line error naming it."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    path = logs_dir / f"{digest[:12]}-{stamp}-{os.getpid()}.log"
    inner = _target_log_tail(target)
    text = "\n".join(tail) + "\n"
    if inner:
        text += f"\n--- {target}/debootstrap/debootstrap.log (tail) ---\n" + "\n".join(inner) + "\n"
    try:
        logs_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        where = f"see {path}"
    except OSError:
        where = "its log could not be saved"
    return HpvcError(
        f"image build {name}", f"debootstrap failed (exit {rc}): {_last_error(tail)}", where
    )
