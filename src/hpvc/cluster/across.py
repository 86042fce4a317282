"""A VM node moved from one host's cluster record to another host's (issue 27).

The cluster API for live migration between hosts (docs/slurm.md "Moving a VM
node to another host"). Each function runs on one host, on that host's record
of its part of the cluster (a Slurm job's share); ``hpvc.slurm.migrate`` runs
them on the hosts in turn:

- ``receive`` (target): plan the node as a new node of this record (its
  pinning, emulator CPUs, guest NUMA cells and hugepages placed here; its name,
  address and MAC kept), refuse before any change when it does not fit, book
  it, and start it as a paused migration target; ``abandon`` undoes that;
- ``send`` (source): move the guest; ``release`` then forgets the node here:
  its QEMU, tap and disk go (its journal), its CPUs and pages are given back;
- ``follow`` (every host): the record's map of where the cluster's other
  nodes live (``overlay``) and the VXLAN forwarding entries point the node's
  MAC at its new host, one ``bridge -batch``.

How a backend moves a node is its ``across`` module (``hpvc.backends.<name>.
across``, found by the backend's registry name, as the registry finds a
backend): a backend without one is refused in one line (architecture rule 3:
no branch on the kind of node here). Architecture: docs/architecture.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from hpvc.backends.base import Backend
from hpvc.backends.vm.migration import MigrationFailed as MigrationFailed
from hpvc.backends.vm.migration import MigrationSettings as MigrationSettings
from hpvc.backends.vm.migration import MigrationStats as MigrationStats
from hpvc.cluster import images, pages
from hpvc.cluster.lifecycle import _grow_pages, _union, hostname
from hpvc.cluster.status import open_env
from hpvc.cluster.teardown import waiting
from hpvc.errors import DoesNotFit, HpvcError, InputError
from hpvc.host import vxlan
from hpvc.plan import Plan
from hpvc.plan.model import Reservations
from hpvc.plan.overlay import Overlay, Vtep
from hpvc.plan.reservations import holdings_of
from hpvc.progress import Progress, quiet
from hpvc.spec import Spec, parse_spec
from hpvc.store import Store
from hpvc.topology import read_topology
from hpvc.topology.model import Topology

# (the record's spec, this host, its topology less what is held, every
# cluster's holdings, the record's plan) -> the plan with the node added
# (raises DoesNotFit).
Placer = Callable[[Spec, str, Topology, Reservations, Plan], Plan]


def mover(backend: Backend, what: str) -> ModuleType:
    """The backend's ``across`` module, or a one-line refusal."""
    try:
        return importlib.import_module(f"hpvc.backends.{backend.name}.across")
    except ModuleNotFoundError:
        raise InputError(
            what,
            f"{backend.name} nodes cannot move between hosts",
            "only VM nodes of the qemu backend move (docs/slurm.md)",
        ) from None


def receive(
    store: Store,
    name: str,
    node: str,
    place: Placer,
    settings: MigrationSettings,
    address: str,
    source: str,
    mem_limit_mib: int = 0,
    progress: Progress = quiet,
    region_mib: int = 0,
) -> dict[str, Any]:
    """Book ``node`` in record ``name`` and start it as a migration target
    listening on ``address`` for the host at ``source``; ``{"uri", "pid"}``.
    ``mem_limit_mib``: the memory the record's nodes may have together here (a
    Slurm job's on this host; 0: no limit). ``region_mib``: the size of the
    ivshmem region the node maps at the source (``region_mib`` there; 0: none).
    Refused (``InputError``/``DoesNotFit``)
    before any change when the node is here already or does not fit."""
    what = f"node {node} into {name}"
    with store.cluster_lock(name, "hpvc node migrate", waiting(name, progress)):
        with store.lock():
            rec = store.get(name)
            if rec.status != "running":
                raise InputError(what, f"{name} is {rec.status}", "wait, or take it down")
            backend, _ = open_env(store, rec)
            mod = mover(backend, what)
            old = rec.the_plan()
            if node in {n.name for n in old.nodes}:
                raise InputError(what, f"{node} already runs in {name} on this host", "")
            host = hostname()
            # Every cluster's holdings count, this one's too: the node is new here.
            topo = pages.unheld(store, read_topology("/"), host, exclude="")
            spec = parse_spec(rec.spec, rec.spec_path, "site")
            plan = place(spec, host, topo, store.reservations(), old)
            total = sum(n.memory_mib for n in plan.nodes)
            if mem_limit_mib and total > mem_limit_mib:
                raise DoesNotFit(
                    f"{node} does not fit on {host}: the job's nodes there would need"
                    f" {total} MiB, the job has {mem_limit_mib} MiB on that host",
                    "move it to a host with room, or give the job more memory per host",
                )
            rec.pages = pages.to_record(
                pages.merged(pages.held(rec, host), pages.held_by_plan(plan, host))
            )
            new_holdings = holdings_of(plan, {host: topo.cpu_package()})
            rec.holdings = {
                h: _union(rec.holdings.get(h), new_holdings.get(h))
                for h in set(rec.holdings) | set(new_holdings)
            }
            rec.plan = plan.to_json()
            images.record(rec, [node])
            store.save(rec)
        backend, env = open_env(store, rec)
        try:
            _grow_pages(env, plan, progress)
            pid, uri = mod.receive(backend, env, plan, plan.node(node), settings, address,
                                   source, progress, region_mib)  # fmt: skip
            env.save()
        except BaseException:
            errors = _forget(store, name, node, progress)
            if errors:
                progress(f"{what}: undo left {errors[0]}")
            raise
    return {"uri": uri, "pid": pid, "host": host}


