"""The libvirt backend without libvirtd or root: XML identity, the journaled define/start/undo
cycle against a fake libvirt module, QEMU processes on fake /proc trees, and read-back.
"""

from __future__ import annotations

import json
import os
import uuid as uuidlib
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hpvc.backends import vm_libvirt
from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.host.journal import Journal

NAME = "hpvc-c1-compute0"
UUID = "c4342c97-a8dd-5b1e-8402-3c5e3d8ba76a"
XML = f"""<domain type="qemu">
  <name>{NAME}</name>
  <uuid>{UUID}</uuid>
  <memory unit="KiB">262144</memory>
  <memoryBacking>
    <hugepages><page size="2048" unit="KiB" nodeset="0" /></hugepages>
    <nosharepages />
    <allocation mode="immediate" />
  </memoryBacking>
  <numatune>
    <memory mode="strict" nodeset="0-1" />
    <memnode cellid="0" mode="strict" nodeset="0" />
    <memnode cellid="1" mode="strict" nodeset="1" />
  </numatune>
</domain>
"""


# --- a fake libvirt ------------------------------------------------------------------


class LibvirtError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message, self.code = message, code

    def get_error_message(self) -> str:
        return self.message

    def get_error_code(self) -> int:
        return self.code


NO_DOMAIN, OPERATION_INVALID, INTERNAL = 42, 55, 1


class FakeDomain:
    def __init__(self, conn: FakeConn, xml: str) -> None:
        root = ET.fromstring(xml)
        self.conn, self.xml = conn, xml
        self.dom_name = root.findtext("name", "")
        self.uuid = root.findtext("uuid", "")
        self.active = False
        self.calls: list[str] = []

    def name(self) -> str:
        return self.dom_name

    def UUIDString(self) -> str:
        return self.uuid

    def isActive(self) -> int:
        return int(self.active)

    def isPersistent(self) -> int:
        return 1

    def create(self) -> int:
        self.calls.append("create")
        if self.conn.fail_create:
            raise LibvirtError("internal error: qemu unexpectedly closed the monitor:\nboom", 1)
        self.active = True
        return 0

    def destroy(self) -> int:
        self.calls.append("destroy")
        if self.conn.destroy_error is not None:
            raise LibvirtError("cannot destroy", self.conn.destroy_error)
        self.active = False
        return 0

    def undefineFlags(self, flags: int) -> int:
        self.calls.append(f"undefine {flags}")
        self.conn.domains.remove(self)
        return 0

    # read-back
    def state(self) -> list[int]:
        return [1 if self.active else 5, 1]

    def XMLDesc(self) -> str:
        return self.xml

    def vcpuPinInfo(self) -> tuple[tuple[bool, ...], ...]:
        return ((False, False, True, False), (False, False, False, True))

    def vcpus(self) -> tuple[list[tuple[int, int, int, int]], list[tuple[bool, ...]]]:
        return [(0, 1, 10, 2), (1, 1, 10, 3)], [(False, False, True, False), (False,) * 3 + (True,)]

    def emulatorPinInfo(self) -> tuple[bool, ...]:
        return (True, True, False, False)

    def numaParameters(self) -> dict[str, Any]:
        return {"numa_mode": 0, "numa_nodeset": "0-1"}

    def info(self) -> list[int]:
        return [1, 262144, 262144, 2, 0]


