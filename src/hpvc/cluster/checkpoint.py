"""``hpvc checkpoint``: one consistent cut of a whole cluster, as files (docs/checkpoint.md).

Under the cluster's lock (no up, scale, restart or down meanwhile): every node
is frozen first (``Backend.freeze``: VMs' vCPUs stopped, containers' cgroups
frozen), then each is saved into ``DIR/nodes/<node>/`` (``Backend.save``),
then all are thawed together, or, with ``stop``, the cluster is taken down
while still frozen. Only after the nodes run again are the files hashed and
``manifest.json`` written (``hpvc.cluster.checkpoint_format``): a folder
without it never finished, and ``restore`` refuses it.

Why the cut is consistent and no message between nodes is lost: no node runs
between the first freeze and the last save, so every node's state is taken at
one instant of the cluster's own time (nothing inside any node happens in
between). A frame in flight at that instant (in a tap, the bridge, a veth)
is not saved and may be dropped; its sender's saved TCP state still holds the
data unacknowledged, so the sender's kernel sends it again after restore (and
the receiver's saved state has not acknowledged what it did not get).

The frozen nodes are saved side by side (``save_all``: one thread per node, as
many at once as the host has CPUs): the cut is fixed by the freeze, not by the
order of the saves, and the job's pause is the longest save's instead of
their sum (a CRIU dump or a QEMU migration to a file is a process of its own;
the threads only wait on them).

A failure while saving removes the partial folder and thaws every node (the
cluster runs on as before); the error says which node failed.
"""

from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from hpvc.backends.base import Backend, ClusterEnv, no_checkpoint
from hpvc.cluster import checkpoint_format as cf
from hpvc.cluster.status import open_env
from hpvc.cluster.teardown import _down_locked, waiting
from hpvc.errors import HpvcError, InputError, require_root
from hpvc.paths import private_dir
from hpvc.plan import Plan
from hpvc.progress import Progress, quiet
from hpvc.store import Store

CHECKPOINTS = "checkpoints"  # under the state folder: where checkpoints go by default


def default_root(store: Store) -> Path:
    return store.root / CHECKPOINTS


def checkpoint(
    name: str,
    out: Path | None = None,
    *,
    stop: bool = False,
    store: Store | None = None,
    progress: Progress = quiet,
) -> tuple[Path, cf.Manifest]:
    """Checkpoint the running cluster ``name`` into ``out`` (default:
    ``<state>/checkpoints/<name>-<UTC time>``); with ``stop``, take it down after."""
    require_root("hpvc checkpoint")
    store = store or Store()
    with store.cluster_lock(name, "hpvc checkpoint", waiting(name, progress)):
        return _locked(store, name, out, stop, progress)


def _refuse(store: Store, name: str, across: bool = False) -> tuple[Backend, ClusterEnv, Plan]:
    """What cannot be checkpointed, in one line before anything is frozen
    (``across``: a share of a cut taken across hosts, ``Cut``, may span hosts)."""
    rec = store.get(name)
    if rec.status != "running":
        raise InputError(f"cluster {name!r}", f"is {rec.status}", f"see hpvc status {name}")
    backend, env = open_env(store, rec)
    if not backend.capabilities.checkpoint:
        raise no_checkpoint(backend.name)
    if rec.overlay and not across:
        raise InputError(
            f"checkpoint {name}",
            "a cluster across hosts (a Slurm job's share) is not checkpointed yet",
            "checkpoint a cluster of one host (docs/checkpoint.md)",
        )
    if rec.binds:
        raise InputError(
            f"checkpoint {name}",
            "its nodes bind the site's host folders, whose state is not the cluster's",
            "checkpoint a cluster without site binds",
        )
    plan = rec.the_plan()
    for n in plan.nodes:
        state = backend.node_state(env, plan, n)
        if state != "running":
            raise InputError(f"node {n.name}", f"is {state}", f"hpvc restart {name} first")
    backend.refuse_checkpoint(env, plan)
    return backend, env, plan


def _destination(store: Store, name: str, out: Path | None) -> Path:
    if out is None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        out = default_root(store) / f"{name}-{stamp}"
    out = out.absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(f"checkpoint folder {out}", "exists and is not empty",
                         "give --out a new or empty folder")  # fmt: skip
    return out


