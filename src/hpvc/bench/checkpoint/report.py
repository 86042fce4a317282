"""Pure pieces of ``hpvc bench checkpoint``: sizing, pause arithmetic, the report.

No host, no cluster: the runner (``runner.py``) measures, these turn its
samples into min / median / max and markdown.
"""

from __future__ import annotations

from typing import Any

from hpvc.bench.stats import summary

MIB = 1 << 20
OVERHEAD_MIB = 384  # per node: the guest's kernel and userland, QEMU's own memory
HEADROOM_MIB = 2048  # left to the host and its other users
METHODS = ("hpvc", "pcocc")  # VM clusters
METHODS_OF = {"vm": METHODS, "container": ("hpvc", "podman")}
METHOD_WORDS = {
    "hpvc": "hpvc: every node frozen, then each saved, then all thawed (one cut)",
    "pcocc": "pcocc's method: each node paused, saved and resumed in turn",
    "podman": "Podman 4.3 with runc: `podman container checkpoint --tcp-established`"
    " of every container at once (each CRIU freezes its own), then `container restore`",
}


def fill_mib(nodes: int, memory_mib: int, fraction: float, available_mib: int) -> tuple[int, str]:
    """MiB of memory the job holds in each node: ``fraction`` of the node's
    memory, less where the host's available memory cannot hold every node's
    share plus ``OVERHEAD_MIB`` each and ``HEADROOM_MIB``; with the reason
    ("" when not sized down). At least 64 MiB."""
    want = int(memory_mib * fraction)
    room = (available_mib - HEADROOM_MIB) // max(nodes, 1) - OVERHEAD_MIB
    if want <= room:
        return want, ""
    got = max(64, room)
    return got, (
        f"sized down from {want} to {got} MiB per node: {available_mib} MiB available"
        f" on the host for {nodes} nodes"
    )


def node_mib(nodes: int, memory_mib: int, available_mib: int, held: float = 0.0) -> tuple[int, str]:
    """Memory each node of the cluster is given: ``memory_mib``, less where the
    host's memory available at run time cannot hold ``nodes`` of it (the
    planner books a node's whole memory, at ``up`` and again at ``restore``; a
    shared host's other runs hold the rest) while ``held`` times a node's
    memory per node is held elsewhere at the restore (Podman's containers'
    job, the checkpoint just written and read back in the page cache), in
    steps of 256 MiB, at least 256 MiB; with the reason ("" when not sized
    down)."""
    room = int(available_mib / (max(nodes, 1) * (1 + held))) // 256 * 256
    if memory_mib <= room:
        return memory_mib, ""
    got = max(256, room)
    return got, (
        f"nodes given {got} MiB each, not {memory_mib}: {available_mib} MiB available"
        f" on the host at run time for {nodes} nodes"
        + (f", {held:.1f} x a node's memory held elsewhere at the restore" if held else "")
    )


