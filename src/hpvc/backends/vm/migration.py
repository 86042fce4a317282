"""Live migration of one VM over QMP: the settings, the source's and the target's side.

Both VM backends and the cross-host path (Slurm) move a guest the same way:

- the target is a new QEMU started with the same guest (vCPUs, NUMA cells,
  memory, devices) plus ``-incoming defer`` (``incoming_argv``): it waits,
  paused, for ``target_commands`` (the capabilities both sides must share,
  then ``migrate-incoming URI``); the URI is a unix socket on one host
  (``unix_uri``) or a TCP address on the fabric between hosts (``tcp_uri``);
- the source gets ``apply_settings`` (bandwidth, downtime limit, multifd,
  postcopy, auto-converge), ``start(uri)``, then ``wait``, which polls
  ``query-migrate`` until QEMU says ``completed`` and returns what QEMU
  measured (``MigrationStats``); a failure, a target that dies, a timeout or
  an interrupt (Ctrl-C) end in ``cancel``, and QEMU itself resumes the
  source guest after a cancelled or failed precopy migration;
- under TCG before QEMU 9.0 a live copy loses guest writes (7.2's bitmap
  sync leaves TCG TLB entries marked dirty; fixed in 9.0; docs/vms.md "Live
  migration under TCG"): ``start`` stops the guest for the whole copy
  (``copied_stopped``), ``wait`` resumes it if the copy fails, and the target
  starts it itself (``hpvc.render.qemu``: ``store-global-state=off``).

QMP is reached through a ``Runner``: any callable that runs QMP commands in
one session and returns their replies in order (``socket_runner`` for a QMP
unix socket; the libvirt backend can pass its monitor instead). Every
command and reply parser here is pure and unit-tested
(tests/unit/test_migration.py); tests/integration/test_migration_qmp.py
moves a real QEMU into another. docs/vms.md "Live migration" says what the
guest sees. Architecture: docs/architecture.md (``backends/vm/``: VM code
both VM backends share).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from hpvc.errors import HpvcError, InputError
from hpvc.progress import Progress, quiet

Command = str | tuple[str, Mapping[str, object]]
MIB = 1 << 20
POLL_S = 0.05  # query-migrate between polls: the downtime QEMU reports is its own
PROGRESS_S = 1.0  # one progress line a second at most
CANCEL_WAIT_S = 10.0


class Runner(Protocol):
    """Runs QMP commands in one session; their replies in order."""

    def __call__(self, *commands: Command) -> list[object]: ...


def socket_runner(qmp_socket: str, pid: int | None = None, command_s: float = 5.0) -> Runner:
    """A ``Runner`` for a QEMU's QMP unix socket (stops early when ``pid`` exits)."""
    from hpvc.backends.qemu.qmp import qmp

    def run(*commands: Command) -> list[object]:
        return qmp(qmp_socket, *commands, connect_s=2.0, command_s=command_s, pid=pid)

    return run


# --- settings ------------------------------------------------------------------------


