"""``hpvc bench checkpoint``: checkpoint and restore of whole clusters, hpvc's
consistent cut against pcocc's one-by-one saves (VMs) and Podman (containers).

Per kind and cluster size (nodes x memory per node): one cluster is brought
up (1 vCPU per node, the ``hpc`` image; locality "none", or "shm" with
``--locality shm``: container nodes sharing the cluster's namespaces), the job
(``job.py``) holds part of each node's memory and runs a ping-pong between
the first two nodes; then each repetition runs both methods, their order
swapped every other repetition:

- hpvc: ``cluster.checkpoint.checkpoint`` into a scratch folder (every node
  frozen, saved, all thawed), the job checked, the cluster taken down and
  ``cluster.restore.restore`` of the folder timed, the job checked again;
- VMs, pcocc's method: ``cluster.checkpoint_peer.one_by_one`` (each node
  paused, saved and resumed in turn) on the same guests, the job checked;
- containers, Podman: as many containers of the same image and limits,
  with the same job, checkpointed and restored by Podman (``podman_peer``),
  started for each of its repetitions and removed after it, so that they
  hold no memory while hpvc's restore books its nodes.

Every restore, both methods', reads its checkpoint from the disk: the files
just written are dropped from the page cache first (``drop_cached``), as a
restore after a requeue or on another host would find them. Until
2026-11-27 they were read back from the cache, which the planner could not
count as free, so 4 x 4 GiB container nodes did not fit beside Podman's on
this 24 GiB machine.

Everything runs on a scratch state (``common.scratch_state``) and Podman's
session removes its containers, network and image: every cluster is torn
down and every folder removed, also when a step fails.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hpvc.bench import common
from hpvc.bench.checkpoint import job, podman_peer, report
from hpvc.bench.startup import podman
from hpvc.cluster import checkpoint, checkpoint_peer, lifecycle, restore
from hpvc.errors import DoesNotFit, HpvcError, InputError
from hpvc.progress import Progress, quiet
from hpvc.store import Store
from hpvc.topology import read_topology

IMAGE = "hpc"
MAX_NODES = 8
DOWN_AGAIN_S = 3


def preflight(
    kinds: list[str],
    sizes: list[int],
    memories_mib: list[int],
    reps: int,
    fill: float,
    locality: str = "none",
) -> None:
    """Refuse bad arguments in one line before anything starts."""
    bad = [k for k in kinds if k not in report.METHODS_OF]
    if not kinds or bad:
        raise InputError("--kind", f"{bad[0] if bad else 'nothing'} is not vm or container",
                         "--kind vm,container")  # fmt: skip
    if not sizes or any(n < 2 or n > MAX_NODES for n in sizes):
        raise InputError("--nodes", f"sizes must be 2 to {MAX_NODES} nodes", "--nodes 2,4")
    if not memories_mib or any(m < 256 for m in memories_mib):
        raise InputError("--memory", "each node needs at least 256 MiB", "--memory 1GiB,4GiB")
    if reps < 1:
        raise InputError("--reps", "at least one repetition", "--reps 3")
    if locality not in ("none", "shm"):
        raise InputError("--locality", f"{locality} is not none or shm", "--locality shm")
    if not 0 < fill < 0.9:
        raise InputError("--fill", f"{fill} is not a fraction above 0 and below 0.9", "--fill 0.5")
    tools = ["ip", *(["qemu-system-x86_64", "ssh"] if "vm" in kinds else [])]
    tools += ["crun", "criu", "podman", "runc"] if "container" in kinds else []
    common.require("bench checkpoint", tools)


def available_mib() -> int:
    """What the planner may still take of the host's memory (every NUMA node)."""
    return sum(n.free_mib for n in read_topology().numa_nodes)


def _spec(tmp: Path, name: str, nodes: int, memory: str, kind: str, locality: str) -> Path:
    groups: list[dict[str, Any]] = [{"role": "head", "count": 1, "memory": memory}]
    groups.append({"role": "compute", "count": nodes - 1, "memory": memory})
    path = tmp / f"{name}.toml"
    subnet = common.free_subnets(1)[0]
    # Locality "none" by default, as the figures before 2026-11-28 (container
    # nodes sharing namespaces could not be cut then): VMs get no ivshmem region,
    # so both kinds' nodes talk over the cluster network alike.
    text = common.cluster_spec(name, subnet, groups, locality=locality, kind=kind, image=IMAGE)
    path.write_text(text)
    return path