def union_s(windows: list[list[float]]) -> float:
    """Seconds covered by at least one [start, end] window (a job that needs
    every node stalls while any one is paused)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted((w[0], w[1]) for w in windows):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def alternate(reps: int, methods: tuple[str, ...] = METHODS) -> list[list[str]]:
    """The order of the methods in each repetition: swapped every other one."""
    return [list(methods) if i % 2 == 0 else list(reversed(methods)) for i in range(reps)]


def _cell(samples: list[float], scale: float = 1.0, fmt: str = "{:.2f}") -> str:
    if not samples:
        return "-"
    s = summary([x / scale for x in samples])
    return " / ".join(fmt.format(s[k]) for k in ("min", "median", "max"))


def _size_words(cfg: dict[str, Any]) -> str:
    """The cluster's size: "4 x 4 GiB", or "4 x 3840 MiB (of 4 GiB)" where the
    nodes were given less."""
    asked, given = cfg["memory_mib"], cfg.get("node_mib", cfg["memory_mib"])
    if given == asked:
        return f"{cfg['nodes']} x {asked // 1024} GiB"
    return f"{cfg['nodes']} x {given} MiB (of {asked // 1024} GiB)"


def _rows(cfg: dict[str, Any]) -> list[str]:
    head = f"{_size_words(cfg)} (job holds {cfg['fill_mib']} MiB)"
    out = []
    for m in METHODS_OF[cfg.get("kind", "vm")]:
        r = cfg[m]
        goes = f"{sum(r['job_goes_on'])}/{len(r['job_goes_on'])}"
        out.append(
            f"| {head} | {m} | {_cell(r['checkpoint_s'])} | {_cell(r['job_pause_s'])}"
            f" | {_cell(r['node_pause_max_s'])} | {_cell(r['size'], MIB, '{:.0f}')}"
            f" | {_cell(r.get('restore_s', []))} | {goes} |"
        )
    return out


def ratios(cfg: dict[str, Any]) -> dict[str, float]:
    """hpvc / the peer (pcocc's method, Podman) at the medians: checkpoint time, job
    pause, longest node pause, size, restore time."""
    out = {}
    peer = METHODS_OF[cfg.get("kind", "vm")][1]
    for key in ("checkpoint_s", "job_pause_s", "node_pause_max_s", "size", "restore_s"):
        a, b = cfg["hpvc"].get(key, []), cfg[peer].get(key, [])
        if a and b:
            out[key] = summary(a)["median"] / summary(b)["median"]
    return out


HEADER = (
    "| cluster | method | checkpoint s | job paused s | longest node pause s"
    " | size MiB | restore s | job goes on |\n|---|---|---|---|---|---|---|---|"
)
NOTES = {
    "vm": [
        "- checkpoint: hpvc's whole `checkpoint` call (freeze, save, thaw, then the"
        " files' sha256 and the manifest); pcocc: first pause to last resume",
        "- job paused: seconds during which at least one node was paused (a job"
        " that needs every node, as an MPI job does, stalls that long);"
        " longest node pause: the most any one node was paused",
        "- restore: `restore` of the checkpoint after `down` (hpvc only; pcocc's"
        " restore is the same QEMU loading of each node's file)",
    ],
    "container": [
        "- checkpoint: hpvc's whole `checkpoint` call; Podman's `container checkpoint`"
        " command (its pause is counted as the whole command: no barrier tells when"
        " each container stopped)",
        "- restore: hpvc's `restore` after `down`; Podman's `container restore`",
    ],
}


def _section(kind: str, cfgs: list[dict[str, Any]]) -> list[str]:
    title = {"vm": "VM clusters", "container": "Container clusters"}[kind]
    lines = ["", f"## {title}", "", *(f"- {METHOD_WORDS[m]}" for m in METHODS_OF[kind])]
    lines += NOTES[kind]
    lines += [
        "- job goes on: the ping-pong's count rose after the checkpoint (and after"
        " the restore), every echo the count sent",
        "",
        HEADER,
    ]
    measured = [c for c in cfgs if "skipped" not in c]
    for cfg in measured:
        lines += _rows(cfg)
    skipped = [f"- {c['nodes']} x {c['memory_mib'] // 1024} GiB: {c['skipped']}"
               for c in cfgs if "skipped" in c]  # fmt: skip
    if skipped:
        lines += ["", "Not measured (the host could not hold them):", *skipped]
    notes = [f"- {c['nodes']} x {c['memory_mib'] // 1024} GiB: {why}"
             for c in measured for why in (c.get("nodes_sized_down"), c.get("sized_down"))
             if why]  # fmt: skip
    if notes:
        lines += ["", "Sized down to the host's memory:", *notes]
    errors = [f"- {c['nodes']} x {c['memory_mib'] // 1024} GiB: {e}"
              for c in measured for e in c.get("errors", [])]  # fmt: skip
    if errors:
        lines += ["", "What went wrong:", *errors]
    if measured:
        peer = METHODS_OF[kind][1]
        lines += ["", f"Ratios hpvc / {peer} at the medians:", ""]
    for cfg in measured:
        words = ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {v:.2f}"
                          for k, v in ratios(cfg).items())  # fmt: skip
        lines.append(f"- {cfg['nodes']} x {cfg['memory_mib'] // 1024} GiB: {words}")
    return lines


def report_md(doc: dict[str, Any]) -> str:
    """The markdown report of one run."""
    h = doc["host"]
    lines = [
        "# Checkpoint and restore — `hpvc bench checkpoint`",
        "",
        f"{h['date']}, {h['cpu_model']}, {h['cpus']} CPUs, kernel {h['kernel']},"
        f" hpvc {h['hpvc']}, {doc.get('criu', 'criu ?')}; VMs under"
        f" {doc['accelerator'].get('vm')}; load average at start {h['loadavg_start']}"
        + (f", at the end {h['loadavg_end']}." if h.get("loadavg_end") else "."),
        f"{doc['reps']} repetitions per size, methods alternated"
        f" (hpvc first in odd repetitions); min / median / max; hpvc's nodes with"
        f' locality "{doc.get("locality", "none")}".',
    ]
    for kind in ("vm", "container"):
        if doc.get(kind):
            lines += _section(kind, doc[kind])
    return "\n".join(lines) + "\n"
