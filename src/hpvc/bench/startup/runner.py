"""How long ``hpvc up`` and ``hpvc down`` take for container clusters of 1, 4, 8 nodes.

A cluster of N nodes is one head plus N-1 computes (a lone head for N = 1),
every node 1 vCPU floating over the host's CPUs, 128 MiB, no hugepages,
locality "shm". The image is built beforehand, so ``up`` is planning, host
changes (cgroups, bridge, shared memory, netns + veth per node) and starting
the containers. Each repetition brings every size up and down in turn (the
order rotates); ``up`` and ``down`` are timed by the wall clock around the
commands ``hpvc up SPEC --quiet`` and ``hpvc down NAME``, each its own
process, as a user sees them (CLI start included).
The goal: 8 nodes up in under 2 s (median).

With ``peer``, every repetition also starts and removes as many Podman
containers as each size has nodes (``startup.podman``: the same image, limits
and runtime, a bridge network), in parallel and one by one, the order of
hpvc / Podman-parallel / Podman-sequential rotating between repetitions, so
that the ratios (``startup.podman_report``) come from one run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from hpvc.bench import common
from hpvc.bench.startup import cli_start, podman, podman_report
from hpvc.bench.stats import summary
from hpvc.cluster import ops
from hpvc.errors import HpvcError, InputError
from hpvc.paths import image_dir
from hpvc.progress import Progress, quiet
from hpvc.store import Store

GOAL_NODES = 8
GOAL_S = 2.0
MEMORY = "128MiB"
VM_MEMORY = "256MiB"
MAX_NODES = 250  # one /24 per cluster
SHAPE = "one head + N-1 compute nodes (a lone head for N = 1)"
PHASES = {
    "image": "image: guest kernel/initramfs/disk (cached)",
    "plan": "plan: topology, plan, state record",
    "host": "host: cgroups, hugepages, bridge, shared memory",
    "nodes": "nodes: layer, overlay, netns, veth, crun",
    "start": "start: disks, taps, QEMU, pinning",
    "boot": "boot: to every guest's ready line",
    "configure": "configure: /etc/hosts and ARP over ssh",
}


def preflight(sizes: list[int], kind: str = "container") -> None:
    if not sizes:
        raise InputError("--nodes", "no cluster size given", "--nodes 1,4,8")
    bad = [n for n in sizes if n < 1 or n > MAX_NODES]
    if bad:
        raise InputError("--nodes", f"{bad[0]} is not a size from 1 to {MAX_NODES}", "")
    if len(set(sizes)) != len(sizes):
        raise InputError("--nodes", "a size is given twice", "--nodes 1,4,8")
    if kind == "vm":
        common.require("bench startup --kind vm", ["qemu-system-x86_64", "ssh", "ip"])
    else:
        common.require("bench startup", ["crun", "ip"])


def groups(n: int, memory: str = MEMORY) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "head", "count": 1, "memory": memory}]
    if n > 1:
        out.append({"role": "compute", "count": n - 1, "memory": memory})
    return out


def write_specs(tmp: Path, sizes: list[int], kind: str = "container") -> dict[int, tuple[str, str]]:
    """Per size: (cluster name, spec path), each cluster on its own free /24."""
    out: dict[int, tuple[str, str]] = {}
    memory = VM_MEMORY if kind == "vm" else MEMORY
    for n, subnet in zip(sizes, common.free_subnets(len(sizes)), strict=True):
        name = f"b{'v' if kind == 'vm' else 's'}{os.getpid() % 100000}n{n}"
        path = tmp / f"{name}.toml"
        path.write_text(common.cluster_spec(name, subnet, groups(n, memory), kind=kind))
        out[n] = (name, str(path))
    return out


def hpvc_argv() -> list[str]:
    """The ``hpvc`` a user runs: the console script beside this Python."""
    script = Path(sys.executable).with_name("hpvc")
    return [str(script)] if script.exists() else [sys.executable, "-m", "hpvc"]


def cli_env(store: Store, resident: str | None) -> dict[str, str]:
    """The commands' environment: ``store``'s state; with ``resident`` (a
    socket) through that resident hpvc, else each command on its own
    (HPVC_RESIDENT=0, even where a site's server runs)."""
    env = {**os.environ, "HPVC_STATE_DIR": str(store.root), "HPVC_IMAGE_DIR": str(image_dir())}
    return env | ({"HPVC_RESIDENT_SOCKET": resident} if resident else {"HPVC_RESIDENT": "0"})


@contextmanager
def resident_server(tmp: Path, store: Store) -> Iterator[str]:
    """A private ``hpvc serve`` for the run's state; yields its socket."""
    sock, log = tmp / "serve.sock", tmp / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*hpvc_argv(), "serve", "--socket", str(sock)],
            env=cli_env(store, None),
            stdout=out,
            stderr=out,
        )
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise HpvcError("bench startup: hpvc serve", log.read_text().strip()[-300:])
            time.sleep(0.05)
        yield str(sock)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def timed_cli(argv: list[str], store: Store, resident: str | None = None) -> float:
    """Wall seconds of one ``hpvc`` command on ``store``'s state, CLI start included."""
    return cli_start.timed([*hpvc_argv(), *argv], cli_env(store, resident))