@dataclass(frozen=True)
class MigrationSettings:
    """How a guest moves. The defaults are chosen for HPC guests:

    - ``bandwidth_mib_s`` 4096 (QEMU's default is 128 MiB/s, which needs 8 s
      for the first pass of a 1 GiB guest): HPC guests are large and their
      hosts have fast fabrics; the cap still leaves most of a 100 Gb/s link
      to the MPI job that shares it. 0 means no cap (QEMU is given the
      largest value it takes).
    - ``downtime_ms`` 50 (QEMU's default 300): the guest's vCPUs stop for
      the last pass; an MPI rank that stops for 300 ms stalls every rank
      waiting on it, and 50 ms is the issue's goal on KVM. Under TCG the
      guest dirties memory slower but the copy is slower too; auto-converge
      keeps the limit reachable.
    - ``multifd`` 2 channels (0: one stream, QEMU's default): one stream is
      bound by one CPU copying pages; two lift that without taking more
      than a small host's spare CPU. Not with postcopy (QEMU 7.2 refuses
      the pair).
    - ``postcopy`` off: after the switch a postcopy guest's memory lives on
      both hosts, so a failure then loses the guest; a precopy failure
      leaves it running at the source (issue 27: a failed migration keeps
      the node where it was).
    - ``auto_converge`` on: a rank that writes memory faster than it can be
      sent (STREAM, a halo exchange) would never converge; QEMU then slows
      the vCPUs step by step until the rest fits in the downtime limit,
      a short slowdown instead of a migration that never ends.
    - ``timeout_s`` 300: past it the migration is cancelled and the guest
      stays at the source.
    """

    bandwidth_mib_s: int = 4096
    downtime_ms: int = 50
    multifd: int = 2
    postcopy: bool = False
    auto_converge: bool = True
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        checks = [
            (self.bandwidth_mib_s >= 0, "--bandwidth", "a MiB/s count, 0 for no cap"),
            (1 <= self.downtime_ms <= 2000, "--downtime-ms", "1 to 2000 ms"),
            (0 <= self.multifd <= 16, "--multifd", "0 (one stream) to 16 channels"),
            (self.timeout_s > 0, "--timeout", "a number of seconds above 0"),
        ]
        for ok, flag, want in checks:
            if not ok:
                raise InputError(f"migration setting {flag}", "out of range", f"give {want}")
        if self.postcopy and self.multifd:
            raise InputError(
                "migration settings",
                "--postcopy cannot be combined with multifd channels (QEMU refuses the pair)",
                "add --multifd 0 with --postcopy",
            )


MAX_BANDWIDTH = (1 << 63) - 1  # bytes/s: what QEMU takes as "no cap"


def capabilities(settings: MigrationSettings) -> list[dict[str, object]]:
    """``migrate-set-capabilities`` entries; multifd and postcopy must match on both sides."""
    return [
        {"capability": "multifd", "state": settings.multifd > 0},
        {"capability": "postcopy-ram", "state": settings.postcopy},
        {"capability": "auto-converge", "state": settings.auto_converge},
    ]


def source_commands(settings: MigrationSettings) -> list[Command]:
    """What the source is told before ``migrate``."""
    bandwidth = settings.bandwidth_mib_s * MIB if settings.bandwidth_mib_s else MAX_BANDWIDTH
    params: dict[str, object] = {
        "max-bandwidth": min(bandwidth, MAX_BANDWIDTH),
        "downtime-limit": settings.downtime_ms,
    }
    if settings.multifd:
        params["multifd-channels"] = settings.multifd
    return [
        ("migrate-set-capabilities", {"capabilities": capabilities(settings)}),
        ("migrate-set-parameters", params),
    ]


def target_commands(settings: MigrationSettings, uri: str) -> list[Command]:
    """What a target started with ``-incoming defer`` is told: the shared
    capabilities, the channel count, then where to listen."""
    shared = [c for c in capabilities(settings) if c["capability"] != "auto-converge"]
    out: list[Command] = [("migrate-set-capabilities", {"capabilities": shared})]
    if settings.multifd:
        out.append(("migrate-set-parameters", {"multifd-channels": settings.multifd}))
    return [*out, ("migrate-incoming", {"uri": uri})]


def incoming_argv(argv: Sequence[str]) -> list[str]:
    """A node's QEMU command line as a migration target: ``-incoming defer`` added
    (the listening address comes later over QMP, once capabilities are set)."""
    if "-incoming" in argv:
        raise HpvcError("migration target", "the command line already has -incoming")
    return [*argv, "-incoming", "defer"]


def unix_uri(path: str) -> str:
    return f"unix:{path}"


def tcp_uri(address: str, port: int) -> str:
    """A TCP URI; an IPv6 address is bracketed."""
    host = f"[{address}]" if ":" in address else address
    return f"tcp:{host}:{port}"


def apply_settings(qmp: Runner, settings: MigrationSettings) -> None:
    """Set the source's capabilities and parameters."""
    qmp(*source_commands(settings))


def listen(qmp: Runner, settings: MigrationSettings, uri: str) -> None:
    """Tell a target started with ``-incoming defer`` to take the guest from ``uri``."""
    qmp(*target_commands(settings, uri))


LIVE_COPY_FIXED = (9, 0)  # the QEMU release with the TCG dirty-tracking fix (module doc)


