"""The backend registry and protocol: one table picks a backend, states round-trip."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from hpvc.backends import registry
from hpvc.backends.base import Backend, State
from hpvc.backends.crun.backend import CrunState
from hpvc.backends.qemu.backend import VmState
from hpvc.errors import HpvcError, SpecError
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


def test_the_spec_takes_any_backend_name_and_the_registry_judges_it() -> None:
    """The spec does not list the backends (spec/ is below backends/): a name this
    hpvc lacks is refused by the registry, as a spec mistake (exit 2) at its key."""
    s = spec(kind="vm", backend="firecracker")
    assert s.backend == "firecracker"
    with pytest.raises(SpecError) as e:
        registry.for_spec(s, "t.toml")
    assert (e.value.exit_code, e.value.path, e.value.key) == (2, "t.toml", "backend")
    assert e.value.why == "got 'firecracker', not a backend of this hpvc"
    assert e.value.fix == "one of: crun, libvirt, qemu"


@pytest.mark.parametrize(
    ("top", "ours"),
    [
        ({"kind": "container", "backend": "libvirt"}, "crun"),
        ({"kind": "vm", "backend": "crun"}, "libvirt, qemu"),
    ],
)
def test_a_backend_of_another_kind_is_refused(top: dict[str, Any], ours: str) -> None:
    with pytest.raises(SpecError) as e:
        registry.for_spec(spec(**top), "t.toml")
    assert (e.value.exit_code, e.value.key) == (2, "backend")
    assert f"{top['backend']!r} runs kind = " in e.value.why
    assert e.value.fix == f"remove it, or give one of: {ours}"


def test_hpvc_up_refuses_an_unknown_backend_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpvc.cli import main

    path = tmp_path / "c.toml"
    path.write_text('name = "c"\nkind = "vm"\nbackend = "xen"\n[[nodes]]\nrole = "compute"\n')
    monkeypatch.setenv("HPVC_STATE_DIR", str(tmp_path / "state"))
    with pytest.raises(SystemExit) as e:
        main(["up", str(path)])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2
    assert f"{path}: backend: got 'xen', not a backend of this hpvc" in line
    assert "one of: crun, libvirt, qemu" in line
    assert not (tmp_path / "state" / "clusters").exists()  # nothing booked, nothing changed


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