def send(
    store: Store,
    name: str,
    node: str,
    uri: str,
    settings: MigrationSettings,
    progress: Progress = quiet,
) -> MigrationStats:
    """Move ``node`` of record ``name`` to the target at ``uri`` (``MigrationFailed``:
    it keeps running here)."""
    rec = store.get(name)
    backend, env = open_env(store, rec)
    plan = rec.the_plan()
    if node not in {n.name for n in plan.nodes}:
        raise InputError(f"node {node}", f"is not in {name} on this host", "")
    return mover(backend, f"node {node}").send(env, plan, node, uri, settings, progress)  # type: ignore[no-any-return]


def region_mib(store: Store, name: str, node: str) -> int:
    """The size in MiB of the ivshmem region ``node`` of record ``name`` maps here
    (0: none): the target gives the node a region of its own that size."""
    rec = store.get(name)
    backend, env = open_env(store, rec)
    return int(mover(backend, f"node {node}").region_mib(env, rec.the_plan(), node))


def check(store: Store, name: str, node: str) -> None:
    """Refuse (``InputError``) a node that cannot move to another host, before
    anything moves: not here, another backend, a device that cannot migrate."""
    rec = store.get(name)
    backend, env = open_env(store, rec)
    plan = rec.the_plan()
    if node not in {n.name for n in plan.nodes}:
        raise InputError(f"node {node}", f"is not in {name} on this host", "")
    why = mover(backend, f"node {node}").refusal(env, plan, node)
    if why is not None:
        raise InputError(f"node {node} cannot move", str(why), "")


def abandon(
    store: Store, name: str, node: str, progress: Progress = quiet
) -> tuple[list[str], str]:
    """Undo ``receive`` (the target QEMU, tap, disk, booking); the errors left,
    and the last words of the target QEMU's log (why it stopped taking the guest)."""
    with store.cluster_lock(name, "hpvc node migrate", waiting(name, progress)):
        said = _log_tail(store.node_dir(name, node) / "qemu.log")
        return _forget(store, name, node, progress), said


def _log_tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(ln.strip() for ln in text.strip().splitlines()[-lines:])


def release(store: Store, name: str, node: str, progress: Progress = quiet) -> list[str]:
    """The node left this host: stop what is left of it, give back its CPUs and pages."""
    with store.cluster_lock(name, "hpvc node migrate", waiting(name, progress)):
        return _forget(store, name, node, progress)


def _forget(store: Store, name: str, node: str, progress: Progress) -> list[str]:
    with store.lock():
        rec = store.get(name)
        old = rec.the_plan()
        if node not in {n.name for n in old.nodes}:
            return []
        _, env = open_env(store, rec)
        errors = env.node_journal(node).undo_all(progress)
        getattr(env.state, "pids", {}).pop(node, None)
        plan: Plan = replace(old, nodes=tuple(n for n in old.nodes if n.name != node))
        host = hostname()
        was, now = pages.held(rec, host), pages.held_by_plan(plan, host)
        pages.shrink(env.journal(), was, now)
        rec.plan = plan.to_json()
        rec.holdings = holdings_of(plan, {host: read_topology("/").cpu_package()})
        rec.pages = pages.to_record(now)
        images.record(rec, [])
        env.save()
    return errors


def follow(
    store: Store,
    name: str,
    node: tuple[str, str, str],
    to: tuple[str, str] | None,
    progress: Progress = quiet,
) -> str:
    """Point ``node`` (name, ip, mac) at its new host ``to`` (host, fabric address;
    None: this host) in record ``name``'s overlay and the VXLAN link's forwarding
    entries; a line saying what changed."""
    with store.lock():
        rec = store.get(name)
        if not rec.overlay:
            raise HpvcError(f"cluster {name}", "has no network across hosts")
        overlay = Overlay.from_json(rec.overlay)
        was = next((v.address for v in overlay.remotes if node[0] in [n[0] for n in v.nodes]), None)
        remotes = []
        for v in overlay.remotes:
            kept = tuple(n for n in v.nodes if n[0] != node[0])
            if to is not None and v.address == to[1]:
                kept = (*kept, node)
            remotes.append(Vtep(v.host, v.address, kept))
        if to is not None and to[1] not in {v.address for v in remotes}:
            raise HpvcError(f"cluster {name}", f"{to[0]} ({to[1]}) is not one of its hosts")
        vxlan.follow(vxlan.link_name(name), node[2], to[1] if to else None, was)
        rec.overlay = replace(overlay, remotes=tuple(remotes)).to_json()
        store.save(rec)
    where = f"{to[0]} ({to[1]})" if to else "this host"
    progress(f"{name}: {node[0]} ({node[2]}) now at {where}")
    return where
