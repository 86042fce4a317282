"""``hpvc bench network``, the pure half: parse the tools, decide the goals, write the report.

``parse_iperf3`` reads ``iperf3 -J`` (the receiver's bit rate is the
bandwidth), ``parse_sockperf`` the text of ``sockperf ping-pong`` (latencies in
microseconds, each half a round trip, as sockperf reports them). ``build``
turns the samples of a run (one per repetition, side and metric) into the
document written as results.json: min/median/max per side and the node/fabric
ratio paired per repetition; ``report_md`` writes report.md from that document
alone. Nothing here runs a tool or touches the host.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from hpvc.bench.stats import summary
from hpvc.errors import HpvcError

SIDES = ("fabric", "node")


@dataclass(frozen=True)
class Row:
    """One line of the table: a field of the samples of one metric."""

    key: str
    metric: str  # the samples' "metric"
    field: str  # which of their fields
    unit: str
    label: str


ROWS = (
    Row("bandwidth", "bandwidth", "value", "Gbit/s", "TCP bandwidth (iperf3, 1 stream)"),
    Row("latency", "latency", "value", "us", "TCP latency, median (sockperf ping-pong)"),
    Row("latency_avg", "latency", "avg_us", "us", "TCP latency, mean"),
    Row("latency_p99", "latency", "p99_us", "us", "TCP latency, 99th percentile"),
)

# Goals on the median of the per-repetition ratios node / fabric.
GOALS: tuple[dict[str, Any], ...] = (
    {"row": "bandwidth", "op": ">=", "ratio": 0.90, "what": "node/fabric bandwidth >= 0.90"},
    {"row": "latency", "op": "<=", "ratio": 1.2, "what": "node/fabric latency <= 1.2"},
)

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SOCKPERF = {
    "avg_us": r"avg-latency=\s*([\d.]+)",
    "stdev_us": r"std-dev=\s*([\d.]+)",
    "p50_us": r"percentile 50\.000 =\s*([\d.]+)",
    "p99_us": r"percentile 99\.000 =\s*([\d.]+)",
    "min_us": r"<MIN> observation =\s*([\d.]+)",
    "max_us": r"<MAX> observation =\s*([\d.]+)",
    "observations": r"Total (\d+) observations",
}


def parse_iperf3(text: str) -> dict[str, Any]:
    """Bandwidth and its context from ``iperf3 -c ... -J``; an iperf3 error is raised."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise HpvcError("iperf3 output", f"not JSON ({e.msg})") from None
    if doc.get("error"):
        raise HpvcError("iperf3", str(doc["error"]))
    try:
        end = doc["end"]
        received, sent = end["sum_received"], end["sum_sent"]
        cpu = end.get("cpu_utilization_percent", {})
        return {
            "value": float(received["bits_per_second"]) / 1e9,
            "sender_gbps": float(sent["bits_per_second"]) / 1e9,
            "seconds": float(received["seconds"]),
            "bytes": int(received["bytes"]),
            "retransmits": int(sent.get("retransmits", 0)),
            "cpu_sender_pct": float(cpu.get("host_total", 0.0)),
            "cpu_receiver_pct": float(cpu.get("remote_total", 0.0)),
        }
    except (KeyError, TypeError, ValueError) as e:
        raise HpvcError("iperf3 output", f"no end summary ({e})") from None


def parse_sockperf(text: str) -> dict[str, Any]:
    """Latency figures (microseconds, half round trips) from ``sockperf ping-pong``."""
    clean = _ANSI.sub("", text)
    out: dict[str, Any] = {}
    for key, pattern in _SOCKPERF.items():
        m = re.search(pattern, clean)
        if m is None:
            errors = [x for x in clean.splitlines() if "ERROR" in x]
            why = errors[0].split("ERROR:", 1)[-1].strip() if errors else f"no {key} in its output"
            raise HpvcError("sockperf", why)
        out[key] = int(m.group(1)) if key == "observations" else float(m.group(1))
    out["value"] = out["p50_us"]
    return out


# --- the document --------------------------------------------------------------------