def drop_cached(top: Path) -> None:
    """Write out and drop from the page cache every file under ``top`` (only
    these files' pages: ``posix_fadvise(DONTNEED)``, not the host's whole cache)."""
    files = [top] if top.is_file() else [p for p in top.rglob("*") if p.is_file()]
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _samples(methods: tuple[str, ...]) -> dict[str, dict[str, list[Any]]]:
    keys = ("checkpoint_s", "job_pause_s", "node_pause_max_s", "size", "job_goes_on")
    out: dict[str, dict[str, list[Any]]] = {m: {k: [] for k in keys} for m in methods}
    for m in methods:
        if m != "pcocc":  # pcocc's method is timed for its saves only
            out[m]["restore_s"] = []
    return out


def _job_ok(name: str, node: str, store: Store, errors: list[str]) -> bool:
    try:
        job.goes_on(name, node, store)
        return True
    except HpvcError as e:
        errors.append(e.line())
        return False


def _down(name: str, store: Store, progress: Progress) -> None:
    """``down``, once more after a moment where a node's tasks had not yet left its
    cgroup (a node holding GiBs frees them for a while after it is killed: seen
    at 4 x 4 GiB, 2026-11-26 09:01); the error itself says to run ``down`` again."""
    try:
        lifecycle.down(name, store, progress)
    except HpvcError as e:
        if "tasks are still in it" not in e.line():
            raise
        progress(f"{name}: a node's tasks were still exiting; down again in {DOWN_AGAIN_S} s")
        time.sleep(DOWN_AGAIN_S)
        lifecycle.down(name, store, progress)


def _hpvc_once(tmp: Path, store: Store, name: str, head: str, s: dict[str, list[Any]],
               errors: list[str], progress: Progress) -> None:  # fmt: skip
    dest = tmp / f"{name}-hpvc"
    try:
        t0 = time.perf_counter()
        _, m = checkpoint.checkpoint(name, dest, store=store, progress=progress)
        s["checkpoint_s"].append(time.perf_counter() - t0)
        s["job_pause_s"].append(m.frozen_s)  # every node paused from first freeze to thaw
        s["node_pause_max_s"].append(m.frozen_s)
        s["size"].append(m.size())
        ok = _job_ok(name, head, store, errors)
        _down(name, store, progress)
        drop_cached(dest)
        t0 = time.perf_counter()
        restore.restore(dest, store=store, progress=progress)
        s["restore_s"].append(time.perf_counter() - t0)
        s["job_goes_on"].append(ok and _job_ok(name, head, store, errors))
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def _pcocc_once(tmp: Path, store: Store, name: str, head: str, s: dict[str, list[Any]],
                errors: list[str], progress: Progress) -> None:  # fmt: skip
    dest = tmp / f"{name}-pcocc"
    try:
        r = checkpoint_peer.one_by_one(name, dest, store, progress)
        s["checkpoint_s"].append(r["total_s"])
        s["job_pause_s"].append(report.union_s(r["windows"]))
        s["node_pause_max_s"].append(max(r["paused_s"].values()))
        s["size"].append(r["size"])
        s["job_goes_on"].append(_job_ok(name, head, store, errors))
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def _podman_once(ck: podman_peer.CheckpointPeer, s: dict[str, list[Any]],
                 errors: list[str], progress: Progress) -> None:  # fmt: skip
    progress("podman: starting its containers, their job filling memory")
    ck.start()
    try:
        _podman_timed(ck, s, errors, progress)
    finally:
        ck.remove()  # nothing of Podman's holds memory during hpvc's turns


def _podman_timed(ck: podman_peer.CheckpointPeer, s: dict[str, list[Any]],
                  errors: list[str], progress: Progress) -> None:  # fmt: skip
    took, size = ck.checkpoint()
    s["checkpoint_s"].append(took)
    s["job_pause_s"].append(took)  # no barrier: a container may run while others are saved
    s["node_pause_max_s"].append(took)
    s["size"].append(size)
    for folder in ck.folders():
        drop_cached(folder)
    s["restore_s"].append(ck.restore())
    ok = ck.goes_on()
    s["job_goes_on"].append(ok)
    if not ok:  # recorded
        errors.append(f"podman: the job stopped after restore ({ck.last_words()})")
        progress("podman: the job stopped after restore")


