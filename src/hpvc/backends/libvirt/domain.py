"""VM nodes run by libvirt: connection, domain define + start with journaled undo, read-back.

The renderer (``hpvc.render.libvirt``) writes the domain XML; libvirt applies
all of its tuning itself when the domain starts (``<cputune>`` vCPU and
emulator pinning, ``<numatune>``, ``<memoryBacking>``) and creates the node's
tap on the cluster bridge from ``<interface type='bridge'>``, so this module
only defines and starts the domain, finds its QEMU process, and reads back
what libvirt and the kernel report. docs/libvirt.md says how a site runs
libvirtd for hpvc.

Long because the libvirt binding (imported lazily, untyped), its error
mapping and every call hpvc makes through it stay in one module; the pure
XML parsing is in ``hpvc.backends.libvirt.domain_xml``.

architecture rule 5: the undo kind is ``"libvirt-domain"`` (written before the
domain is defined: the connection URI, the domain's name and UUID). Undo
destroys the domain if it runs and undefines it with its managed-save image,
snapshot and checkpoint metadata and NVRAM; a domain that is already gone is
not an error, a libvirtd that does not answer is (the domain may still run:
the journal keeps the step, and the node's folder with its disk, for a later
``hpvc down``). Only the domain with the recorded UUID is touched: a domain of
the same name that hpvc did not define is never removed.

libvirt-python has no type stubs: the module is imported on first use (a
missing one is a ``MissingDependency``) and handled as ``Any`` behind the
typed functions here. Host paths under ``/proc`` are read below an injectable
root, so the bookkeeping is tested without libvirt.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
import uuid as uuidlib
import weakref
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from hpvc.backends.libvirt.domain_xml import HugePages as HugePages
from hpvc.backends.libvirt.domain_xml import MemNode as MemNode
from hpvc.backends.libvirt.domain_xml import MemoryBacking as MemoryBacking
from hpvc.backends.libvirt.domain_xml import NumaTune as NumaTune
from hpvc.backends.libvirt.domain_xml import cpus_of as cpus_of
from hpvc.backends.libvirt.domain_xml import memory_backing as memory_backing
from hpvc.backends.libvirt.domain_xml import numa_tune as numa_tune
from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.host import procfs
from hpvc.host.journal import Args, Journal, undoer
from hpvc.host.procfs import running

if TYPE_CHECKING:
    import libvirt  # type: ignore[import-untyped, import-not-found, unused-ignore]

DEFAULT_URI = "qemu:///system"
UNDO_KIND = "libvirt-domain"
PROC = procfs.PROC
PIDFILE_DIR = Path("/run/libvirt/qemu")  # qemu:///system writes <name>.pid here
LOG_DIR = "/var/log/libvirt/qemu"  # QEMU's own messages, <name>.log
START_FIX = "start libvirtd: see docs/libvirt.md"
# Undefine everything libvirt keeps beside a domain's definition (the names
# libvirt-python knows; a flag it lacks is left out).
_UNDEFINE_FLAGS = (
    "VIR_DOMAIN_UNDEFINE_MANAGED_SAVE",
    "VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA",
    "VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA",
    "VIR_DOMAIN_UNDEFINE_NVRAM",
)


def _basic_undefine(lv: Any) -> int:
    """The undefine flags every libvirt since 1.0 takes (managed save, snapshots)."""
    return int(getattr(lv, _UNDEFINE_FLAGS[0], 0)) | int(getattr(lv, _UNDEFINE_FLAGS[1], 0))


_STATES = (
    "nostate", "running", "blocked", "paused", "shutdown", "shutoff", "crashed", "pmsuspended",
)  # fmt: skip
_VCPU_THREAD = re.compile(r"CPU (\d+)/(KVM|TCG)")  # with -name ...,debug-threads=on
_URIS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


# --- typed results -------------------------------------------------------------------


class VcpuState(TypedDict):
    """One vCPU: the CPUs libvirt pinned it to, and its thread's affinity now."""

    vcpu: int
    pinned: list[int]  # vcpuPinInfo: what libvirt applied from <cputune>
    cpus: list[int]  # the vCPU thread's affinity as the kernel has it (empty: not running)
    running_on: int | None  # host CPU it ran on last
    tid: int | None  # host thread ID ("CPU n/TCG" or "CPU n/KVM"), when found


class Emulator(TypedDict):
    pinned: list[int]  # emulatorPinInfo
    cpus: list[int]  # the QEMU main thread's affinity now (empty: not running)


class ReadBack(TypedDict):
    """What ``hpvc status`` shows of a libvirt domain: its state, pinning and memory."""

    name: str
    uuid: str
    state: str
    pid: int | None
    vcpus: list[VcpuState]
    emulator: Emulator
    numa: NumaTune
    memory_kib: int
    memory_backing: MemoryBacking