def live_copy_loses_writes(kvm: Mapping[str, Any], version: Mapping[str, Any]) -> bool:
    """Whether a live copy of this QEMU's guest can lose its writes: TCG
    (``query-kvm`` not enabled) on a QEMU older than ``LIVE_COPY_FIXED``
    (``query-version``; an unreadable version counts as old)."""
    if kvm.get("enabled") is True:
        return False
    qemu = version.get("qemu", {})
    qemu = qemu if isinstance(qemu, dict) else {}
    return (_int(qemu, "major"), _int(qemu, "minor")) < LIVE_COPY_FIXED


def copied_stopped(qmp: Runner) -> bool:
    """``live_copy_loses_writes``, asked of the QEMU itself."""
    kvm, version = qmp("query-kvm", "query-version")
    return live_copy_loses_writes(
        kvm if isinstance(kvm, dict) else {}, version if isinstance(version, dict) else {}
    )


def start(qmp: Runner, uri: str, *, stop: bool = False) -> bool:
    """Begin sending the guest to ``uri`` (returns at once); whether the guest
    was stopped first for the whole copy (``stop``, or ``copied_stopped``)."""
    paused = stop or copied_stopped(qmp)
    qmp(*(["stop"] if paused else []), ("migrate", {"uri": uri}))
    return paused


# --- progress and outcome ------------------------------------------------------------


@dataclass(frozen=True)
class MigrationStats:
    """What QEMU measured of a completed migration (``query-migrate``)."""

    total_ms: int
    downtime_ms: int  # QEMU's own: from stopping the vCPUs to the handover
    setup_ms: int
    bytes_sent: int
    passes: int  # dirty-memory sync passes
    throttle_pct: int  # auto-converge's last vCPU throttle (0: none)
    mbps: float
    postcopy: bool = False  # the switch to postcopy was made (the target ran the guest first)
    postcopy_requests: int = 0  # pages the target asked for after it (QEMU's count)
    # The guest was stopped for the whole copy (``start``): ``downtime_ms`` is
    # then QEMU's total time, the guest's own pause, not QEMU's last-pass count.
    stop_and_copy: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "total_ms": self.total_ms,
            "downtime_ms": self.downtime_ms,
            "setup_ms": self.setup_ms,
            "bytes_sent": self.bytes_sent,
            "passes": self.passes,
            "throttle_pct": self.throttle_pct,
            "mbps": self.mbps,
            "postcopy": self.postcopy,
            "postcopy_requests": self.postcopy_requests,
            "stop_and_copy": self.stop_and_copy,
        }


def _int(d: Mapping[str, Any], key: str) -> int:
    v = d.get(key, 0)
    return int(v) if isinstance(v, int | float) else 0


def stats(reply: Mapping[str, Any]) -> MigrationStats:
    """A completed ``query-migrate`` reply as ``MigrationStats``."""
    ram = reply.get("ram", {})
    ram = ram if isinstance(ram, dict) else {}
    mbps = ram.get("mbps", 0.0)
    return MigrationStats(
        total_ms=_int(reply, "total-time"),
        downtime_ms=_int(reply, "downtime"),
        setup_ms=_int(reply, "setup-time"),
        bytes_sent=_int(ram, "transferred"),
        passes=_int(ram, "dirty-sync-count"),
        throttle_pct=_int(reply, "cpu-throttle-percentage"),
        mbps=float(mbps) if isinstance(mbps, int | float) else 0.0,
        postcopy_requests=_int(ram, "postcopy-requests"),
    )


def progress_line(reply: Mapping[str, Any]) -> str:
    """One line of an active migration: sent, left, pass, throttle."""
    ram = reply.get("ram", {})
    ram = ram if isinstance(ram, dict) else {}
    line = (
        f"migrating: {_int(ram, 'transferred') / MIB:.0f} MiB sent, "
        f"{_int(ram, 'remaining') / MIB:.0f} MiB left, pass {_int(ram, 'dirty-sync-count')}"
    )
    throttle = _int(reply, "cpu-throttle-percentage")
    return line + (f", vCPUs throttled {throttle}%" if throttle else "")


