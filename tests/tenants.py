"""Ordinary users for the tests: Slurm jobs are submitted by them, never by
root, and a second one checks what one tenant can see of another's job.

The accounts are made with useradd (no home, no password, a marker in the
comment field) and removed with userdel when the session ends, also ones an
interrupted earlier session left (two test sessions at once on one machine
would share them); an account of the same name that does not carry the
marker is never touched.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from hpvc.bench.slurm.cluster import Submitter

MARK = "hpvc test tenant"
NAMES = ("hpvct1", "hpvct2")


def _ours(name: str) -> bool | None:
    """True: our account; False: someone else's; None: no such account."""
    try:
        return pwd.getpwnam(name).pw_gecos == MARK
    except KeyError:
        return None


@contextmanager
def tenants() -> Iterator[tuple[Submitter, Submitter]]:
    if os.geteuid() != 0:
        pytest.skip("making test users needs root")
    made: list[str] = []
    try:
        for name in NAMES:
            ours = _ours(name)
            if ours is False:
                pytest.fail(f"user {name} exists and is not a test tenant: remove or rename it")
            made.append(name)
            if ours is None:
                subprocess.run(
                    ["useradd", "--no-create-home", "--home-dir", "/nonexistent", "--shell",
                     "/bin/sh", "--comment", MARK, "--user-group", name],
                    check=True, capture_output=True, text=True,
                )  # fmt: skip
        a, b = (Submitter.named(n) for n in NAMES)
        yield a, b
    finally:
        for name in made:
            # Fails while a process of theirs lives; their jobs are gone by now.
            if _ours(name):
                subprocess.run(["userdel", name], check=False, capture_output=True)