# --- the libvirt module and its errors -----------------------------------------------


def _silent(_ctx: object, _err: object) -> None:
    """libvirt prints every error to stderr by default; hpvc reports them itself."""


@functools.cache
def _lv() -> Any:
    """The ``libvirt`` module (imported once, on first use), with libvirt's printing off."""
    try:
        import libvirt  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError:
        raise MissingDependency(
            "libvirt backend",
            "the Python module 'libvirt' is not installed",
            "run 'make setup': it builds libvirt-python against libvirt-dev",
        ) from None
    libvirt.registerErrorHandler(_silent, None)
    return libvirt


def _why(err: BaseException) -> str:
    """A libvirt error as one line (its messages often span several)."""
    get = getattr(err, "get_error_message", None)
    text = str((get() if callable(get) else None) or err)
    lines = [line.strip() for line in text.splitlines()]
    return "; ".join(line for line in lines if line and line not in ("(null)", "^")) or repr(err)


def _code(err: BaseException) -> int | None:
    get = getattr(err, "get_error_code", None)
    code = get() if callable(get) else None
    return code if isinstance(code, int) else None


@contextlib.contextmanager
def _errors(what: str, fix: str = "", *, ignore: Sequence[int] = ()) -> Iterator[None]:
    """libvirt errors become one-line ``HpvcError``s; the codes in ``ignore`` pass silently."""
    lv = _lv()
    try:
        yield
    except lv.libvirtError as e:
        if _code(e) not in ignore:
            raise HpvcError(what, _why(e), fix) from e


errors = _errors  # the same, for the backend's other modules (libvirt/migrate.py)


def _gone() -> tuple[int, ...]:
    """Error codes meaning "that domain is not there (or not running) any more"."""
    lv = _lv()
    return (lv.VIR_ERR_NO_DOMAIN, lv.VIR_ERR_OPERATION_INVALID)


# --- connection ----------------------------------------------------------------------


def connect(uri: str = DEFAULT_URI) -> libvirt.virConnect:
    """A read-write connection to libvirtd at ``uri`` (MissingDependency when none answers).

    A private libvirtd listening elsewhere is reached with its socket, e.g.
    ``qemu:///system?socket=/path/libvirt-sock``.
    """
    lv = _lv()
    try:
        conn = lv.open(uri)
    except lv.libvirtError as e:
        raise MissingDependency(f"libvirt at {uri}", f"cannot connect: {_why(e)}", START_FIX) from e
    if conn is None:  # very old bindings returned None instead of raising
        raise MissingDependency(f"libvirt at {uri}", "cannot connect", START_FIX)
    _URIS[conn] = uri
    return conn


def uri_of(conn: libvirt.virConnect) -> str:
    """The URI ``conn`` was opened with (``getURI()`` drops a ``?socket=`` parameter)."""
    known = _URIS.get(conn)
    return known if known is not None else str(conn.getURI())


# --- the domain XML ------------------------------------------------------------------


def identify(xml: str, name: str) -> tuple[str, str]:
    """(xml, uuid): check that ``xml`` is a domain named ``name``; give it a UUID if it has none.

    hpvc's renderer always writes a stable UUID; one is added only to XML from
    elsewhere, so that the journal can name exactly the domain it defined.
    """
    what = f"libvirt domain {name}"
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as e:
        raise InputError(what, f"the domain XML is not well-formed: {e}") from None
    found = root.findtext("name", "").strip()
    if root.tag != "domain" or found != name:
        why = f"the XML defines <{root.tag}> named {found!r}, not a domain named {name!r}"
        raise InputError(what, why, "render it again with 'hpvc render'")
    text = root.findtext("uuid", "").strip()
    if text:
        try:
            return xml, str(uuidlib.UUID(text))
        except ValueError:
            raise InputError(what, f"the domain XML has an invalid UUID {text!r}") from None
    new = str(uuidlib.uuid4())
    uuid_el = ET.Element("uuid")
    uuid_el.text = new
    after_name = next(i for i, el in enumerate(root) if el.tag == "name") + 1
    root.insert(after_name, uuid_el)
    return ET.tostring(root, encoding="unicode"), new


def _lookup(conn: libvirt.virConnect, name: str, uuid: str | None) -> Any | None:
    """The domain with ``uuid`` (or, without one, named ``name``); None when there is none."""
    lv = _lv()
    try:
        return conn.lookupByUUIDString(uuid) if uuid else conn.lookupByName(name)
    except lv.libvirtError as e:
        if _code(e) == lv.VIR_ERR_NO_DOMAIN:
            return None
        raise HpvcError(f"libvirt domain {name}", _why(e)) from e


