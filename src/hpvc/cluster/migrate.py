"""``hpvc migrate``: live migration of one node of a running cluster on this host.

Issue 27 (docs/vms.md "Live migration"). Under the cluster's lock, and the
state lock while it books:

1. refuse before anything moves: a cluster that is not running, an unknown
   node, ``--to`` another host (a Slurm job's hosts: ``hpvc node migrate``,
   ``hpvc.cluster.across``), a backend that cannot move it (asked through
   its ``migrate`` module, found by registry name as ``across`` is found:
   architecture rule 3, no branch on the node's kind here), postcopy where
   the target could not take it (the module's ``postcopy_refusal``), a node that does
   not fit (``hpvc.plan.migrate.replan_node``: the node planned like a new
   one, its guest topology kept); all exit 2, the record untouched;
2. book the new place beside the old one (the cluster holds both CPU sets
   and both nodes' pages until the move ends; status ``migrating``), grow
   the hugepage pools it needs (the cluster's journal, as ``scale`` does);
3. the backend moves the guest into a new process (its journal holds the
   target's changes until the switch);
4. after the switch: floating neighbours repinned, pages no longer held
   given back, the plan and the holdings say where the node lives now.
   On any failure, step 2 is undone and the node runs where it was.

Architecture: docs/architecture.md (``cluster/``: the cluster API).
"""

from __future__ import annotations

import copy
import importlib
import os
import time
from collections.abc import Collection
from dataclasses import replace
from types import ModuleType
from typing import Any

from hpvc.backends.base import Backend
from hpvc.backends.vm.migration import MigrationSettings
from hpvc.cluster import pages
from hpvc.cluster.lifecycle import _grow_pages, _union, hostname
from hpvc.cluster.status import open_env
from hpvc.cluster.teardown import waiting
from hpvc.errors import HpvcError, InputError
from hpvc.host import hugepages, reach
from hpvc.plan import Plan
from hpvc.plan.migrate import moved, replan_node
from hpvc.plan.reservations import holdings_of
from hpvc.progress import Progress, quiet
from hpvc.spec import parse_spec
from hpvc.store import ClusterRecord, Store
from hpvc.topology import read_topology


def mover(backend: Backend, what: str) -> ModuleType:
    """The backend's ``migrate`` module, or a one-line refusal."""
    try:
        return importlib.import_module(f"hpvc.backends.{backend.name}.migrate")
    except ModuleNotFoundError:
        raise InputError(
            what,
            f"{backend.name} nodes cannot be live-migrated",
            "only VM nodes of the qemu backend move (docs/vms.md)",
        ) from None


def _without(rec: ClusterRecord, plan: Plan, node: str) -> ClusterRecord:
    """A copy of ``rec`` whose plan lacks ``node`` (its pages stay counted held)."""
    other = copy.copy(rec)
    other.plan = replace(plan, nodes=tuple(n for n in plan.nodes if n.name != node)).to_json()
    return other


def _plus(a: dict[pages.Key, int], b: dict[pages.Key, int]) -> dict[pages.Key, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in set(a) | set(b)}


def migrate(
    name: str,
    node: str,
    *,
    to: str | None = None,
    cpus: Collection[int] | None = None,
    settings: MigrationSettings | None = None,
    store: Store | None = None,
    progress: Progress = quiet,
) -> dict[str, Any]:
    """Move running node ``node`` of cluster ``name`` to a new place on this host
    (``cpus``: confined to those CPUs; neither: re-planned where it may land);
    what moved and what the migration measured."""
    settings = settings or MigrationSettings()
    store = store or Store()
    what = f"hpvc migrate {name} {node}"
    host = hostname()
    if to is not None and to != host:
        raise InputError(
            f"{what} --to {to}",
            f"a cluster of hpvc up lives on this host ({host}) alone",
            "move a node of a Slurm job's cluster between its hosts with hpvc node migrate"
            " (docs/slurm.md)",
        )
    if os.geteuid() != 0:
        raise InputError(what, "needs root (QEMU, taps, hugepages)", "run as root")
    with store.cluster_lock(name, "hpvc migrate", waiting(name, progress)):
        return _locked(store, name, node, cpus, settings, host, what, progress)


