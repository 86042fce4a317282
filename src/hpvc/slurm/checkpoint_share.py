"""One host's side of a Slurm job's checkpoint (docs/checkpoint.md "Under Slurm"):
its share's part of the cut, and its share restored when Slurm requeues the job.

``serve`` is ``hpvc node checkpoint-share``, started on every host of the job by
``hpvc node checkpoint`` (``hpvc.slurm.checkpoint``) and spoken to line by line:
it finds the job's share on this host and checks it (``hpvc.cluster.checkpoint.Cut``:
a container share needs ``locality = "none"``, as ``hpvc checkpoint`` does),
says ``ready <index> <nodes>``, then freezes on ``freeze``, saves on ``save``,
thaws on ``thaw`` or takes the share down on ``stop``, and says ``done``. It
holds the job's lock and the share's lock throughout, so no ``node up``,
``node down`` or ``node migrate`` of the job on this host runs in between.
Anything else, its stdin ending (the coordinator or its link gone) or no word
within ``WAIT_S``, aborts: the share is thawed and its folder removed.

``restore`` runs inside ``hpvc node up`` (``hpvc.slurm.node.up``) when a
requeued job's share comes up (Slurm's restart count above 0) and the site
keeps checkpoints: share *i* of the job's newest complete cut is restored on
this host, wherever the new allocation put it, planned for this host as
``node up`` plans a share (the job's CPUs here; same names, addresses and
MACs; VXLAN to the job's new hosts), and the job's other hosts' shares are
waited for before any node runs again (``barrier``), as one host's restore
thaws all its nodes at once. No complete cut: the share boots fresh.
"""

from __future__ import annotations

import json
import os
import select
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpvc.cluster import checkpoint_format as cf
from hpvc.cluster.checkpoint import Cut
from hpvc.cluster.lifecycle import Planner
from hpvc.cluster.restore import _guest_shape, restore_part
from hpvc.cluster.teardown import waiting
from hpvc.errors import HpvcError, InputError
from hpvc.plan import Plan
from hpvc.plan.addresses import bridge_name
from hpvc.plan.model import Reservations
from hpvc.progress import Progress, quiet
from hpvc.slurm import checkpoint as jck
from hpvc.slurm import node
from hpvc.slurm.policy import Site, hosts_text, job_user, parse_share_name, share_name
from hpvc.slurm.shares import share_planner
from hpvc.spec import Spec
from hpvc.store import ClusterRecord, Store
from hpvc.topology.model import Topology

WAIT_S = 900.0  # the longest wait for the coordinator's next word
BARRIER_S = 120.0  # the longest wait for the job's other hosts' restored shares


class Lines:
    """Words from a file descriptor, one a line, with a timeout (``select``)."""

    def __init__(self, fd: int = 0) -> None:
        self.fd, self.buf = fd, b""

    def __call__(self, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 4096)
            if not chunk:
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode(errors="replace").strip()


def _say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def serve(
    store: Store,
    job: int,
    cut_dir: Path,
    read: Callable[[float], str | None] | None = None,
    say: Callable[[str], None] = _say,
    progress: Progress = quiet,
) -> None:
    """This host's share's part of the cut into ``cut_dir/share-<index>``."""
    read = read or Lines()
    if not cut_dir.is_dir():
        raise InputError(
            f"--dir {cut_dir}",
            "no such folder on this host",
            "the job's checkpoints must be on storage every host sees",
        )
    if not node.job_shares(store, job):  # checked before the job's lock file is made
        raise InputError(f"job {job}", "has no hpvc share on this host",
                         "checkpoint a job submitted with --hpvc, on its hosts")  # fmt: skip
    with node.job_lock(store, job):
        names = [n for n in node.job_shares(store, job) if store.load(n) is not None]
        if not names:
            raise InputError(
                f"job {job}",
                "has no hpvc share on this host",
                "checkpoint a job submitted with --hpvc, on its hosts",
            )
        name = names[0]
        index = (parse_share_name(name) or (job, 0))[1]
        with store.cluster_lock(name, "hpvc node checkpoint", waiting(name, progress)):
            cut = Cut(store, name, cut_dir / f"share-{index}", progress)
            try:
                say(f"ready {index} {','.join(cut.names)}")
                _expect(read, "freeze")
                cut.freeze()
                say("frozen")
                _expect(read, "save")
                cut.save()
                say("saved")
                word = _expect(read, "thaw", "stop")
                m = cut.finish(stop=word == "stop")
            except BaseException:
                cut.abort()
                raise
            if word == "stop":
                for cached in node.jobs_dir(store).glob(f"{name}.*.join"):
                    cached.unlink(missing_ok=True)
    say("done " + json.dumps({"share": name, "size": m.size(), "frozen_s": m.frozen_s}))


def _expect(read: Callable[[float], str | None], *words: str) -> str:
    got = read(WAIT_S)
    if got not in words:
        why = "the coordinator went away" if got is None else f"got {got!r}"
        raise HpvcError("checkpoint share", f"{why} before {words[0]!r}; cut abandoned")
    return got


