"""Figures of ``hpvc bench migrate`` on one host: the guest's outside view of
a move (longest gap between ping replies), the per size and load table, and
its markdown. Pure: no host access. Architecture: docs/architecture.md
(``bench/``)."""

from __future__ import annotations

import itertools
import re
from typing import Any

from hpvc.bench.stats import summary

LOADS = ("idle", "memwrite", "mpi")
# `ping -D` prints "[1764131234.123456] 64 bytes from 10.0.0.3: icmp_seq=5 ttl=64 ..."
REPLY_RE = re.compile(r"^\[(\d+\.\d+)\] \d+ bytes from .*icmp_seq=(\d+)", re.M)


def loads_of(rep: int) -> tuple[str, ...]:
    """The loads of repetition ``rep`` in turn: forwards on even, backwards on odd."""
    return LOADS if rep % 2 == 0 else LOADS[::-1]


def longest_gap_ms(ping_text: str, end: float | None = None) -> float | None:
    """The longest time between two successive replies in ``ping -D`` output
    (the guest as seen from outside; its own clock stops while paused); with
    ``end`` (when ping was stopped, epoch seconds) a silence from the last
    reply to it counts too, so a guest that stops answering shows as a gap
    rather than hiding it. None with fewer than two points."""
    stamps = [float(m[1]) for m in REPLY_RE.finditer(ping_text)]
    if end is not None and stamps:
        stamps.append(max(end, stamps[-1]))
    if len(stamps) < 2:
        return None
    return max(b - a for a, b in itertools.pairwise(stamps)) * 1000.0


def table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """min / median / max per guest size and load."""
    out: list[dict[str, Any]] = []
    for mib in sorted({r["memory_mib"] for r in rows}):
        for load in LOADS:
            mine = [r for r in rows if r["memory_mib"] == mib and r["load"] == load]
            if not mine:
                continue
            e: dict[str, Any] = {"memory_mib": mib, "load": load, "n": len(mine)}
            for key in ("total_ms", "downtime_ms", "wall_s"):
                e[key] = summary([float(r[key]) for r in mine])
            e["sent_mib"] = summary([r["bytes_sent"] / (1 << 20) for r in mine])
            gaps = [r["ping_gap_ms"] for r in mine if r.get("ping_gap_ms") is not None]
            e["ping_gap_ms"] = summary(gaps) if gaps else None
            # Only a load still running after the switch saw the pause (an old
            # result without the mark counts as one that did).
            spans = [r for r in mine if r.get("load_spans_move", True)]
            e["spans"] = len(spans) if load != "idle" else None
            slow = [r["slowdown"] for r in spans if "slowdown" in r]
            if load == "mpi" and slow:
                e["slowdown"] = summary(slow)
            gap = [r["loop"]["max_gap_ms"] for r in spans if "max_gap_ms" in r.get("loop", {})]
            if load == "mpi" and gap:
                e["loop_gap_ms"] = summary(gap)
            e["load_failed"] = sum(1 for r in mine if r.get("load_failed"))
            out.append(e)
    return out


def slowdown(baseline_trips: int, during_trips: int) -> float:
    """How much slower the MPI loop ran during the move than just before
    (same length of loop): 1.0 is no slowdown."""
    return baseline_trips / max(1, during_trips)


def _mmm(d: dict[str, float] | None, f: str = "{:.0f}") -> str:
    if d is None:
        return "n/a"
    return " / ".join(f.format(d[k]) for k in ("min", "median", "max"))


STOPPED_NOTE = (
    "The guest was copied stopped (TCG before QEMU 9.0: a live copy loses guest writes,"
    ' docs/vms.md "Live migration under TCG"): its downtime is QEMU\'s whole copy.'
)


def report_md(doc: dict[str, Any]) -> str:
    emu = " (TCG: emulation, not KVM)" if doc["accelerator"].get("vm") == "tcg" else ""
    lines = [
        f"# Live migration on one host{emu}",
        "",
        f"{doc['reps']} repetitions per size, loads alternated; each move into a new QEMU;"
        " min / median / max.",
    ]
    if doc.get("sized_down"):
        lines += ["", doc["sized_down"]]
    if any(r.get("stop_and_copy") for r in doc.get("runs", [])):
        lines += ["", STOPPED_NOTE]
    lines += [
        "",
        "| guest | load | total ms | downtime ms | ping gap ms (outside) | sent MiB |"
        " wall s | MPI slowdown | MPI longest round trip ms | load through the move |"
        " load failed |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in doc["table"]:
        mpi = e["load"] == "mpi"
        slow = _mmm(e.get("slowdown"), "{:.2f}") if mpi else ""
        gap = _mmm(e.get("loop_gap_ms"), "{:.0f}") if mpi else ""
        spans = "" if e.get("spans") is None else f"{e['spans']} of {e['n']}"
        lines.append(
            f"| {e['memory_mib']} MiB | {e['load']} | {_mmm(e['total_ms'])} |"
            f" {_mmm(e['downtime_ms'])} | {_mmm(e['ping_gap_ms'])} | {_mmm(e['sent_mib'])} |"
            f" {_mmm(e['wall_s'], '{:.1f}')} | {slow} | {gap} | {spans} |"
            f" {e.get('load_failed', 0)} of {e['n']} |"
        )
    failed = [r for r in doc.get("runs", []) if r.get("load_failed")]
    if failed:
        lines += ["", "Loads that did not end right (the move itself was measured):", ""]
        lines += [
            f"- {r['memory_mib']} MiB rep {r['rep']} {r['load']}: {r['load_failed']}"
            for r in failed
        ]
    return "\n".join(lines) + "\n"