def _locked(
    store: Store,
    name: str,
    node: str,
    cpus: Collection[int] | None,
    settings: MigrationSettings,
    host: str,
    what: str,
    progress: Progress,
) -> dict[str, Any]:
    with store.lock():
        rec = store.get(name)
        if rec.status != "running":
            raise InputError(what, f"{name} is {rec.status}", "wait, or hpvc down it")
        old = rec.the_plan()
        if node not in {n.name for n in old.nodes}:
            known = ", ".join(n.name for n in old.nodes)
            raise InputError(what, f"no node {node!r} in {name}", f"one of: {known}")
        if rec.overlay:
            raise InputError(
                what,
                f"{name} is a Slurm job's share of a cluster across hosts",
                "move its nodes with hpvc node migrate (docs/slurm.md)",
            )
        backend, env = open_env(store, rec)
        mod = mover(backend, what)
        why = mod.refusal(backend, env, old, old.node(node))
        if why:
            raise InputError(what, why, "see docs/vms.md, Live migration")
        refused = settings.postcopy and mod.postcopy_refusal(backend, env, old, old.node(node))
        if refused:
            raise InputError(f"{what} --postcopy", *refused)
        spec = parse_spec(rec.spec, rec.spec_path, "site")
        topo = read_topology("/")
        free = pages.unheld(store, topo, host, name, own=_without(rec, old, node))
        new = replan_node(spec, old, node, host, free, store.reservations(exclude=name), cpus)
        was_held = pages.held(rec, host)
        target = replace(new, nodes=(new.node(node),))
        during = _plus(was_held, pages.held_by_plan(target, host))
        cpu_pkg = {host: topo.cpu_package()}
        old_holdings = rec.holdings
        now = holdings_of(new, cpu_pkg)
        rec.holdings = {
            h: _union(rec.holdings.get(h), now.get(h)) for h in set(rec.holdings) | set(now)
        }
        rec.pages = pages.to_record(during)
        rec.status = "migrating"
        store.save(rec)
    backend, env = open_env(store, rec)
    t0 = time.perf_counter()
    grown_before = hugepages.grown(env.journal())
    try:
        _grow_pages(env, new, progress)
        stats = mod.migrate_node(backend, env, old, new, node, settings, progress)
    except BaseException:
        for (host_node, size), n in sorted(hugepages.grown(env.journal()).items()):
            extra = n - grown_before.get((host_node, size), 0)  # what this move grew
            if extra > 0:
                hugepages.give_back(env.journal(), host_node, size, extra)
        rec.holdings, rec.pages, rec.status = old_holdings, pages.to_record(was_held), "running"
        env.save()
        raise
    now_held = pages.held_by_plan(new, host)
    try:
        backend.repin(env, old, new)  # floating neighbours leave CPUs the node now pins
        pages.shrink(env.journal(), during, now_held)
    finally:
        rec.plan = new.to_json()
        rec.holdings = holdings_of(new, cpu_pkg)
        rec.pages = pages.to_record(now_held)
        rec.status = "running"
        env.save()
    was, now_node = old.node(node), new.node(node)
    heard = reach.answers(now_node.ip, new.network.bridge)
    if heard is False:
        progress(
            f"warning: {node} moved but does not answer ping at {now_node.ip}: its guest"
            " network may be broken (docs/vms.md, Live migration under TCG)"
        )
    return {
        "cluster": name,
        "node": node,
        "host": host,
        "moved": moved(old, new, node),
        "from": _place(was),
        "to": _place(now_node),
        "pid": backend.node_pid(env, new, now_node),
        "seconds": round(time.perf_counter() - t0, 3),
        "migration": stats.as_dict(),
        "settings": vars(settings),
        "answers_ping": heard,  # after the switch; None: no ping on this host
    }


def _place(n: Any) -> dict[str, Any]:
    return {
        "cpus": list(n.cpuset),
        "emulator_cpus": list(n.emulator_cpus),
        "numa": [c.host_node for c in n.numa],
    }


def check_settings(**kwargs: Any) -> MigrationSettings:
    """``MigrationSettings`` from the command's options (bad values: InputError)."""
    try:
        return MigrationSettings(**{k: v for k, v in kwargs.items() if v is not None})
    except TypeError as e:  # a programming error, not the user's
        raise HpvcError("migration settings", str(e)) from e