def one_size(tmp: Path, store: Store, kind: str, nodes: int, memory_mib: int, reps: int,
             fill: float, progress: Progress = quiet,
             locality: str = "none") -> dict[str, Any]:  # fmt: skip
    """Both methods of ``kind``, ``reps`` times alternated, on one cluster of
    ``nodes`` x ``memory_mib``; the cluster is taken down at the end."""
    methods = report.METHODS_OF[kind]
    name = f"ck{kind[0]}{nodes}x{memory_mib // 1024 or 1}"
    # What the host holds now, read at run time: a shared host's other runs may
    # hold memory a planner would need (the nodes are given less, and it is said).
    free = available_mib()
    # At the restore the planner books the nodes again; the checkpoint just
    # written is out of the page cache (``drop_cached``) and Podman's containers
    # are gone (``_podman_once``): nothing else of the run holds memory then.
    asked, (memory_mib, node_note) = memory_mib, report.node_mib(nodes, memory_mib, free)
    if node_note:
        progress(f"{name}: {node_note}")
    # Containers: Podman's as many containers hold as much beside hpvc's nodes.
    holders = nodes * (2 if kind == "container" else 1)
    fill_mib, note = report.fill_mib(holders, memory_mib, fill, free)
    progress(f"{name}: up ({nodes} {kind}s x {memory_mib} MiB), the job holds {fill_mib} MiB each")
    spec = _spec(tmp, name, nodes, f"{memory_mib}MiB", kind, locality)
    lifecycle.up(str(spec), store, progress)
    plan = store.get(name).the_plan()
    job.start(name, [(n.name, n.ip) for n in plan.nodes], fill_mib, store)
    head = plan.nodes[0].name
    samples, errors = _samples(methods), list[str]()
    order = report.alternate(reps, methods)
    with _peer(kind, nodes, memory_mib, fill_mib, progress) as ck:
        for i, ms in enumerate(order):
            for m in ms:
                progress(f"{name}: repetition {i + 1}/{reps}, {m}")
                if m == "hpvc":
                    _hpvc_once(tmp, store, name, head, samples[m], errors, progress)
                elif m == "pcocc":
                    _pcocc_once(tmp, store, name, head, samples[m], errors, progress)
                else:
                    assert ck is not None
                    _podman_once(ck, samples[m], errors, progress)
        peer = ck.describe() if ck is not None else None
    _down(name, store, progress)
    return {"kind": kind, "nodes": nodes, "memory_mib": asked, "node_mib": memory_mib,
            "available_mib": free, "nodes_sized_down": node_note, "fill_mib": fill_mib,
            "sized_down": note, "order": order, "errors": errors, "peer": peer,
            **samples}  # fmt: skip


@contextmanager
def _peer(kind: str, nodes: int, memory_mib: int, fill_mib: int,
          progress: Progress) -> Iterator[podman_peer.CheckpointPeer | None]:  # fmt: skip
    """Podman's containers beside a container cluster (none for VMs)."""
    if kind != "container":
        yield None
        return
    with podman.session(progress) as peer:
        ck = podman_peer.CheckpointPeer(peer, nodes, memory_mib, fill_mib)
        try:
            yield ck  # started for each of its repetitions (``_podman_once``)
        finally:
            ck.remove()


def run(kinds: list[str], sizes: list[int], memories_mib: list[int], reps: int,
        fill: float = 0.5, progress: Progress = quiet,
        partial: Path | None = None, locality: str = "none") -> dict[str, Any]:  # fmt: skip
    """The whole benchmark; results.json's document (written to ``partial`` as
    well after each size, so a run cut short keeps what it measured). A size
    the host cannot hold (the planner's refusal) is recorded as skipped."""
    preflight(kinds, sizes, memories_mib, reps, fill, locality)
    if "vm" in kinds:
        common.ensure_guest(IMAGE, progress)
    else:
        common.ensure_image(IMAGE, progress)
    doc: dict[str, Any] = {
        "host": common.host_facts(mpi=False),
        "accelerator": common.accelerator(),
        "reps": reps,
        "fill_fraction": fill,
        "locality": locality,
        "runc": common.tool_version(["runc", "--version"]),
        "criu": common.tool_version(["criu", "--version"]),
        "vm": [],
        "container": [],
    }
    with common.scratch_state("bench checkpoint", progress) as (tmp, store):
        for kind in kinds:
            for n in sizes:
                for mem in memories_mib:
                    try:
                        cfg = one_size(tmp, store, kind, n, mem, reps, fill, progress, locality)
                    except DoesNotFit as e:
                        progress(f"{kind} {n} x {mem} MiB: {e.line()}")
                        cfg = {"kind": kind, "nodes": n, "memory_mib": mem, "skipped": e.line()}
                    doc[kind].append(cfg)
                    if partial is not None:
                        partial.write_text(json.dumps(doc, indent=2) + "\n")
    doc["host"]["loadavg_end"] = list(__import__("os").getloadavg())
    return doc