# ---- restore when Slurm requeues the job ---------------------------------------------


def restore(
    store: Store,
    spec: Spec,
    doc: dict[str, Any],
    req: node.Request,
    share: list[str],
    cpus: set[int] | None,
    site: Site,
    progress: Progress = quiet,
) -> bool:
    """Restore this host's share of a requeued job from its newest complete cut;
    False (nothing done) when the job is not requeued or has none."""
    if req.restarts < 1 or not site.checkpoints:
        return False
    cut = jck.latest(jck.job_dir(site.checkpoints, req.job))
    if cut is None:
        return False
    jm = jck.read_job(cut)
    fix = f"requeue it on {len(jm.shares)} host(s), or remove {cut} to start afresh"
    if len(jm.shares) != req.hosts:
        raise InputError(
            f"checkpoint {cut}",
            f"has {len(jm.shares)} share(s), the job now {req.hosts} host(s)",
            fix,
        )
    entry = jm.shares[req.index]
    if sorted(entry.nodes) != sorted(share):
        raise InputError(
            f"checkpoint {cut}",
            f"share {req.index} holds {', '.join(entry.nodes)},"
            f" the job's spec puts {', '.join(share)} there",
            fix,
        )
    src = cut / entry.dir
    m = cf.read_manifest(src)
    progress(f"share {req.index} of job {req.job}: restoring from {cut.name}")
    name = share_name(req.job, req.index)
    part = spec.model_copy(update={"name": name})
    overlay = node._overlay(spec, req)
    base = share_planner(part, bridge_name(f"j{req.job}"), share, cpus, overlay)

    def setup(rec: ClusterRecord) -> None:  # what up_spec sets for a share
        rec.overlay = overlay.to_json() if overlay is not None else None
        rec.binds = list(site.binds)
        rec.tenant = True
        rec.console_mib = site.limits.max_console_mib
        rec.user = job_user(req.uid, req.gid)

    restore_part(
        src,
        m,
        part,
        doc,
        f"slurm job {req.job}",
        keep_places(base, m),
        store,
        progress,
        before_thaw=lambda: barrier(cut, req, progress),
        setup=setup,
        hosts=hosts_text(spec, req.job),
    )
    (node.jobs_dir(store) / f"{name}.restored").touch()  # its tasks get HPVC_RESTORED=1
    return True


def keep_places(base: Planner, m: cf.Manifest) -> Planner:
    """``base``'s plan with the saved addresses and MACs, refused when a node's
    guest shape or the subnet would differ from the saved ones."""
    from hpvc.plan.model import plan_from_json

    old = {n.name: n for n in plan_from_json(m.plan).nodes}

    def planner(spec: Spec, host: str, topo: Topology, res: Reservations) -> Plan:
        plan = base(spec, host, topo, res)
        if plan.network.subnet != m.subnet:
            raise InputError(
                f"checkpoint of {m.cluster}",
                f"was taken on {m.subnet}, the job now has {plan.network.subnet}",
                "keep the site's subnets",
            )
        nodes = []
        for n in plan.nodes:
            was = old.get(n.name)
            if was is not None and _guest_shape(was) != _guest_shape(n):
                raise InputError(
                    f"node {n.name}",
                    f"this host gives it {_guest_shape(n)}, it was saved with {_guest_shape(was)}",
                    "requeue onto alike hosts",
                )
            entry = m.node(n.name)
            nodes.append(replace(n, ip=entry.ip, mac=entry.mac))
        return replace(plan, nodes=tuple(nodes))

    return planner


def barrier(cut: Path, req: node.Request, progress: Progress, wait_s: float = BARRIER_S) -> None:
    """Say this host's share is loaded (still frozen) and wait for the job's other
    hosts' (files ``restored/<restart count>.<index>`` in the cut's folder, which
    every host sees), so no restored node talks to a node of another host not yet
    restored (its kernel would answer with a reset). Past ``wait_s`` (a first step
    after the requeue that does not span every host) the share runs on anyway."""
    d = cut / "restored"
    d.mkdir(mode=0o700, exist_ok=True)
    (d / f"{req.restarts}.{req.index}").write_text(req.nodelist + "\n")
    want = [d / f"{req.restarts}.{i}" for i in range(req.hosts)]
    deadline = time.monotonic() + wait_s
    while not all(p.exists() for p in want):
        if time.monotonic() > deadline:
            missing = [p.name.split(".")[1] for p in want if not p.exists()]
            progress(
                f"job {req.job}: shares {', '.join(missing)} not restored after"
                f" {wait_s:.0f} s; this host's runs on"
            )
            return
        time.sleep(0.2)


def restorable(site: Site, job: int) -> Path | None:
    """The cut a requeued job's shares would come back from (None: they boot fresh)."""
    return jck.latest(jck.job_dir(site.checkpoints, job)) if site.checkpoints else None