def up_down(store: Store, name: str, spec: str, resident: str | None = None) -> dict[str, Any]:
    """One timed ``hpvc up --quiet`` and ``hpvc down``, each a process of its own
    as a user runs them (a failed down is finished by the caller's teardown)."""
    up_s = timed_cli(["up", spec, "--quiet"], store, resident)
    rec = store.get(name)
    accel = ops.status(name, store)["accelerator"]  # outside the timed parts
    down_s = timed_cli(["down", name], store, resident)
    return {
        "up_s": up_s,
        "down_s": down_s,
        "up_inner_s": float(rec.up_seconds or 0.0),
        "phases": dict(rec.phases),
        "accelerator": accel,
    }


PeerRuns = dict[int, dict[str, list[dict[str, Any]]]]


def repetitions(
    store: Store,
    specs: dict[int, tuple[str, str]],
    repeat: int,
    progress: Progress,
    peer: podman.Peer | None = None,
    resident: str | None = None,
) -> tuple[dict[int, list[dict[str, Any]]], PeerRuns]:
    """hpvc's runs per size and, with ``peer``, Podman's per size and mode."""
    sizes = list(specs)
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    peer_runs: PeerRuns = {n: {m: [] for m in podman.MODES} for n in sizes} if peer else {}
    sides = ["hpvc", *podman.MODES] if peer else ["hpvc"]
    for rep in range(repeat):
        order = sizes[rep % len(sizes) :] + sizes[: rep % len(sizes)]
        turn = sides[rep % len(sides) :] + sides[: rep % len(sides)]
        for i, n in enumerate(order):
            for j, side in enumerate(turn):
                at = {"rep": rep, "order": i * len(turn) + j}
                if side == "hpvc":
                    name, spec = specs[n]
                    t = up_down(store, name, spec, resident)
                    runs[n].append({**at, **t})
                    what = f"up {t['up_s']:.3f} s, down {t['down_s']:.3f} s"
                else:
                    assert peer is not None
                    t = peer.cycle(n, side)
                    peer_runs[n][side].append({**at, **t})
                    what = f"podman {side} start {t['start_s']:.3f} s, rm {t['rm_s']:.3f} s"
                progress(f"repetition {rep + 1}/{repeat}: {n} node(s) {what}")
    return runs, peer_runs


def size_doc(n: int, runs: list[dict[str, Any]], kind: str = "container") -> dict[str, Any]:
    up = [r["up_s"] for r in runs]
    doc: dict[str, Any] = {
        "nodes": n,
        "groups": groups(n),
        "runs": runs,
        "up": summary(up),
        "down": summary([r["down_s"] for r in runs]),
        "up_inner": summary([r["up_inner_s"] for r in runs]),
        "phases": {
            k: summary([float(r["phases"].get(k, 0.0)) for r in runs]) for k in runs[0]["phases"]
        },
        "goal_s": GOAL_S if n == GOAL_NODES and kind == "container" else None,
    }
    if doc["goal_s"] is not None:
        doc["meets_goal"] = doc["up"]["median"] < GOAL_S
    return doc


def run(
    sizes: list[int],
    repeat: int = 5,
    progress: Progress = quiet,
    kind: str = "container",
    peer: bool = False,
    resident: bool = False,
) -> dict[str, Any]:
    """Bring each size up and down ``repeat`` times (and Podman's containers, with
    ``peer``); with ``resident``, every hpvc command through a resident hpvc
    (``hpvc serve``) started for the run; return the results document."""
    preflight(sizes, kind)
    if peer and kind != "container":
        raise InputError("--peer", "Podman is the peer of container clusters only", "--no-peer")
    if peer:
        podman.preflight()
    common.ensure_image("hpc", progress)
    facts = common.host_facts(mpi=False)
    about: dict[str, Any] = {}
    with common.scratch_state("bench startup", progress) as (tmp, store):
        specs = write_specs(tmp, sizes, kind)
        ctx: AbstractContextManager[podman.Peer | None] = (
            podman.session(progress) if peer else nullcontext()
        )
        server = resident_server(tmp, store) if resident else nullcontext()
        with ctx as p, server as sock:
            runs, peer_runs = repetitions(store, specs, repeat, progress, p, sock)
            about = p.describe() if p else {}
            container = kind == "container"
            cli = (
                _cli_start(store, specs[min(sizes)], repeat, progress, sock) if container else None
            )
    doc = _doc(sizes, repeat, kind, facts, runs)
    doc["resident"] = resident
    if cli is not None:
        doc["cli"] = cli
    if peer:
        doc["peer"] = about
        for s in doc["sizes"]:
            s["peer"] = podman_report.size_doc(s["nodes"], runs[s["nodes"]], peer_runs[s["nodes"]])
    return doc