class FakeConn:
    def __init__(self) -> None:
        self.domains: list[FakeDomain] = []
        self.fail_define: str | None = None
        self.fail_create = False
        self.destroy_error: int | None = None
        self.closed = False

    def _find(self, pred: Callable[[FakeDomain], bool], what: str) -> FakeDomain:
        for d in self.domains:
            if pred(d):
                return d
        raise LibvirtError(f"Domain not found: {what}", NO_DOMAIN)

    def lookupByName(self, name: str) -> FakeDomain:
        return self._find(lambda d: d.dom_name == name, name)

    def lookupByUUIDString(self, uuid: str) -> FakeDomain:
        return self._find(lambda d: d.uuid == uuid, uuid)

    def defineXMLFlags(self, xml: str, flags: int) -> FakeDomain:
        assert flags == FakeLibvirt.VIR_DOMAIN_DEFINE_VALIDATE
        if self.fail_define:
            raise LibvirtError(self.fail_define, 92)
        dom = FakeDomain(self, xml)
        self.domains.append(dom)
        return dom

    def getURI(self) -> str:
        return "qemu:///system"

    def close(self) -> int:
        self.closed = True
        return 0


class FakeLibvirt:
    libvirtError = LibvirtError
    VIR_ERR_NO_DOMAIN = NO_DOMAIN
    VIR_ERR_OPERATION_INVALID = OPERATION_INVALID
    VIR_DOMAIN_DEFINE_VALIDATE = 1
    VIR_DOMAIN_UNDEFINE_MANAGED_SAVE = 1
    VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA = 2
    VIR_DOMAIN_UNDEFINE_NVRAM = 4
    VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA = 16

    def __init__(self) -> None:
        self.conn = FakeConn()
        self.opened: list[str] = []
        self.refuse = False

    def open(self, uri: str) -> FakeConn:
        self.opened.append(uri)
        if self.refuse:
            raise LibvirtError(
                "Failed to connect socket to '/run/libvirt/libvirt-sock': No such file", 38
            )
        return self.conn


@pytest.fixture
def lv(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLibvirt]:
    fake = FakeLibvirt()
    monkeypatch.setattr(vm_libvirt, "_lv", lambda: fake)
    monkeypatch.setattr(vm_libvirt, "find_pid", lambda name, uuid: 4242)
    yield fake


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "journal")


# --- XML identity ---------------------------------------------------------------------


def test_identify_keeps_the_xml_and_reads_the_uuid() -> None:
    assert vm_libvirt.identify(XML, NAME) == (XML, UUID)


def test_identify_adds_a_uuid_right_after_the_name() -> None:
    bare = XML.replace(f"  <uuid>{UUID}</uuid>\n", "")
    xml, uuid = vm_libvirt.identify(bare, NAME)
    root = ET.fromstring(xml)
    assert [el.tag for el in root][:2] == ["name", "uuid"]
    assert root.findtext("uuid") == uuid == str(uuidlib.UUID(uuid))


@pytest.mark.parametrize(
    ("xml", "name", "why"),
    [
        (XML.replace("</domain>", ""), NAME, "not well-formed"),
        (XML, "hpvc-c1-other", "not a domain named 'hpvc-c1-other'"),
        (XML.replace(UUID, "not-a-uuid"), NAME, "invalid UUID 'not-a-uuid'"),
        (f"<network><name>{NAME}</name></network>", NAME, "defines <network>"),
    ],
)
def test_identify_refuses_what_is_not_the_named_domain(xml: str, name: str, why: str) -> None:
    with pytest.raises(InputError, match=why) as err:
        vm_libvirt.identify(xml, name)
    assert "\n" not in str(err.value)


# --- start, undo -----------------------------------------------------------------------


def test_start_records_then_defines_and_starts(lv: FakeLibvirt, journal: Journal) -> None:
    conn = vm_libvirt.connect("qemu:///system?socket=/tmp/x/libvirt-sock")
    assert vm_libvirt.start_domain(journal, conn, XML, NAME) == 4242
    (change,) = journal.entries()
    assert change.kind == "libvirt-domain"
    # the URI it was opened with, not getURI(), which drops ?socket=
    want = {"uri": "qemu:///system?socket=/tmp/x/libvirt-sock", "name": NAME, "uuid": UUID}
    assert change.args == want
    (dom,) = lv.conn.domains
    assert dom.active and dom.calls == ["create"]

    assert journal.undo_all() == []
    assert lv.conn.domains == [] and dom.calls == ["create", "destroy", "undefine 23"]
    assert lv.opened[-1] == "qemu:///system?socket=/tmp/x/libvirt-sock" and lv.conn.closed
    assert journal.entries() == []


