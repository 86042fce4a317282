"""The backend registry and protocol: one table picks a backend, states round-trip."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from hpvc.backends import registry
from hpvc.backends.base import Backend, State
from hpvc.backends.crun.backend import CrunState
from hpvc.backends.qemu.backend import VmState
from hpvc.errors import HpvcError
from hpvc.spec import parse_spec
from hpvc.store import ClusterRecord

NODES = [{"role": "compute", "count": 1, "vcpus": 1, "memory": "256MiB"}]


def spec(**top: Any) -> Any:
    return parse_spec({"name": "t", "nodes": NODES, **top}, "t.toml")


@pytest.mark.parametrize(
    ("top", "want"),
    [
        ({}, "crun"),
        ({"kind": "container"}, "crun"),
        ({"kind": "vm"}, "qemu"),
        ({"kind": "vm", "backend": "qemu"}, "qemu"),
        ({"kind": "vm", "backend": "libvirt"}, "libvirt"),
    ],
)
def test_a_spec_names_its_backend(top: dict[str, Any], want: str) -> None:
    b = registry.for_spec(spec(**top))
    assert b.name == want and registry.name_for(spec(**top)) == want
    assert b.kind == spec(**top).kind


def test_unknown_backend_is_a_clear_error() -> None:
    with pytest.raises(HpvcError, match="one of: crun, libvirt, qemu"):
        registry.get("podman")


PROTOCOL = [
    name for name, _ in inspect.getmembers(Backend, inspect.isfunction) if not name.startswith("_")
]


@pytest.mark.parametrize("name", sorted(registry.BACKENDS))
def test_every_registered_backend_implements_the_whole_protocol(name: str) -> None:
    b = registry.get(name)
    assert len(PROTOCOL) >= 15
    for method in PROTOCOL:
        impl = getattr(type(b), method, None)
        assert callable(impl), f"{name} lacks {method}"
        want = list(inspect.signature(getattr(Backend, method)).parameters)
        assert list(inspect.signature(impl).parameters) == want, f"{name}.{method}"
    assert b.name == name and b.kind in ("container", "vm")
    assert isinstance(b.new_state(), State)


@pytest.mark.parametrize(
    "state",
    [
        CrunState(shm="/x/shm", holder_pid=42, block_device=[8, 0]),
        VmState(accel="kvm", pids={"c0": 7}, ivshmem=["/dev/shm/x", 2], libvirt_uri="test:///"),
    ],
)
def test_backend_state_round_trips_and_ignores_unknown_keys(state: State) -> None:
    data = state.to_json()
    assert type(state).from_json({**data, "from_a_newer_hpvc": 1}) == state


def test_a_record_keeps_typed_fields_and_drops_unknown_ones() -> None:
    rec = ClusterRecord("c", {}, "c.toml", {}, "running", 1.0, 2.0, backend="qemu")
    rec.backend_state = VmState(pids={"n": 3}).to_json()
    back = ClusterRecord.from_json({**rec.to_json(), "extra": {"old": True}})
    assert back == rec and VmState.from_json(back.backend_state).pids == {"n": 3}
