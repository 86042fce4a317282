"""``hpvc restart`` without a host (issue 17, point 7): which nodes it picks, the
order stop-then-start through the backend, what it refuses, and what a failed
start leaves. A fake backend stands in for crun, QEMU and libvirt (the real
ones: tests/integration/test_restart.py)."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpvc.backends.base import ClusterEnv, State
from hpvc.cli import main
from hpvc.cluster import restart as rs
from hpvc.errors import HpvcError, InputError
from hpvc.plan import Plan, PlannedNode, plan_cluster
from hpvc.progress import Progress
from hpvc.spec import parse_spec
from hpvc.store import ClusterRecord, Store
from tests.unit.topogen import make_topology


@dataclass
class FakeState(State):
    """The fake backend keeps nothing."""


class FakeBackend:
    """Nodes as a dict of states; every call written to ``calls``."""

    name = "fake"

    def __init__(self, states: dict[str, str], fail_start: bool = False) -> None:
        self.states = states
        self.fail_start = fail_start
        self.calls: list[tuple[str, list[str]]] = []

    def node_state(self, env: ClusterEnv, plan: Plan, node: PlannedNode) -> str:
        return self.states[node.name]

    def stop(self, env: ClusterEnv, plan: Plan, names: list[str], progress: Progress) -> None:
        self.calls.append(("stop", names))
        for n in names:
            self.states[n] = "missing"

    def start(
        self, env: ClusterEnv, plan: Plan, names: list[str], progress: Progress
    ) -> dict[str, float]:
        self.calls.append(("start", names))
        for n in names:
            self.states[n] = "running"
            if self.fail_start:
                raise HpvcError("injected failure", f"start {n}")
        return {"boot": 99.0}  # what a VM backend's start reports


def cluster(tmp_path: Path, status: str = "running") -> Store:
    spec = {
        "name": "c",
        "kind": "container",
        "tuning": {"pinning": "shared", "hugepages": "none", "partition": "commodity"},
        "nodes": [
            {"role": "head", "vcpus": 1, "memory": "256MiB"},
            {"role": "compute", "count": 2, "vcpus": 1, "memory": "256MiB"},
        ],
    }
    plan = plan_cluster(parse_spec(spec), [("h0", make_topology())], None)
    store = Store(tmp_path / "state")
    now = time.time()
    rec = ClusterRecord("c", spec, "c.toml", plan.to_json(), status, now, now, backend="fake")
    rec.phases = {"boot": 1.0}
    store.save(rec)
    return store


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeBackend:
    backend = FakeBackend({"head0": "running", "compute0": "running", "compute1": "stopped"})

    def open_env(store: Store, rec: ClusterRecord) -> tuple[FakeBackend, ClusterEnv]:
        return backend, ClusterEnv(store, rec, FakeState())

    monkeypatch.setattr(rs, "open_env", open_env)
    return backend


def summary(done: list[rs.NodeRestart]) -> list[tuple[str, str, bool, str]]:
    return [(d.node, d.was, d.restarted, d.state) for d in done]


def test_with_no_node_named_every_node_that_does_not_run_comes_back(
    tmp_path: Path, fake: FakeBackend
) -> None:
    store = cluster(tmp_path)
    fake.states["head0"] = "missing"
    done = rs.restart("c", None, store)
    assert fake.calls == [("stop", ["head0", "compute1"]), ("start", ["head0", "compute1"])]
    assert summary(done) == [
        ("head0", "missing", True, "running"),
        ("compute0", "running", False, "running"),
        ("compute1", "stopped", True, "running"),
    ]
    assert store.get("c").phases == {"boot": 1.0}  # up's timings are kept
    fake.calls.clear()
    assert not any(d.restarted for d in rs.restart("c", None, store))
    assert fake.calls == []


def test_a_named_node_that_runs_restarts_only_with_force(tmp_path: Path, fake: FakeBackend) -> None:
    store = cluster(tmp_path)
    said: list[str] = []
    done = rs.restart("c", ["compute0"], store, said.append)
    assert fake.calls == [] and summary(done) == [("compute0", "running", False, "running")]
    assert said == ["node compute0 runs: left as it is (--force restarts it)"]
    done = rs.restart("c", ["compute0", "compute1"], store, force=True)
    assert fake.calls == [
        ("stop", ["compute0", "compute1"]),
        ("start", ["compute0", "compute1"]),
    ]
    assert [d.restarted for d in done] == [True, True]


def test_unknown_nodes_and_clusters_not_running_are_refused(
    tmp_path: Path, fake: FakeBackend
) -> None:
    store = cluster(tmp_path)
    with pytest.raises(InputError, match=r"node 'compute9': not in cluster 'c' \(one of: head0"):
        rs.restart("c", ["compute9"], store)
    with pytest.raises(InputError, match="no such cluster"):
        rs.restart("nope", None, store)
    rec = store.get("c")
    rec.status = "scaling"
    store.save(rec)
    with pytest.raises(InputError, match="cluster 'c': is scaling"):
        rs.restart("c", ["compute1"], store)
    assert fake.calls == []


def test_a_start_that_fails_leaves_the_nodes_stopped_and_the_rest_alone(
    tmp_path: Path, fake: FakeBackend
) -> None:
    store = cluster(tmp_path)
    fake.fail_start = True
    with pytest.raises(HpvcError, match="injected failure"):
        rs.restart("c", None, store)
    assert fake.calls == [("stop", ["compute1"]), ("start", ["compute1"]), ("stop", ["compute1"])]
    assert fake.states == {"head0": "running", "compute0": "running", "compute1": "missing"}
    rec = store.get("c")
    assert rec.status == "running" and rec.phases == {"boot": 1.0}
    fake.fail_start = False
    assert summary(rs.restart("c", None, store))[2] == ("compute1", "missing", True, "running")


def test_restart_waits_for_the_clusters_lock(tmp_path: Path, fake: FakeBackend) -> None:
    store = cluster(tmp_path)
    said: list[str] = []
    with store.cluster_lock("c", "hpvc scale", lambda _: None):
        t = threading.Thread(target=rs.restart, args=("c", None, store, said.append))
        t.start()
        t.join(0.5)
        assert t.is_alive() and fake.calls == []  # waiting, nothing done
    t.join(10)
    assert said[0] == f"cluster c is busy: waiting for PID {os.getpid()} (hpvc scale) to finish"
    assert fake.calls == [("stop", ["compute1"]), ("start", ["compute1"])]


def test_cli_force_without_a_node_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 0)
    with pytest.raises(SystemExit) as e:
        main(["restart", "c", "--force"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["hpvc: hpvc restart --force: names no node (name the nodes to restart)"]