def test_a_rejected_xml_is_one_line_and_leaves_nothing(lv: FakeLibvirt, journal: Journal) -> None:
    lv.conn.fail_define = (
        "XML document failed to validate against schema: Unable to validate doc\n"
        "Element domain has extra content: bogus\n"
    )
    with pytest.raises(HpvcError) as err:
        vm_libvirt.start_domain(journal, lv.conn, XML, NAME)
    assert str(err.value) == (
        f"libvirt domain {NAME}: XML document failed to validate against schema: Unable to "
        "validate doc; Element domain has extra content: bogus "
        "(check it with 'virt-xml-validate FILE domain')"
    )
    assert lv.conn.domains == []
    assert [c.kind for c in journal.entries()] == ["libvirt-domain"]  # recorded before defining
    assert journal.undo_all() == []  # nothing there: undo is a no-op


def test_a_domain_that_cannot_start_is_undefined_at_once(lv: FakeLibvirt, journal: Journal) -> None:
    lv.conn.fail_create = True
    with pytest.raises(HpvcError) as err:
        vm_libvirt.start_domain(journal, lv.conn, XML, NAME)
    assert "\n" not in str(err.value)
    assert "closed the monitor:; boom" in str(err.value)
    assert f"/var/log/libvirt/qemu/{NAME}.log" in err.value.fix
    assert lv.conn.domains == []


def test_no_qemu_process_found_is_an_error_and_undefines(
    lv: FakeLibvirt, journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vm_libvirt, "find_pid", lambda name, uuid: None)
    with pytest.raises(HpvcError, match="no QEMU process with -uuid"):
        vm_libvirt.start_domain(journal, lv.conn, XML, NAME)
    assert lv.conn.domains == []


@pytest.mark.parametrize("same", ["name", "uuid"])
def test_an_existing_domain_is_refused_and_not_journaled(
    lv: FakeLibvirt, journal: Journal, same: str
) -> None:
    other = XML.replace(UUID, str(uuidlib.uuid4())) if same == "name" else XML.replace(NAME, "x")
    lv.conn.defineXMLFlags(other, 1)
    with pytest.raises(HpvcError, match="run 'hpvc down' for its cluster first"):
        vm_libvirt.start_domain(journal, lv.conn, XML, NAME)
    assert journal.entries() == []
    assert len(lv.conn.domains) == 1 and not lv.conn.domains[0].calls


def test_undo_leaves_a_same_named_domain_with_another_uuid(lv: FakeLibvirt) -> None:
    lv.conn.defineXMLFlags(XML.replace(UUID, str(uuidlib.uuid4())), 1)
    assert vm_libvirt.remove_domain(lv.conn, NAME, UUID) is False
    assert len(lv.conn.domains) == 1


@pytest.mark.parametrize(("code", "left"), [(OPERATION_INVALID, 0), (INTERNAL, 1)])
def test_undo_ignores_a_domain_that_stopped_meanwhile(
    lv: FakeLibvirt, journal: Journal, code: int, left: int
) -> None:
    vm_libvirt.start_domain(journal, lv.conn, XML, NAME)
    lv.conn.destroy_error = code
    errors = journal.undo_all()
    assert len(errors) == left
    assert len(journal.entries()) == left  # a failed undo stays, to be retried
    if left:
        assert "cannot destroy" in errors[0]


def test_undo_without_libvirtd_keeps_the_record(lv: FakeLibvirt, journal: Journal) -> None:
    vm_libvirt.start_domain(journal, lv.conn, XML, NAME)
    lv.refuse = True
    (error,) = journal.undo_all()
    assert "start libvirtd: see docs/libvirt.md" in error
    assert len(journal.entries()) == 1