def _cli_start(
    store: Store, spec: tuple[str, str], repeat: int, progress: Progress, resident: str | None
) -> dict[str, Any]:
    """The quick commands' start (``startup.cli_start``), with one cluster up for status."""
    name, path = spec
    timed_cli(["up", path, "--quiet"], store, resident)
    try:
        env = cli_env(store, resident)
        return cli_start.measure(hpvc_argv(), env, name, max(repeat, 5), progress)
    finally:
        timed_cli(["down", name], store, resident)


def _doc(
    sizes: list[int],
    repeat: int,
    kind: str,
    facts: dict[str, Any],
    runs: dict[int, list[dict[str, Any]]],
) -> dict[str, Any]:
    accel = {str(r["accelerator"]) for rs in runs.values() for r in rs if r.get("accelerator")}
    return {
        "benchmark": "cluster-startup",
        "kind": kind,
        "accelerator": sorted(accel)[0] if accel else None,
        **facts,
        "repeat": repeat,
        "loadavg_end": list(os.getloadavg()),
        "shape": SHAPE,
        "node": {
            "vcpus": 1,
            "memory": VM_MEMORY if kind == "vm" else MEMORY,
            "pinning": "shared",
            "hugepages": "none",
            "partition": "commodity",
            "locality": "shm",
        },
        "timing": "wall clock around `hpvc up SPEC --quiet` and `hpvc down NAME`, each run as"
        " its own process (CLI start included, as a user sees it); up_inner is hpvc's own"
        " up_seconds (after CLI start, spec load, preflight, image lookup)",
        "goal": {"nodes": GOAL_NODES, "median_up_below_s": GOAL_S},
        "sizes": [size_doc(n, runs[n], kind) for n in sizes],
    }


def report_md(doc: dict[str, Any]) -> str:
    kind = doc.get("kind", "container")
    what = "container clusters" if kind == "container" else f"VM clusters ({doc['accelerator']})"
    lines = [
        f"`hpvc up` / `hpvc down` of {what}, {doc['repeat']} repetitions"
        f" (sizes alternated), on {doc['host']} ({doc['cpu_model']}, {doc['cpus']} CPUs),"
        f" kernel {doc['kernel']}, {doc['crun']}, {doc['date']}."
        + (
            " Every hpvc command went through a resident hpvc (`hpvc serve`) started for the run."
            if doc.get("resident")
            else " Every hpvc command started on its own (no resident hpvc)."
        ),
        "",
        f"Nodes: {doc['shape']}; each 1 vCPU (shared), {doc['node']['memory']}, no hugepages,"
        f" locality shm."
        + (
            f" Goal: {GOAL_NODES} nodes up in under {GOAL_S:g} s (median)."
            if kind == "container"
            else ""
        ),
        "",
        "| nodes | up min s | up median s | up max s | down min s | down median s"
        " | down max s | goal s | goal met |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in doc["sizes"]:
        u, d = s["up"], s["down"]
        goal = f"{s['goal_s']:g}" if s["goal_s"] is not None else ""
        met = "" if "meets_goal" not in s else ("yes" if s["meets_goal"] else "no")
        lines.append(
            f"| {s['nodes']} | {u['min']:.3f} | {u['median']:.3f} | {u['max']:.3f}"
            f" | {d['min']:.3f} | {d['median']:.3f} | {d['max']:.3f} | {goal} | {met} |"
        )
    tail = _phase_table(doc) + podman_report.report_lines(doc) + cli_start.report_lines(doc)
    return "\n".join(lines + tail) + "\n"


def _phase_table(doc: dict[str, Any]) -> list[str]:
    """Median seconds per phase of ``up`` (image, plan, host, start, boot, ...)."""
    names = list(doc["sizes"][0]["phases"])
    if not names:
        return []
    lines = [
        "",
        "Median seconds per phase of `up`: " + ", ".join(PHASES.get(n, n) for n in names) + ".",
        "",
        "| nodes | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for s in doc["sizes"]:
        cells = " | ".join(f"{s['phases'][n]['median']:.3f}" for n in names)
        lines.append(f"| {s['nodes']} | {cells} |")
    return lines
