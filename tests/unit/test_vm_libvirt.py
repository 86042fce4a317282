"""The libvirt backend without libvirtd or root, against libvirt's own in-process
test driver (``test:///default``): XML identity, the journaled define/start/undo
cycle, libvirt errors as one-line HpvcErrors, and read-back of pinning, NUMA
binding and memory backing. The test driver runs no QEMU, so QEMU processes
live on fake /proc trees (plain files, through the injectable ``proc`` root).

Facts about the test driver that these tests rely on:

- every connection to ``test:///default`` in one process shares one state while
  any of them is open (so the connection an undo opens sees the test's
  domains); the state starts afresh, with one running domain named "test", once
  the last one is closed. The ``conn`` fixture removes what a test defined.
- it refuses the undefine flags NVRAM and CHECKPOINTS_METADATA, which the QEMU
  driver accepts: hpvc then asks again without them, as with an older libvirtd
  (``test_undefine_asks_for_every_flag_then_fewer_where_refused``).
- it cannot fail to start a domain, nor to destroy one: the two tests about
  that make the real call fail the way libvirt itself does (a second ``create``,
  a ``destroy`` with flags the driver refuses).
"""

from __future__ import annotations

import importlib.util
import json
import os
import uuid as uuidlib
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpvc.backends.libvirt import domain as vm_libvirt
from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.host.journal import Journal

TEST_URI = "test:///default"
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
  <vcpu placement="static">2</vcpu>
  <cputune>
    <vcpupin vcpu="0" cpuset="2" />
    <vcpupin vcpu="1" cpuset="3" />
    <emulatorpin cpuset="0-1" />
  </cputune>
  <numatune>
    <memory mode="strict" nodeset="0-1" />
    <memnode cellid="0" mode="strict" nodeset="0" />
    <memnode cellid="1" mode="strict" nodeset="1" />
  </numatune>
  <os><type arch="x86_64">hvm</type></os>
  <cpu>
    <numa>
      <cell id="0" cpus="0" memory="131072" unit="KiB" />
      <cell id="1" cpus="1" memory="131072" unit="KiB" />
    </numa>
  </cpu>
</domain>
"""
NO_UUID = XML.replace(f"  <uuid>{UUID}</uuid>\n", "")
# libvirt's undefine flags (libvirt-domain.h); the test driver takes only the first two.
MANAGED_SAVE, SNAPSHOTS_METADATA, NVRAM, CHECKPOINTS_METADATA = 1, 2, 4, 16


# --- the test driver -------------------------------------------------------------------


@pytest.fixture
def lv() -> Any:
    """libvirt-python: skipped without it, a failure under HPVC_REQUIRE_ALL=1."""
    if importlib.util.find_spec("libvirt") is None:
        reason = "the Python module 'libvirt' is not installed (make setup)"
        if os.environ.get("HPVC_REQUIRE_ALL") == "1":
            pytest.fail(f"required by HPVC_REQUIRE_ALL=1: {reason}")
        pytest.skip(reason)
    return vm_libvirt._lv()


def domain_names(conn: Any) -> list[str]:
    return sorted(str(d.name()) for d in conn.listAllDomains())


def _remove_ours(conn: Any) -> None:
    """Remove every domain but the driver's own "test" (a test may have failed half-way)."""
    for dom in conn.listAllDomains():
        if dom.name() == "test":
            continue
        if dom.isActive():
            dom.destroy()
        if dom.isPersistent():
            dom.undefine()