class MigrationFailed(HpvcError):
    """A migration that did not complete; ``reason`` is one of ``failed``,
    ``cancelled``, ``timeout``, ``target-died``, ``interrupted``. The source
    keeps the guest (precopy); the caller removes the target."""

    def __init__(self, reason: str, why: str) -> None:
        self.reason = reason
        super().__init__("live migration", why, "the node keeps running where it was")


DONE = {"completed", "failed", "cancelled"}


def _status(qmp: Runner) -> dict[str, Any]:
    reply = qmp("query-migrate")[0]
    if not isinstance(reply, dict):
        raise HpvcError("QMP query-migrate", f"unexpected reply {reply!r:.200}")
    return reply


def cancel(qmp: Runner, wait_s: float = CANCEL_WAIT_S) -> str:
    """``migrate_cancel``, then wait for QEMU to settle; the final status.

    ``completed`` is possible (the switch-over won the race): the guest then
    runs at the target, and the caller must treat it as a success.
    """
    qmp("migrate_cancel")
    deadline = time.monotonic() + wait_s
    while True:
        status = str(_status(qmp).get("status", ""))
        if status in DONE or status == "none" or time.monotonic() >= deadline:
            return status
        time.sleep(POLL_S)


def _end(qmp: Runner, reason: str, why: str) -> MigrationStats:
    """Cancel; the stats if the migration completed meanwhile, else ``MigrationFailed``."""
    final = cancel(qmp)
    if final == "completed":
        return stats(_status(qmp))
    raise MigrationFailed(reason, f"{why}; migration {final or 'stopped'}")


def wait(
    qmp: Runner,
    timeout: float,
    progress: Progress = quiet,
    *,
    target_alive: Callable[[], bool] | None = None,
    postcopy_after_passes: int | None = None,
    paused: bool = False,
) -> MigrationStats:
    """Poll the source until the migration completes; its ``MigrationStats``.

    Cancels (and raises ``MigrationFailed``) on QEMU's ``failed``, after
    ``timeout`` seconds, when ``target_alive`` says the target is gone, and
    on Ctrl-C (``KeyboardInterrupt`` becomes ``MigrationFailed('interrupted')``).
    With ``postcopy_after_passes`` (postcopy on), the switch to postcopy is
    asked once that many dirty-sync passes are done. ``paused`` (what
    ``start`` returned): the source guest is resumed (``cont``) when the
    migration fails, as QEMU does itself for a guest it stopped.
    """
    try:
        done = _poll(qmp, timeout, progress, target_alive, postcopy_after_passes)
    except MigrationFailed as e:
        if not paused:
            raise
        try:
            qmp("cont")
        except HpvcError as left:
            why = f"{e.why}; the paused guest did not resume: {left}"
            raise MigrationFailed(e.reason, why) from left
        raise
    if paused:
        return replace(done, stop_and_copy=True, downtime_ms=done.total_ms)
    return done


def _poll(
    qmp: Runner,
    timeout: float,
    progress: Progress,
    target_alive: Callable[[], bool] | None,
    postcopy_after_passes: int | None,
) -> MigrationStats:
    deadline = time.monotonic() + timeout
    said = 0.0
    switched = False
    try:
        while True:
            reply = _status(qmp)
            status = str(reply.get("status", ""))
            if status == "completed":
                return replace(stats(reply), postcopy=switched)
            if status in ("failed", "cancelled"):
                desc = reply.get("error-desc", status)
                raise MigrationFailed(status, f"QEMU says {status}: {desc}")
            if target_alive is not None and not target_alive():
                return _end(qmp, "target-died", "the target QEMU exited")
            if time.monotonic() >= deadline:
                return _end(qmp, "timeout", f"not done after {timeout:g} s")
            passes = _int(reply.get("ram", {}) or {}, "dirty-sync-count")
            after = postcopy_after_passes
            if after is not None and not switched and status == "active" and passes >= after:
                qmp("migrate-start-postcopy")
                switched = True
                progress("migrating: switched to postcopy")
            if status == "active" and time.monotonic() - said >= PROGRESS_S:
                progress(progress_line(reply))
                said = time.monotonic()
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        return _end(qmp, "interrupted", "interrupted (Ctrl-C)")