def _locked(
    store: Store, name: str, out: Path | None, stop: bool, progress: Progress
) -> tuple[Path, cf.Manifest]:
    backend, env, plan = _refuse(store, name)
    dest = _destination(store, name, out)
    names = [n.name for n in plan.nodes]
    made = not dest.exists()
    private_dir(dest)  # it holds the cluster's keys and its guests' memory: root's alone
    progress(f"freezing {len(names)} node(s)")
    created = time.time()
    t0 = time.perf_counter()
    backend.freeze(env, plan, names)
    try:
        extras = save_all(backend, env, plan, names, dest, progress)
    except BaseException as e:
        progress(f"checkpoint failed ({e}); removing {dest}, thawing the nodes")
        _remove_partial(dest, made)
        try:
            backend.thaw(env, plan, names)
        except HpvcError as thaw:
            raise HpvcError(f"checkpoint {name}", f"{e}; and thaw failed: {thaw.why}",
                            f"hpvc down {name}") from e  # fmt: skip
        raise
    if stop:
        progress(f"taking {name} down (--stop)")
        _down_locked(store, name, progress)
    else:
        backend.thaw(env, plan, names)
    frozen_s = time.perf_counter() - t0
    progress(f"nodes frozen {frozen_s:.2f} s; hashing the files")
    m = cf.Manifest(
        cluster=name,
        created=created,
        spec=env.rec.spec,
        spec_text=_spec_text(env.rec.spec_path),
        plan=env.rec.plan,
        subnet=plan.network.subnet,
        nodes=_entries(env, plan, backend, dest, names, extras),
        frozen_s=frozen_s,
        stopped=stop,
    )
    cf.write_manifest(dest, m)
    return dest, m


