"""One lock per cluster: up, scale and down of one cluster never overlap (issue 17.2).

A `down` while another command holds the cluster waits, and says who it
waits for; two `down`s at once end with one success and one clear "no such
cluster" (exit 2), never a traceback, and nothing is left on the host.
"""

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

HPVC = [sys.executable, "-m", "hpvc"]


def test_down_waits_for_the_holder_and_says_who(store: Store, tmp_path: Path) -> None:
    image_ready()
    name = f"lk{os.getpid() % 10000}"
    lifecycle.up(spec_file(tmp_path, name, computes=1), store)
    said: list[str] = []
    with store.cluster_lock(name, "a test", said.append):
        down = subprocess.Popen(
            [*HPVC, "down", name], env=cli_env(store), cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(1.5)
        assert down.poll() is None, "down must wait while the cluster is held"
        assert store.names() == [name] and leftovers(name) != []
    _, err = down.communicate(timeout=60)
    assert down.returncode == 0, err
    assert f"cluster {name} is busy: waiting for PID {os.getpid()} (a test) to finish" in err
    assert leftovers(name) == [] and store.names() == []
    assert said == []  # the test itself never waited


def test_two_downs_at_once_one_succeeds_one_says_no_such_cluster(
    store: Store, tmp_path: Path
) -> None:
    image_ready()
    name = f"ld{os.getpid() % 10000}"
    lifecycle.up(spec_file(tmp_path, name, computes=2), store)
    argv = [*HPVC, "down", name]
    pipe = subprocess.PIPE
    env = cli_env(store)
    procs = [
        subprocess.Popen(argv, env=env, cwd=ROOT, stdout=pipe, stderr=pipe, text=True)
        for _ in range(2)
    ]
    results = [(p.wait(timeout=60), p.communicate()[1]) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 2], results
    loser = next(err for rc, err in results if rc == 2)
    assert "Traceback" not in loser and f"cluster {name!r}: no such cluster" in loser, loser
    assert leftovers(name) == [] and store.names() == []