def _values(samples: list[dict[str, Any]], row: Row, side: str) -> dict[int, float]:
    return {
        int(s["rep"]): float(s[row.field])
        for s in samples
        if s["metric"] == row.metric and s["side"] == side
    }


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Per row: min/median/max per side, and node/fabric paired per repetition."""
    out: dict[str, Any] = {}
    for row in ROWS:
        per = {side: _values(samples, row, side) for side in SIDES}
        if not all(per.values()):
            continue
        reps = sorted(set(per["fabric"]) & set(per["node"]))
        ratios = [per["node"][r] / per["fabric"][r] for r in reps]
        out[row.key] = {
            "unit": row.unit,
            "label": row.label,
            **{side: summary(list(per[side].values())) for side in SIDES},
            "ratio": {"n": len(ratios), **summary(ratios)} if ratios else None,
            "ratios": ratios,
        }
    return out


def goals(rows: dict[str, Any]) -> list[dict[str, Any]]:
    """Each goal with the median ratio it is judged on and whether it is met."""
    out = []
    for g in GOALS:
        r = rows.get(g["row"], {}).get("ratio")
        median = None if r is None else float(r["median"])
        if median is None:
            met = False
        else:
            met = median >= g["ratio"] if g["op"] == ">=" else median <= g["ratio"]
        out.append({**g, "median": median, "met": met})
    return out


def build(
    facts: dict[str, Any], params: dict[str, Any], samples: list[dict[str, Any]]
) -> dict[str, Any]:
    """results.json: where, with what, every sample, the summaries and the goals."""
    rows = summarize(samples)
    decided = goals(rows)
    return {
        "benchmark": "network",
        **facts,
        **params,
        "samples": samples,
        "rows": rows,
        "goals": decided,
        "meets_goal": all(g["met"] for g in decided),
    }


# --- report.md -----------------------------------------------------------------------


def _num(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def _mmm(s: dict[str, float], fmt: Any = _num) -> str:
    return " / ".join(fmt(s[k]) for k in ("min", "median", "max"))


def _header(doc: dict[str, Any]) -> list[str]:
    bed = doc["testbed"]
    return [
        f"The cluster network across two hosts against the fabric between them,"
        f" {doc['repeat']} repetitions of {doc['seconds']} s per measurement (the two sides"
        f" alternated, the order rotating), on {doc['host']} ({doc['cpu_model']},"
        f" {doc['cpus']} CPUs), kernel {doc['kernel']}, {doc['date']};"
        f" {doc['tools']['iperf3']}, {doc['tools']['sockperf']}.",
        "",
        f"- fabric: {doc['sides']['fabric']}",
        f"- node: {doc['sides']['node']}",
        "",
        f"Both hosts are network namespaces on this one machine ({bed['what']}): the"
        " fabric is a veth pair through a bridge, so what the node/fabric ratio measures"
        " is the kernel's VXLAN encapsulation path and the cluster bridge, not a NIC.",
        "",
        *_bridge_netfilter(bed),
        *_pinning(doc),
    ]


def _bridge_netfilter(bed: dict[str, Any]) -> list[str]:
    """Whether bridged frames went through the IP firewall hooks (br_netfilter)."""
    knobs = bed.get("bridge_netfilter_knobs")
    if knobs is None:  # a document from before the setting existed
        return []
    seen = sorted({v for k in knobs.values() for v in k.values()})
    if not seen:
        return [
            "Bridge netfilter: not in this kernel (br_netfilter not loaded): bridged frames"
            " skip the IP firewall hooks, as on a host without Docker or Kubernetes.",
            "",
        ]
    state = "on" if bed.get("bridge_netfilter") else "off"
    values = "/".join(str(v) for v in seen)
    if state == "off":
        why = (
            "as on a compute host without Docker or Kubernetes, where br_netfilter is not"
            " loaded, and on a fabric switch (a new namespace starts with them at 1)"
        )
    else:
        why = (
            "as on a host where Docker or Kubernetes loaded br_netfilter: every frame crossing"
            " a bridge (the fabric's, and the cluster's on both hosts) goes through the IP"
            " firewall hooks"
        )
    return [
        f"Bridge netfilter: {state} in the fabric's and the hosts' namespaces"
        f" (net.bridge.bridge-nf-call-iptables/ip6tables/arptables = {values}), {why}.",
        "",
    ]


def _pinning(doc: dict[str, Any]) -> list[str]:
    c = doc.get("pinning") or {}
    if c.get("host_a") is None:
        return ["Clients and servers ran where the scheduler put them (fewer than 2 CPUs).", ""]
    line = (
        f"Host A's processes (the clients) ran on CPU {c['host_a']}, host B's (the servers)"
        f" on CPU {c['host_b']}, as on two machines; "
    )
    rx = doc.get("testbed", {}).get("rx_cpus")
    if rx:
        line += (
            f"so did each host's kernel receive work (RPS on its fabric interface: what"
            f" arrives at host A is processed on CPU {rx['host_a']}, at host B on CPU"
            f" {rx['host_b']}), as each NIC interrupts its own host; the fabric bridge (the"
            " switch) runs on the sender's CPU."
        )
    else:
        line += (
            "the kernel's receive work for a veth runs on the sending CPU, so one CPU does"
            " both hosts' part of a packet's path."
        )
    return [line, ""]


def _goal_table(doc: dict[str, Any]) -> list[str]:
    lines = ["| goal | median ratio | min / max | met |", "|---|---|---|---|"]
    for g in doc["goals"]:
        r = doc["rows"].get(g["row"], {}).get("ratio")
        if r is None:
            lines.append(f"| {g['what']} | n/a | | no |")
            continue
        met = "yes" if g["met"] else "**no**"
        lines.append(
            f"| {g['what']} | {r['median']:.3f} | {r['min']:.3f} / {r['max']:.3f} | {met} |"
        )
    return [*lines, ""]


def _row_table(doc: dict[str, Any]) -> list[str]:
    lines = [
        "| metric | unit | fabric min / median / max | node min / median / max"
        " | node/fabric min / median / max |",
        "|---|---|---|---|---|",
    ]
    for key, r in doc["rows"].items():
        ratio = _mmm(r["ratio"], lambda v: f"{v:.3f}") if r["ratio"] else "n/a"
        lines.append(
            f"| {key}: {r['label']} | {r['unit']} | {_mmm(r['fabric'])} | {_mmm(r['node'])}"
            f" | {ratio} |"
        )
    return [*lines, ""]


def _pairs_table(doc: dict[str, Any]) -> list[str]:
    """The two goal metrics per repetition, side by side: what the ratios pair."""
    rows = [r for r in ROWS if r.key in ("bandwidth", "latency")]
    head = "| rep |"
    for r in rows:
        head += f" fabric {r.key} {r.unit} | node {r.key} {r.unit} | ratio |"
    lines = [head, "|---|" + "---|---|---|" * len(rows)]
    per = {(r.key, s): _values(doc["samples"], r, s) for r in rows for s in SIDES}
    for rep in sorted(per[("bandwidth", "fabric")]):
        cells = [str(rep + 1)]
        for r in rows:
            f, n = per[(r.key, "fabric")].get(rep), per[(r.key, "node")].get(rep)
            cells += ["" if f is None else _num(f), "" if n is None else _num(n)]
            cells.append(f"{n / f:.3f}" if f and n is not None else "")
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def report_md(doc: dict[str, Any]) -> str:
    verdict = "met" if doc["meets_goal"] else "not met"
    lines = _header(doc)
    lines += [f"Goals (median of the ratios paired per repetition): {verdict}.", ""]
    lines += _goal_table(doc)
    lines += _row_table(doc)
    lines += ["Per repetition:", "", *_pairs_table(doc)]
    lines += [
        "Latencies are sockperf's: half a round trip of a"
        f" {doc['message_bytes']}-byte message over TCP."
        " Bandwidth is what the iperf3 receiver got.",
    ]
    return "\n".join(lines) + "\n"