# --- connection ------------------------------------------------------------------------


def test_connect_failure_says_to_start_libvirtd(lv: FakeLibvirt) -> None:
    lv.refuse = True
    with pytest.raises(MissingDependency) as err:
        vm_libvirt.connect()
    assert str(err.value) == (
        "libvirt at qemu:///system: cannot connect: Failed to connect socket to "
        "'/run/libvirt/libvirt-sock': No such file (start libvirtd: see docs/libvirt.md)"
    )


def test_missing_bindings_are_a_missing_dependency(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "libvirt", None)  # import fails
    vm_libvirt._lv.cache_clear()
    try:
        with pytest.raises(MissingDependency, match="make setup"):
            vm_libvirt.connect()
    finally:
        vm_libvirt._lv.cache_clear()


def test_real_bindings_without_a_daemon(tmp_path: Path) -> None:
    pytest.importorskip("libvirt")
    with pytest.raises(MissingDependency) as err:
        vm_libvirt.connect(f"qemu:///system?socket={tmp_path / 'no-sock'}")
    assert err.value.fix == "start libvirtd: see docs/libvirt.md"
    assert "\n" not in str(err.value)


# --- QEMU processes on a fake /proc ----------------------------------------------------


def fake_proc(root: Path, procs: dict[int, tuple[list[str], str]]) -> Path:
    """pid -> (argv, state letter); vCPU threads named after QEMU's."""
    for pid, (argv, state) in procs.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        (d / "cmdline").write_bytes(("\0".join(argv) + "\0").encode())
        (d / "stat").write_text(f"{pid} (qemu-system-x86) {state} 1 1 1\n")
        for tid, comm in ((pid, "qemu-system-x86"), (pid + 1, "CPU 0/TCG"), (pid + 2, "CPU 1/KVM")):
            (d / "task" / str(tid)).mkdir(parents=True)
            (d / "task" / str(tid) / "comm").write_text(comm + "\n")
    return root


def qemu_argv(name: str = NAME, uuid: str = UUID) -> list[str]:
    return ["/usr/bin/qemu-system-x86_64", "-name", f"guest={name},debug-threads=on", "-S",
            "-uuid", uuid, "-display", "none"]  # fmt: skip


def test_find_pid_by_uuid_and_name(tmp_path: Path) -> None:
    proc = fake_proc(
        tmp_path / "proc",
        {
            100: (qemu_argv(), "S"),
            200: (qemu_argv(uuid=str(uuidlib.uuid4())), "S"),  # same name, another domain
            300: (qemu_argv(name="hpvc-c1-compute1"), "S"),
            400: (["sleep", "-name", NAME, "-uuid", UUID], "Z"),  # a zombie
        },
    )
    run = tmp_path / "run"
    assert vm_libvirt.find_pid(NAME, UUID, proc, run) == 100
    assert vm_libvirt.find_pid(NAME, UUID.upper(), proc, run) == 100
    assert vm_libvirt.find_pid("hpvc-c1-compute9", UUID, proc, run) is None
    assert not vm_libvirt.is_domain_qemu(400, NAME, UUID, proc)
    assert vm_libvirt.is_domain_qemu(100, NAME, UUID, proc)


