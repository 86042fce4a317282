"""``hpvc checkpoint``'s order without a host: every node frozen before any is
saved, all thawed after; a failed save thaws all and leaves no folder; what it
refuses before freezing anything. A fake backend records the calls (the real
one: tests/integration/test_checkpoint_vm.py)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

from hpvc.backends.base import Capabilities, ClusterEnv, State
from hpvc.cluster import checkpoint as ck
from hpvc.cluster import checkpoint_format as cf
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
    name: ClassVar[str] = "fake"
    kind: ClassVar[str] = "vm"
    capabilities = Capabilities(repin=False, shared_memory=False, checkpoint=True)

    def __init__(self, fail_save: str = "", states: dict[str, str] | None = None) -> None:
        self.fail_save = fail_save
        self.states = states or {}
        self.refusal = ""  # the backend's own refusal (a container node running a step)
        self.calls: list[tuple[str, list[str]]] = []

    def refuse_checkpoint(self, env: ClusterEnv, plan: Plan) -> None:
        if self.refusal:
            raise InputError(f"checkpoint of {plan.cluster}", self.refusal)

    def node_state(self, env: ClusterEnv, plan: Plan, node: PlannedNode) -> str:
        return self.states.get(node.name, "running")

    def freeze(self, env: ClusterEnv, plan: Plan, names: list[str]) -> None:
        self.calls.append(("freeze", names))

    def thaw(self, env: ClusterEnv, plan: Plan, names: list[str]) -> None:
        self.calls.append(("thaw", names))

    def save(
        self, env: ClusterEnv, plan: Plan, name: str, dest: Path, progress: Progress
    ) -> dict[str, Any]:
        self.calls.append(("save", [name]))
        if name == self.fail_save:
            (dest / "state.bin").write_bytes(b"half")
            raise HpvcError(f"save {name}", "injected")
        (dest / "state.bin").write_bytes(name.encode() * 100)
        return {"files": ["state.bin"], "qemu": "QEMU emulator version 7.2"}


def _store(tmp_path: Path) -> Store:
    spec = {
        "name": "c",
        "kind": "vm",
        "tuning": {"pinning": "shared", "hugepages": "none", "partition": "commodity"},
        "nodes": [{"role": "compute", "count": 3, "vcpus": 1, "memory": "256MiB"}],
    }
    plan = plan_cluster(parse_spec(spec), [("h0", make_topology())], None)
    store = Store(tmp_path / "state")
    now = time.time()
    rec = ClusterRecord("c", spec, "c.toml", plan.to_json(), "running", now, now, backend="fake")
    rec.images = {n.name: "sha256:" + "ab" * 32 for n in plan.nodes}
    store.save(rec)
    return store


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeBackend:
    b = FakeBackend()
    monkeypatch.setattr(ck, "require_root", lambda what: None)
    monkeypatch.setattr(ck, "open_env", lambda store, rec: (b, ClusterEnv(store, rec, FakeState())))
    return b


NODES = ["compute0", "compute1", "compute2"]


def test_every_node_is_frozen_before_any_is_saved(tmp_path: Path, fake: FakeBackend) -> None:
    store = _store(tmp_path)
    dest, m = ck.checkpoint("c", tmp_path / "ck", store=store)
    assert fake.calls[0] == ("freeze", NODES) and fake.calls[-1] == ("thaw", NODES)
    assert sorted(fake.calls[1:-1]) == [("save", [n]) for n in NODES]  # side by side
    back = cf.read_manifest(dest)
    cf.verify(dest, back)
    plan = store.get("c").the_plan()
    assert [(n.name, n.ip, n.mac) for n in back.nodes] == [
        (n.name, n.ip, n.mac) for n in plan.nodes
    ]
    assert back.nodes[1].files[0].path == "nodes/compute1/state.bin"
    assert back.nodes[0].extra == {"qemu": "QEMU emulator version 7.2"}
    assert {n.image_digest for n in back.nodes} == {"sha256:" + "ab" * 32}
    assert back == m and not m.stopped and m.subnet == plan.network.subnet
    assert (dest.stat().st_mode & 0o777) == 0o700  # the guests' memory and keys: root's


def test_a_failed_save_thaws_every_node_and_leaves_no_folder(
    tmp_path: Path, fake: FakeBackend
) -> None:
    store = _store(tmp_path)
    fake.fail_save = "compute1"
    with pytest.raises(HpvcError, match="save compute1: injected"):
        ck.checkpoint("c", tmp_path / "ck", store=store)
    assert fake.calls[-1] == ("thaw", NODES)
    assert not (tmp_path / "ck").exists()
    assert store.get("c").status == "running"


def test_the_frozen_nodes_are_saved_side_by_side(
    tmp_path: Path, fake: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three saves meet at a barrier: saved one after the other, the first
    would wait there alone and fail; side by side (3 CPUs) all pass it."""
    store = _store(tmp_path)
    monkeypatch.setattr(ck.os, "cpu_count", lambda: 3)
    meet = threading.Barrier(3, timeout=10)
    real = fake.save

    def save(env: ClusterEnv, plan: Plan, name: str, dest: Path, p: Progress) -> dict[str, Any]:
        meet.wait()
        return real(env, plan, name, dest, p)

    monkeypatch.setattr(fake, "save", save)
    dest, m = ck.checkpoint("c", tmp_path / "ck", store=store)
    assert [n.name for n in m.nodes] == NODES and fake.calls[-1] == ("thaw", NODES)
    cf.verify(dest, cf.read_manifest(dest))  # every node's files, hashed as written