def save_all(
    backend: Backend, env: ClusterEnv, plan: Plan, names: list[str], dest: Path,
    progress: Progress,
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Save the frozen nodes into ``dest/nodes/<node>/`` side by side; what each
    save returned, by node. Every save has ended when this returns or raises
    (the caller may then remove ``dest``); the first failure is raised, with its
    node's name."""
    dirs = {n: private_dir(dest / cf.NODES / n) for n in names}
    workers = max(1, min(len(names), os.cpu_count() or 1))
    with ThreadPoolExecutor(workers, thread_name_prefix="hpvc-save") as pool:
        futures = {n: pool.submit(backend.save, env, plan, n, dirs[n], progress) for n in names}
        try:
            wait(futures.values())
        except BaseException:  # Ctrl-C: no new save starts; the running ones end first
            for f in futures.values():
                f.cancel()
            raise
    for n, f in futures.items():
        e = f.exception()
        if e is not None:
            if isinstance(e, HpvcError) or not isinstance(e, Exception):
                raise e
            raise HpvcError(f"checkpoint of node {n}", f"{type(e).__name__}: {e}") from e
    return {n: f.result() for n, f in futures.items()}


def _entries(
    env: ClusterEnv, plan: Plan, backend: Backend, dest: Path, names: list[str],
    extras: dict[str, dict[str, Any]],
) -> tuple[cf.NodeEntry, ...]:  # fmt: skip
    """Each node's manifest entry; every node's files hashed in one go, so the
    hashes run side by side across nodes (``checkpoint_format.sha256_all``)."""
    rels = {n: [f"{cf.NODES}/{n}/{f}" for f in extras[n].get("files", [])] for n in names}
    described = iter(cf.describe(dest, [r for n in names for r in rels[n]]))
    out = []
    for name in names:
        node = plan.node(name)
        out.append(cf.NodeEntry(
            name=name,
            kind=backend.kind,
            backend=backend.name,
            image_digest=env.rec.images.get(name, ""),
            ip=node.ip,
            mac=node.mac,
            files=tuple(next(described) for _ in rels[name]),
            extra={k: v for k, v in extras[name].items() if k != "files"},
        ))  # fmt: skip
    return tuple(out)


def _spec_text(path: str) -> str:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return ""


def _remove_partial(dest: Path, made: bool) -> None:
    if made:
        shutil.rmtree(dest, ignore_errors=True)
    else:  # an empty folder the user gave: empty it again
        for p in dest.iterdir():
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


class Cut:
    """This host's part of one cut taken across hosts (a Slurm job's share:
    ``hpvc.slurm.checkpoint_share``): ``checkpoint``'s own steps, one call
    each, so that the caller freezes every host's part before any host saves
    (``freeze``, ``save``, then ``finish``; ``abort`` at any point thaws and
    removes the partial folder). The caller holds the cluster's lock."""

    def __init__(self, store: Store, name: str, out: Path, progress: Progress = quiet) -> None:
        self.store, self.name, self.progress = store, name, progress
        self.backend, self.env, self.plan = _refuse(store, name, across=True)
        self.dest = _destination(store, name, out)
        self.names = [n.name for n in self.plan.nodes]
        self.made = not self.dest.exists()
        self.frozen = False
        self.extras: dict[str, dict[str, Any]] = {}
        self.created, self.t0 = 0.0, 0.0

    def freeze(self) -> None:
        private_dir(self.dest)
        self.created, self.t0 = time.time(), time.perf_counter()
        self.frozen = True  # a freeze failing half-way is thawed by abort
        self.backend.freeze(self.env, self.plan, self.names)

    def save(self) -> None:
        self.extras = save_all(
            self.backend, self.env, self.plan, self.names, self.dest, self.progress
        )

    def finish(self, stop: bool) -> cf.Manifest:
        if stop:
            _down_locked(self.store, self.name, self.progress)
        else:
            self.backend.thaw(self.env, self.plan, self.names)
        self.frozen = False
        env, plan = self.env, self.plan
        m = cf.Manifest(
            cluster=self.name,
            created=self.created,
            spec=env.rec.spec,
            spec_text=_spec_text(env.rec.spec_path),
            plan=env.rec.plan,
            subnet=plan.network.subnet,
            nodes=_entries(env, plan, self.backend, self.dest, self.names, self.extras),
            frozen_s=time.perf_counter() - self.t0,
            stopped=stop,
        )
        cf.write_manifest(self.dest, m)
        return m

    def abort(self) -> None:
        _remove_partial(self.dest, self.made)
        if self.frozen:
            self.frozen = False
            self.backend.thaw(self.env, self.plan, self.names)


# --- the files a user keeps ------------------------------------------------------------


def listing(dirs: list[Path], store: Store | None = None) -> list[dict[str, Any]]:
    """One row per checkpoint in ``dirs`` (a checkpoint's folder, or a folder of
    them; none given: the state folder's); folders that are not one are skipped."""
    store = store or Store()
    roots = dirs or [default_root(store)]
    found: list[Path] = []
    for d in roots:
        if (d / cf.MANIFEST).exists():
            found.append(d)
        elif d.is_dir():
            found += sorted(p for p in d.iterdir() if (p / cf.MANIFEST).exists())
        elif dirs:
            raise InputError(f"checkpoint folder {d}", "no such folder", "hpvc checkpoint ls")
    rows = []
    for d in found:
        try:
            rows.append(summary(d, cf.read_manifest(d, check_version=False)))
        except InputError as e:
            rows.append({"dir": str(d), "error": e.why})
    return rows


def summary(d: Path, m: cf.Manifest) -> dict[str, Any]:
    """What ``ls`` and ``show`` print of one checkpoint."""
    return {
        "dir": str(d),
        "cluster": m.cluster,
        "created": m.created,
        "size": m.size(),
        "nodes": [
            {
                "name": n.name,
                "kind": n.kind,
                "backend": n.backend,
                "image_digest": n.image_digest,
                "ip": n.ip,
                "size": n.size(),
            }
            for n in m.nodes
        ],
        "subnet": m.subnet,
        "frozen_s": m.frozen_s,
        "stopped": m.stopped,
        "hpvc_version": m.hpvc_version,
        "arch": m.arch,
    }


def remove(d: Path) -> None:
    """Remove a checkpoint's folder (only a folder that is one: it has a manifest)."""
    d = d.absolute()
    if not (d / cf.MANIFEST).exists() and not (d / cf.NODES).is_dir():
        raise InputError(f"checkpoint {d}", "is not a checkpoint (no manifest.json, no nodes/)",
                         "give a folder hpvc checkpoint ls lists")  # fmt: skip
    require_root("hpvc checkpoint rm")
    shutil.rmtree(d)
