"""Shared fixtures: the real-machine topology snapshots, extracted once per run."""

from __future__ import annotations

import glob
import os
import tarfile
from pathlib import Path

import pytest

from tests.helpers import TOPOLOGIES, requires


def snapshot_names() -> list[str]:
    """Snapshot names, for parametrizing. With none found, one placeholder, so the
    tests still run and the ``snapshots`` fixture skips, or fails under CI, with
    the reason instead of pytest quietly dropping an empty parameter set."""
    names = sorted(
        os.path.basename(p)[: -len(".tar.bz2")]
        for p in glob.glob(os.path.join(TOPOLOGIES, "*.tar.bz2"))
    )
    return names or ["(no topology snapshots found)"]


@pytest.fixture(scope="session")
def snapshots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Name -> extracted root of every snapshot in ../shared/topologies."""
    requires("topologies")
    out = tmp_path_factory.mktemp("topologies")
    roots: dict[str, Path] = {}
    for name in snapshot_names():
        with tarfile.open(os.path.join(TOPOLOGIES, name + ".tar.bz2")) as tar:
            tar.extractall(out, filter="tar")
        roots[name] = out / name
    return roots