def test_find_pid_prefers_a_matching_pid_file(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", {100: (qemu_argv(), "S"), 101: (qemu_argv(), "S")})
    run = tmp_path / "run"
    with pytest.raises(HpvcError, match="several QEMU processes run it: 100, 101"):
        vm_libvirt.find_pid(NAME, UUID, proc, run)
    run.mkdir()
    (run / f"{NAME}.pid").write_text("101")
    assert vm_libvirt.find_pid(NAME, UUID, proc, run) == 101
    (run / f"{NAME}.pid").write_text("999")  # stale: not that QEMU
    with pytest.raises(HpvcError, match="several"):
        vm_libvirt.find_pid(NAME, UUID, proc, run)


def test_vcpu_threads_by_name(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", {100: (qemu_argv(), "S")})
    assert vm_libvirt.vcpu_threads(100, proc) == {0: 101, 1: 102}
    assert vm_libvirt.vcpu_threads(999, proc) == {}


# --- read-back -------------------------------------------------------------------------


def test_memory_backing_and_numa_from_the_xml() -> None:
    mem = vm_libvirt.memory_backing(XML)
    assert mem == {
        "hugepages": [{"size_kib": 2048, "nodeset": "0"}],
        "nosharepages": True,
        "locked": False,
        "source": "",
        "access": "",
        "allocation": "immediate",
    }
    gig = "<domain><memoryBacking><hugepages><page size='1' unit='G'/></hugepages><locked/>"
    gig += "<source type='memfd'/><access mode='shared'/></memoryBacking></domain>"
    mem = vm_libvirt.memory_backing(gig)
    assert mem["hugepages"] == [{"size_kib": 1 << 20, "nodeset": ""}]
    assert (mem["locked"], mem["source"], mem["access"]) == (True, "memfd", "shared")
    default = vm_libvirt.memory_backing(
        "<domain><memoryBacking><hugepages/></memoryBacking></domain>"
    )
    assert default["hugepages"] == [{"size_kib": 0, "nodeset": ""}]
    assert vm_libvirt.memory_backing("<domain/>")["hugepages"] == []

    numa = vm_libvirt.numa_tune({"numa_mode": 2, "numa_nodeset": "0-1"}, XML)
    assert numa == {
        "mode": "interleave",
        "nodeset": "0-1",
        "cells": [
            {"cellid": 0, "mode": "strict", "nodeset": "0"},
            {"cellid": 1, "mode": "strict", "nodeset": "1"},
        ],
    }


def test_read_back_of_a_running_domain(
    lv: FakeLibvirt, journal: Journal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vm_libvirt.start_domain(journal, lv.conn, XML, NAME)
    proc = fake_proc(tmp_path / "proc", {os.getpid(): (qemu_argv(), "S")})
    monkeypatch.setattr(vm_libvirt, "find_pid", lambda name, uuid, proc: os.getpid())
    back = vm_libvirt.read_back(lv.conn, NAME, proc)
    me = os.getpid()
    assert back["vcpus"] == [
        {"vcpu": 0, "pinned": [2], "cpus": [2], "running_on": 2, "tid": me + 1},
        {"vcpu": 1, "pinned": [3], "cpus": [3], "running_on": 3, "tid": me + 2},
    ]
    assert back["emulator"] == {"pinned": [0, 1], "cpus": sorted(os.sched_getaffinity(me))}
    assert (back["state"], back["pid"], back["uuid"]) == ("running", me, UUID)
    assert back["memory_kib"] == 262144
    assert back["numa"]["mode"] == "strict"
    json.dumps(back)  # what `hpvc status --json` prints


def test_read_back_of_a_stopped_or_missing_domain(lv: FakeLibvirt) -> None:
    lv.conn.defineXMLFlags(XML, 1)
    back = vm_libvirt.read_back(lv.conn, NAME)
    assert (back["state"], back["pid"]) == ("shutoff", None)
    assert [(v["pinned"], v["cpus"], v["tid"]) for v in back["vcpus"]] == [
        ([2], [], None),
        ([3], [], None),
    ]
    assert back["emulator"]["cpus"] == []
    with pytest.raises(HpvcError, match="hpvc-c1-nope: not defined"):
        vm_libvirt.read_back(lv.conn, "hpvc-c1-nope")


def test_cpus_of_a_libvirt_cpu_map() -> None:
    assert vm_libvirt.cpus_of((True, False, True, True)) == [0, 2, 3]
    assert vm_libvirt.cpus_of(()) == []