def _refuse_existing(conn: libvirt.virConnect, name: str, uuid: str) -> None:
    """Never adopt a domain hpvc did not define: its undo would remove someone else's VM."""
    for key in (None, uuid):  # by name, then by UUID
        if _lookup(conn, name, key) is not None:
            raise HpvcError(
                f"libvirt domain {name}",
                "already defined" if key is None else f"a domain with UUID {uuid} is defined",
                "run 'hpvc down' for its cluster first",
            )


# --- start and remove ----------------------------------------------------------------


def start_domain(journal: Journal, conn: libvirt.virConnect, xml: str, name: str) -> int:
    """Define the domain ``name`` from ``xml`` and start it; return its QEMU's PID.

    libvirt validates the XML against its schema first. When defining or
    starting fails, nothing stays defined, and the error is one line.
    """
    lv = _lv()
    xml, uuid = identify(xml, name)
    what = f"libvirt domain {name}"
    _refuse_existing(conn, name, uuid)
    journal.record(UNDO_KIND, uri=uri_of(conn), name=name, uuid=uuid)
    with _errors(what, "check it with 'virt-xml-validate FILE domain'"):
        dom = conn.defineXMLFlags(xml, lv.VIR_DOMAIN_DEFINE_VALIDATE)
    try:
        with _errors(what, f"see {LOG_DIR}/{name}.log on the libvirt host"):
            dom.create()
        pid = find_pid(name, uuid)
        if pid is None:
            raise HpvcError(
                what,
                f"started, but no QEMU process with -uuid {uuid} runs on this host",
                "hpvc needs a libvirtd on the same host (a local URI)",
            )
        return pid
    except BaseException:
        with contextlib.suppress(Exception):  # the first error is the one to report
            remove_domain(conn, name, uuid)
        raise


def remove_domain(conn: libvirt.virConnect, name: str, uuid: str | None = None) -> bool:
    """Destroy (if running) and undefine a domain; False when there was none.

    With ``uuid`` only that domain is removed; a domain that disappears
    meanwhile is not an error.
    """
    lv = _lv()
    dom = _lookup(conn, name, uuid)
    if dom is None:
        return False
    what = f"libvirt domain {name}"
    with _errors(f"{what}: destroy", ignore=_gone()):
        if dom.isActive():
            dom.destroy()
    with _errors(f"{what}: undefine", ignore=_gone()):
        if dom.isPersistent():
            _undefine(lv, dom)
    return True


def domains(conn: libvirt.virConnect) -> list[tuple[str, str]]:
    """(name, UUID) of every domain ``conn``'s libvirtd holds, running or only defined."""
    with _errors("libvirt domains"):
        return [(str(d.name()), str(d.UUIDString())) for d in conn.listAllDomains()]


def _undefine(lv: Any, dom: Any) -> None:
    """Undefine with every flag this libvirt knows; a driver that refuses some
    (older daemons, the test driver: no NVRAM or checkpoints) is asked again
    without them, then with none."""
    flags = 0
    for flag in _UNDEFINE_FLAGS:
        flags |= int(getattr(lv, flag, 0))
    refused = (lv.VIR_ERR_INVALID_ARG, lv.VIR_ERR_NO_SUPPORT)
    for attempt in (flags, flags & _basic_undefine(lv), 0):
        try:
            dom.undefineFlags(attempt)
            return
        except lv.libvirtError as e:
            if _code(e) not in refused or attempt == 0:
                raise


@undoer(UNDO_KIND, what=lambda args: f"libvirt domain {args['name']}")
def _undo_domain(args: Args) -> None:
    """Remove the recorded domain. A libvirtd that does not answer fails this
    step (``libvirtd unreachable: ...``): the domain may still run, so the
    journal keeps it and everything older (its disk, in the node's folder)."""
    uri = str(args.get("uri") or DEFAULT_URI)
    try:
        conn = connect(uri)
    except MissingDependency as e:
        what = f"libvirt domain {args['name']}"
        raise HpvcError(what, f"libvirtd unreachable: {e.why}", START_FIX) from e
    try:
        remove_domain(conn, str(args["name"]), args.get("uuid"))
    finally:
        with contextlib.suppress(Exception):
            conn.close()


# --- the QEMU process ----------------------------------------------------------------


def _opts(value: str) -> list[str]:
    """Split a QEMU option string on single commas (``,,`` is a literal comma)."""
    return [part.replace("\0", ",") for part in value.replace(",,", "\0").split(",")]