def test_a_failed_save_is_raised_once_every_other_save_has_ended(
    tmp_path: Path, fake: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """compute0 fails at once while the others are still writing: the folder is
    removed and the nodes thawed only after their saves end (nothing writes
    into a removed folder, no node is thawed while saved)."""
    store = _store(tmp_path)
    monkeypatch.setattr(ck.os, "cpu_count", lambda: 3)
    fake.fail_save = "compute0"
    real = fake.save

    def save(env: ClusterEnv, plan: Plan, name: str, dest: Path, p: Progress) -> dict[str, Any]:
        if name != "compute0":
            time.sleep(0.3)
        got = real(env, plan, name, dest, p)
        fake.calls.append(("saved", [name]))
        return got

    monkeypatch.setattr(fake, "save", save)
    with pytest.raises(HpvcError, match="save compute0: injected"):
        ck.checkpoint("c", tmp_path / "ck", store=store)
    ended = [c for c in fake.calls if c[0] == "saved"]
    assert sorted(ended) == [("saved", ["compute1"]), ("saved", ["compute2"])]
    assert fake.calls[-1] == ("thaw", NODES) and not (tmp_path / "ck").exists()


def test_refusals_come_before_anything_is_frozen(
    tmp_path: Path, fake: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(tmp_path)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("mine")
    with pytest.raises(InputError, match="exists and is not empty"):
        ck.checkpoint("c", busy, store=store)
    fake.states["compute2"] = "stopped"
    with pytest.raises(InputError, match=r"node compute2: is stopped \(hpvc restart c first\)"):
        ck.checkpoint("c", tmp_path / "ck", store=store)
    fake.states.clear()
    monkeypatch.setattr(FakeBackend, "capabilities", Capabilities(False, False))
    with pytest.raises(InputError, match="checkpoint of fake nodes: not supported"):
        ck.checkpoint("c", tmp_path / "ck", store=store)
    with pytest.raises(InputError, match="no such cluster"):
        ck.checkpoint("nope", tmp_path / "ck", store=store)
    monkeypatch.setattr(FakeBackend, "capabilities", Capabilities(False, False, checkpoint=True))
    fake.refusal = "node compute1 runs processes its freeze would not stop"
    with pytest.raises(InputError, match="compute1 runs processes"):
        ck.checkpoint("c", tmp_path / "ck", store=store)
    with pytest.raises(InputError, match="compute1 runs processes"):  # a share of a cut
        ck.Cut(store, "c", tmp_path / "ck")
    assert fake.calls == [] and not (tmp_path / "ck").exists()
    assert (busy / "x").read_text() == "mine"


# --- restore's planner: the saved addresses, MACs and guest shape ---------------------


def _manifest(plan: Plan, spec: dict[str, Any]) -> cf.Manifest:
    nodes = tuple(cf.NodeEntry(n.name, "vm", "qemu", "", n.ip, n.mac, ()) for n in plan.nodes)
    return cf.Manifest("c", 1.0, spec, "", plan.to_json(), plan.network.subnet, nodes)


def test_restore_plans_with_the_saved_addresses_and_macs_under_another_name() -> None:
    from hpvc.cluster.restore import _same_places

    spec = {
        "name": "c",
        "kind": "vm",
        "network": {"subnet": "10.77.0.0/24"},
        "tuning": {"pinning": "shared", "hugepages": "none", "numa": "mirror"},
        "nodes": [
            {"role": "compute", "count": 1, "vcpus": 2, "memory": "1GiB"},
            {"role": "storage", "count": 1, "vcpus": 12, "memory": "4GiB"},  # 2 guest NUMA nodes
        ],
    }
    saved = plan_cluster(parse_spec(spec), [("h0", make_topology())], None)
    m = _manifest(saved, spec)
    other = parse_spec({**spec, "name": "d"})
    fresh = plan_cluster(other, [("h1", make_topology())], None)
    assert [n.mac for n in fresh.nodes] != [n.mac for n in saved.nodes]  # MACs follow the name
    plan = _same_places(m)(other, "h1", make_topology(), None)  # type: ignore[arg-type]
    assert plan.cluster == "d" and plan.hosts[0].name == "h1"
    assert [(n.name, n.ip, n.mac) for n in plan.nodes] == [
        (n.name, n.ip, n.mac) for n in saved.nodes
    ]
    # A host whose NUMA layout gives the guests another shape: refused in one line.
    one_node = make_topology(packages=1, cores_per_node=8)
    with pytest.raises(
        InputError,
        match=(
            r"node storage0: this host gives it 12 vCPU\(s\), 4096 MiB, 1 guest NUMA node\(s\),"
            r" it was saved with 12 vCPU\(s\), 4096 MiB, 2 guest"
        ),
    ):
        _same_places(m)(parse_spec(spec), "h2", one_node, None)  # type: ignore[arg-type]
