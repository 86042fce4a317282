"""A node that died is named at once (issue 17, point 7, in part): `hpvc exec`
into it says it is stopped, in one line, without waiting on the runtime or an
ssh timeout; `hpvc run` refuses with the names of the nodes that do not run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from hpvc.cluster import lifecycle
from hpvc.store import Store
from tests.helpers import ROOT
from tests.integration.test_cluster import cli_env, image_ready, leftovers, spec_file, store

__all__ = ["store"]  # the fixture, shared with test_cluster


def test_exec_and_run_name_a_dead_node(store: Store, tmp_path: Path) -> None:
    image_ready()
    name = f"dn{os.getpid() % 10000}"
    lifecycle.up(spec_file(tmp_path, name, computes=2), store)
    container = f"hpvc-{name}-compute1"
    subprocess.run(["crun", "kill", container, "KILL"], check=True)
    deadline = time.monotonic() + 10
    while (
        "running"
        in subprocess.run(
            ["crun", "state", container], capture_output=True, text=True, check=False
        ).stdout
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    hpvc = [sys.executable, "-m", "hpvc"]
    env = cli_env(store)
    t0 = time.monotonic()
    r = subprocess.run(
        [*hpvc, "exec", name, "compute1", "--", "true"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    # At once: not after a runtime's or ssh's timeout (ssh's alone is 10 s). The bound
    # leaves room for the CLI's start on a loaded 2-CPU machine.
    assert time.monotonic() - t0 < 15
    assert r.returncode == 1, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"node compute1 of {name}: is stopped, not running" in lines[0]
    ok = subprocess.run(
        [*hpvc, "exec", name, "compute0", "--", "true"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    run = subprocess.run(
        [*hpvc, "run", name, "-n", "2", "--", "hostname"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 1, run
    assert "nodes that do not run: compute1 (stopped)" in run.stderr, run.stderr
    assert run.stdout.strip() == ""
    lifecycle.down(name, store)
    assert leftovers(name) == []