def is_domain_qemu(pid: int, name: str, uuid: str, proc: Path = PROC) -> bool:
    """Is ``pid`` a live QEMU with ``-uuid <uuid>`` and ``-name guest=<name>`` (libvirt's form)?"""
    args = procfs.cmdline(pid, proc)
    if args is None:
        return False
    pairs = list(itertools.pairwise(args))
    uuid_ok = any(a == "-uuid" and b.lower() == uuid.lower() for a, b in pairs)
    names = [_opts(b)[0] for a, b in pairs if a == "-name"]
    name_ok = any(n in (name, f"guest={name}") for n in names)
    return uuid_ok and name_ok and running(pid, proc)


def find_pid(
    name: str, uuid: str, proc: Path = PROC, pidfile_dir: Path = PIDFILE_DIR
) -> int | None:
    """The PID of the domain's QEMU: from libvirt's pid file when it is readable here,
    else by its ``-uuid`` and ``-name`` under ``/proc`` (a libvirtd in another mount
    namespace keeps its pid files out of sight). None when no such process runs."""
    pid = procfs.read_pidfile(pidfile_dir / f"{name}.pid")
    if pid is not None and is_domain_qemu(pid, name, uuid, proc):
        return pid
    found = [p for p in procfs.pids(proc) if is_domain_qemu(p, name, uuid, proc)]
    if len(found) > 1:
        listed = ", ".join(map(str, found))
        raise HpvcError(f"libvirt domain {name}", f"several QEMU processes run it: {listed}")
    return found[0] if found else None


def qemu_pid(conn: libvirt.virConnect, name: str) -> int | None:
    """The PID of a defined domain's QEMU on this host; None when it does not run."""
    dom = _lookup(conn, name, None)
    if dom is None:
        return None
    with _errors(f"libvirt domain {name}"):
        uuid = str(dom.UUIDString())
    return find_pid(name, uuid)


def vcpu_threads(pid: int, proc: Path = PROC) -> dict[int, int]:
    """vCPU index -> host thread ID, from the thread names (``CPU 0/TCG``) of a QEMU."""
    out: dict[int, int] = {}
    for tid, comm in procfs.thread_names(pid, proc).items():
        m = _VCPU_THREAD.fullmatch(comm)
        if m:
            out[int(m.group(1))] = tid
    return out


# --- read-back -----------------------------------------------------------------------


def _affinity(pid: int | None) -> list[int]:
    if pid is None:
        return []
    try:
        return sorted(os.sched_getaffinity(pid))
    except OSError:
        return []


def _vcpus(dom: Any, pid: int | None, proc: Path) -> list[VcpuState]:
    """Pinning as libvirt applied it, and (while running) each vCPU thread's affinity now."""
    pins = dom.vcpuPinInfo()
    live: dict[int, tuple[int, list[int]]] = {}
    if pid is not None:
        info, maps = dom.vcpus()  # for a running domain libvirt asks the kernel
        for (vcpu, _state, _time, cpu), cpumap in zip(info, maps, strict=True):
            live[int(vcpu)] = (int(cpu), cpus_of(cpumap))
    tids = vcpu_threads(pid, proc) if pid is not None else {}
    return [
        VcpuState(
            vcpu=i,
            pinned=cpus_of(pin),
            cpus=live[i][1] if i in live else [],
            running_on=live[i][0] if i in live else None,
            tid=tids.get(i),
        )
        for i, pin in enumerate(pins)
    ]


def read_back(conn: libvirt.virConnect, name: str, proc: Path = PROC) -> ReadBack:
    """vCPU and emulator pinning, NUMA binding and memory backing of a domain, as it is now."""
    what = f"libvirt domain {name}"
    dom = _lookup(conn, name, None)
    if dom is None:
        raise HpvcError(what, "not defined", "run 'hpvc up' again, or 'hpvc down' to clean up")
    with _errors(f"{what}: read back"):
        uuid = str(dom.UUIDString())
        state = int(dom.state()[0])
        pid = find_pid(name, uuid, proc) if dom.isActive() else None
        xml = str(dom.XMLDesc())
        vcpus = _vcpus(dom, pid, proc)
        emulator = Emulator(pinned=cpus_of(dom.emulatorPinInfo()), cpus=_affinity(pid))
        numa = numa_tune(dict(dom.numaParameters()), xml)
        memory_kib = int(dom.info()[1])
    return ReadBack(
        name=name,
        uuid=uuid,
        state=_STATES[state] if 0 <= state < len(_STATES) else str(state),
        pid=pid,
        vcpus=vcpus,
        emulator=emulator,
        numa=numa,
        memory_kib=memory_kib,
        memory_backing=memory_backing(xml),
    )