@pytest.fixture
def conn(lv: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A connection to the test driver, opened by hpvc's ``connect``; fresh state."""
    c = vm_libvirt.connect(TEST_URI)
    _remove_ours(c)  # left by an earlier test whose connection is not collected yet
    assert domain_names(c) == ["test"]
    yield c
    _remove_ours(c)
    c.close()


def fake_proc(root: Path, procs: dict[int, tuple[list[str], str]]) -> Path:
    """pid -> (argv, state letter); vCPU threads named after QEMU's."""
    root.mkdir(parents=True, exist_ok=True)
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


ME = os.getpid()  # the fake QEMU's PID: a real process, so its affinity can be read


@pytest.fixture
def proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake /proc where the domain's QEMU runs as PID ``ME``, used wherever the
    backend looks for QEMU processes (``start_domain`` and ``qemu_pid`` take no
    ``proc`` root of their own: they call ``find_pid`` with the host's defaults)."""
    root = fake_proc(tmp_path / "proc", {ME: (qemu_argv(), "S")})
    real = vm_libvirt.find_pid

    def find_pid(name: str, uuid: str, proc: Path = root) -> int | None:
        return real(name, uuid, proc, tmp_path / "run")

    monkeypatch.setattr(vm_libvirt, "find_pid", find_pid)
    return root


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "journal")


def defined(conn: Any, name: str = NAME) -> bool:
    return name in domain_names(conn)


# --- XML identity ---------------------------------------------------------------------


def test_identify_keeps_the_xml_and_reads_the_uuid() -> None:
    assert vm_libvirt.identify(XML, NAME) == (XML, UUID)


def test_identify_adds_a_uuid_right_after_the_name() -> None:
    xml, uuid = vm_libvirt.identify(NO_UUID, NAME)
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


def test_start_records_then_defines_and_starts(
    conn: Any, lv: Any, journal: Journal, proc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A second connection with a ?socket= in its URI: the journal keeps that URI.
    uri = "test:///default?socket=/tmp/x/libvirt-sock"
    other = vm_libvirt.connect(uri)
    assert vm_libvirt.uri_of(other) == uri and vm_libvirt.uri_of(conn) == TEST_URI
    assert vm_libvirt.start_domain(journal, other, XML, NAME) == ME
    (change,) = journal.entries()
    assert change.kind == "libvirt-domain"
    assert change.args == {"uri": uri, "name": NAME, "uuid": UUID}
    dom = conn.lookupByName(NAME)
    assert dom.isActive() and dom.isPersistent() and dom.UUIDString() == UUID

    opened: list[tuple[str, Any]] = []
    real_connect = vm_libvirt.connect

    def connect(uri: str = vm_libvirt.DEFAULT_URI) -> Any:
        opened.append((uri, real_connect(uri)))
        return opened[-1][1]

    monkeypatch.setattr(vm_libvirt, "connect", connect)
    assert journal.undo_all() == []
    assert not defined(conn) and journal.entries() == []
    ((undo_uri, undo_conn),) = opened  # undo connects to the recorded URI, and closes it
    assert undo_uri == uri
    with pytest.raises(lv.libvirtError):
        undo_conn.isAlive()
    other.close()


def test_start_gives_xml_without_a_uuid_one_and_journals_it(
    conn: Any, journal: Journal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    real = vm_libvirt.find_pid

    def find_pid(name: str, uuid: str, proc: Path = tmp_path / "proc") -> int | None:
        seen.append(uuid)
        fake_proc(proc, {ME: (qemu_argv(uuid=uuid), "S")})
        return real(name, uuid, proc, tmp_path / "run")

    monkeypatch.setattr(vm_libvirt, "find_pid", find_pid)
    assert vm_libvirt.start_domain(journal, conn, NO_UUID, NAME) == ME
    (uuid,) = seen
    assert uuid != UUID and conn.lookupByName(NAME).UUIDString() == uuid
    assert journal.entries()[0].args["uuid"] == uuid


def test_a_rejected_xml_is_one_line_and_leaves_nothing(conn: Any, journal: Journal) -> None:
    bad = XML.replace("</domain>", "<bogus/></domain>")
    with pytest.raises(HpvcError) as err:
        vm_libvirt.start_domain(journal, conn, bad, NAME)
    text = str(err.value)
    assert text.startswith(
        f"libvirt domain {NAME}: XML document failed to validate against schema: Unable to "
        "validate doc against "
    )
    assert text.endswith(
        "; Element domain has extra content: bogus (check it with 'virt-xml-validate FILE domain')"
    )
    assert "\n" not in text
    assert not defined(conn)
    assert [c.kind for c in journal.entries()] == ["libvirt-domain"]  # recorded before defining
    assert journal.undo_all() == []  # nothing there: undo is a no-op
    assert journal.entries() == []


def test_a_domain_that_cannot_start_is_removed_at_once(
    conn: Any, lv: Any, journal: Journal, proc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    create = lv.virDomain.create

    def create_fails_half_way(dom: Any) -> int:  # started, then libvirt reports an error
        create(dom)
        return int(create(dom))  # "Domain ... is already running"

    monkeypatch.setattr(lv.virDomain, "create", create_fails_half_way)
    with pytest.raises(HpvcError) as err:
        vm_libvirt.start_domain(journal, conn, XML, NAME)
    assert str(err.value).startswith(
        f"libvirt domain {NAME}: internal error: Domain '{NAME}' is already running"
    )
    assert "\n" not in str(err.value)
    assert err.value.fix == f"see /var/log/libvirt/qemu/{NAME}.log on the libvirt host"
    assert not defined(conn)  # destroyed and undefined


def test_no_qemu_process_found_is_an_error_and_undefines(
    conn: Any, journal: Journal, proc: Path
) -> None:
    (proc / str(ME) / "stat").write_text(f"{ME} (qemu-system-x86) Z 1 1 1\n")  # a zombie
    with pytest.raises(HpvcError, match=f"no QEMU process with -uuid {UUID}") as err:
        vm_libvirt.start_domain(journal, conn, XML, NAME)
    assert err.value.fix == "hpvc needs a libvirtd on the same host (a local URI)"
    assert not defined(conn)


@pytest.mark.parametrize("same", ["name", "uuid"])
def test_an_existing_domain_is_refused_and_not_journaled(
    conn: Any, journal: Journal, proc: Path, same: str
) -> None:
    other_name = NAME if same == "name" else "hpvc-c1-other"
    other = XML.replace(f"<name>{NAME}</name>", f"<name>{other_name}</name>")
    conn.defineXML(other.replace(UUID, str(uuidlib.uuid4())) if same == "name" else other)
    with pytest.raises(HpvcError, match="run 'hpvc down' for its cluster first") as err:
        vm_libvirt.start_domain(journal, conn, XML, NAME)
    why = "already defined" if same == "name" else f"a domain with UUID {UUID} is defined"
    assert why in str(err.value)
    assert journal.entries() == []
    dom = conn.lookupByName(other_name)  # untouched: still defined, still off
    assert dom.isPersistent() and not dom.isActive()


def test_undo_leaves_a_same_named_domain_with_another_uuid(conn: Any) -> None:
    conn.defineXML(XML.replace(UUID, str(uuidlib.uuid4())))
    assert vm_libvirt.remove_domain(conn, NAME, UUID) is False
    assert defined(conn)
    assert vm_libvirt.remove_domain(conn, "hpvc-c1-nope") is False


def test_remove_a_domain_that_is_defined_but_off(conn: Any) -> None:
    conn.defineXML(XML)
    assert vm_libvirt.remove_domain(conn, NAME, UUID) is True
    assert not defined(conn)


def test_undo_of_a_domain_stopped_or_removed_meanwhile(
    conn: Any, journal: Journal, proc: Path
) -> None:
    vm_libvirt.start_domain(journal, conn, XML, NAME)
    conn.lookupByName(NAME).destroy()  # stopped by someone else
    assert journal.undo_all() == [] and not defined(conn)
    vm_libvirt.start_domain(journal, conn, XML, NAME)
    _remove_ours(conn)  # gone altogether
    assert journal.undo_all() == [] and journal.entries() == []


def test_undo_ignores_a_domain_that_stops_while_it_destroys_it(
    conn: Any, lv: Any, journal: Journal, proc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vm_libvirt.start_domain(journal, conn, XML, NAME)
    destroy = lv.virDomain.destroy

    def stopped_meanwhile(dom: Any) -> int:  # the guest shuts down just before destroy
        destroy(dom)
        return int(destroy(dom))  # "domain is not running" (VIR_ERR_OPERATION_INVALID)

    monkeypatch.setattr(lv.virDomain, "destroy", stopped_meanwhile)
    assert journal.undo_all() == []
    assert journal.entries() == [] and not defined(conn)


def test_a_failed_undo_keeps_the_record_for_a_retry(
    conn: Any, lv: Any, journal: Journal, proc: Path
) -> None:
    vm_libvirt.start_domain(journal, conn, XML, NAME)
    destroy_flags = lv.virDomain.destroyFlags
    with pytest.MonkeyPatch.context() as mp:  # libvirt refuses to destroy it, not "gone"
        mp.setattr(lv.virDomain, "destroy", lambda dom: destroy_flags(dom, 1 << 30))
        (error,) = journal.undo_all()
    assert f"libvirt domain {NAME} (destroy: unsupported flags (0x40000000)" in error
    assert "\n" not in error
    assert len(journal.entries()) == 1 and conn.lookupByName(NAME).isActive()
    assert journal.undo_all() == []  # the retry works
    assert journal.entries() == [] and not defined(conn)


def test_undefine_asks_for_every_flag_then_fewer_where_refused(conn: Any, lv: Any) -> None:
    """hpvc asks for MANAGED_SAVE | SNAPSHOTS_METADATA | NVRAM | CHECKPOINTS_METADATA;
    the test driver refuses the two it lacks (0x14), like an older libvirtd, so hpvc
    asks again with the two every libvirt takes, and the domain is gone."""
    names = (
        "VIR_DOMAIN_UNDEFINE_MANAGED_SAVE",
        "VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA",
        "VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA",
        "VIR_DOMAIN_UNDEFINE_NVRAM",
    )
    assert [getattr(lv, n) for n in names] == [
        MANAGED_SAVE, SNAPSHOTS_METADATA, CHECKPOINTS_METADATA, NVRAM
    ]  # fmt: skip
    assert set(vm_libvirt._UNDEFINE_FLAGS) == set(names)
    asked: list[int] = []
    undefine = lv.virDomain.undefineFlags

    def spy(dom: Any, flags: int = 0) -> Any:
        asked.append(flags)
        return undefine(dom, flags)

    conn.defineXML(XML)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lv.virDomain, "undefineFlags", spy)
        assert vm_libvirt.remove_domain(conn, NAME, UUID)
    full = MANAGED_SAVE | SNAPSHOTS_METADATA | NVRAM | CHECKPOINTS_METADATA
    assert asked == [full, MANAGED_SAVE | SNAPSHOTS_METADATA]
    assert not defined(conn)


def test_undo_without_libvirtd_keeps_the_record(journal: Journal, lv: Any, tmp_path: Path) -> None:
    uri = f"qemu:///system?socket={tmp_path / 'no-sock'}"
    journal.record(vm_libvirt.UNDO_KIND, uri=uri, name=NAME, uuid=UUID)
    (error,) = journal.undo_all()
    assert "start libvirtd: see docs/libvirt.md" in error
    assert len(journal.entries()) == 1


# --- connection ------------------------------------------------------------------------


def test_connect_failure_says_to_start_libvirtd(lv: Any, tmp_path: Path) -> None:
    sock = tmp_path / "no-sock"
    with pytest.raises(MissingDependency) as err:
        vm_libvirt.connect(f"qemu:///system?socket={sock}")
    assert str(err.value) == (
        f"libvirt at qemu:///system?socket={sock}: cannot connect: Failed to connect socket to "
        f"'{sock}': No such file or directory (start libvirtd: see docs/libvirt.md)"
    )


def test_missing_bindings_are_a_missing_dependency(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "libvirt", None)  # import fails
    vm_libvirt._lv.cache_clear()
    try:
        with pytest.raises(MissingDependency, match="make setup"):
            vm_libvirt.connect()
    finally:
        vm_libvirt._lv.cache_clear()


# --- QEMU processes on a fake /proc ----------------------------------------------------


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


def test_qemu_pid_of_a_defined_domain(conn: Any, journal: Journal, proc: Path) -> None:
    assert vm_libvirt.qemu_pid(conn, NAME) is None  # not defined
    vm_libvirt.start_domain(journal, conn, XML, NAME)
    assert vm_libvirt.qemu_pid(conn, NAME) == ME


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
    assert vm_libvirt.numa_tune({"numa_mode": 9}, "<domain/>")["mode"] == "9"


def test_read_back_of_a_running_domain(conn: Any, journal: Journal, proc: Path) -> None:
    vm_libvirt.start_domain(journal, conn, XML, NAME)
    back = vm_libvirt.read_back(conn, NAME, proc)
    assert back["vcpus"] == [
        {"vcpu": 0, "pinned": [2], "cpus": [2], "running_on": 2, "tid": ME + 1},
        {"vcpu": 1, "pinned": [3], "cpus": [3], "running_on": 3, "tid": ME + 2},
    ]
    assert back["emulator"] == {"pinned": [0, 1], "cpus": sorted(os.sched_getaffinity(ME))}
    assert (back["name"], back["state"], back["pid"], back["uuid"]) == (NAME, "running", ME, UUID)
    assert back["memory_kib"] == 262144
    assert back["numa"] == {
        "mode": "strict",
        "nodeset": "0-1",
        "cells": [
            {"cellid": 0, "mode": "strict", "nodeset": "0"},
            {"cellid": 1, "mode": "strict", "nodeset": "1"},
        ],
    }
    assert back["memory_backing"] == vm_libvirt.memory_backing(XML)
    json.dumps(back)  # what `hpvc status --json` prints


def test_read_back_of_a_stopped_or_missing_domain(conn: Any, proc: Path) -> None:
    conn.defineXML(XML)
    back = vm_libvirt.read_back(conn, NAME, proc)
    assert (back["state"], back["pid"]) == ("shutoff", None)
    assert [(v["pinned"], v["cpus"], v["running_on"], v["tid"]) for v in back["vcpus"]] == [
        ([2], [], None, None),
        ([3], [], None, None),
    ]
    assert back["emulator"] == {"pinned": [0, 1], "cpus": []}
    with pytest.raises(HpvcError, match="hpvc-c1-nope: not defined"):
        vm_libvirt.read_back(conn, "hpvc-c1-nope", proc)


def test_cpus_of_a_libvirt_cpu_map() -> None:
    assert vm_libvirt.cpus_of((True, False, True, True)) == [0, 2, 3]
    assert vm_libvirt.cpus_of(()) == []
