"""``hpvc node migrate``: a VM node of a running Slurm job moved to another host of the job.

Issue 27 across hosts; docs/slurm.md "Moving a VM node to another host" says
how a site uses it and why it is safe. Run as root on the host the node lives
on (the source), by the site (an administrator draining a host; a drain
script), never by the job's user. The other hosts' hpvc is reached the way the
site already reaches its hosts as root, a command template (``--via``, default
``$HPVC_REMOTE`` or ``ssh -o BatchMode=yes {host}``; the test cluster's is
``scripts/slurm/on.sh {host}``): hpvc adds no listening service of its own.

In order, each step on its own host (``hpvc.cluster.across``):

1. the target (a host of the job's allocation) plans the node as a new node
   of its share: within the CPUs its share has (the job's there), its pages,
   the job's memory there (Slurm's, from ``scontrol show job -d``), the guest
   topology kept, name, address and MAC kept; what does not fit is refused
   there before anything moves (exit 2); else it starts the target QEMU
   listening on its fabric address;
2. the source sends the guest (memory, devices and its writable disk layer)
   over the fabric; a failure or Ctrl-C cancels: the target's QEMU and booking
   are undone over the same channel, the node keeps running here (exit 1);
3. after the switch-over: every host of the job points the node's MAC at the
   target (one ``bridge -batch`` each, the target first), then the source
   stops its old QEMU and gives back its CPUs and pages.

Pure helpers (allocation parsing, the command lines) are unit-tested in
tests/unit/test_slurm_migrate.py. Architecture: docs/architecture.md
(``slurm/``: the Slurm side, through ``cluster/``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from hpvc.cluster import across
from hpvc.cluster.across import MigrationSettings, MigrationStats
from hpvc.errors import DoesNotFit, HpvcError, InputError
from hpvc.plan import Plan, plan_cluster
from hpvc.plan.model import Reservations
from hpvc.plan.overlay import Overlay
from hpvc.progress import Progress, quiet
from hpvc.slurm.node import job_lock, job_shares, jobs_dir
from hpvc.slurm.policy import job_hosts, restrict
from hpvc.spec import Spec
from hpvc.store import Store
from hpvc.topology.model import Topology

DEFAULT_VIA = "ssh -o BatchMode=yes {host}"
REMOTE_TIMEOUT_S = 120.0  # a target QEMU starts in seconds; a 4 GiB guest preallocates


# ---- pure parts ---------------------------------------------------------------------


def allocation_memory(scontrol_text: str) -> dict[str, int]:
    """MiB per host of a job from ``scontrol show job -d`` (its ``Nodes=... Mem=N``
    lines; hosts without a Mem field are left out)."""
    out: dict[str, int] = {}
    for m in re.finditer(r"\bNodes=(\S+)\s+CPU_IDs=\S+\s+Mem=(\d+)", scontrol_text):
        for host in job_hosts(m.group(1)):
            out[host] = int(m.group(2))
    return out


def via_argv(via: str, host: str, argv: Sequence[str]) -> list[str]:
    """The command that runs ``argv`` as root on ``host`` through the site's template."""
    if "{host}" not in via:
        raise InputError(
            f"--via {via!r}", "has no {host}", "e.g. --via 'ssh -o BatchMode=yes {host}'"
        )
    return [*shlex.split(via.replace("{host}", shlex.quote(host))), *argv]


def settings_args(s: MigrationSettings) -> list[str]:
    """The settings as ``hpvc node migrate-in`` options (both sides must agree)."""
    return [f"--bandwidth={s.bandwidth_mib_s}", f"--downtime-ms={s.downtime_ms}",
            f"--multifd={s.multifd}", f"--timeout={s.timeout_s:g}"]  # fmt: skip


def guest_view(node: dict[str, Any]) -> tuple[object, ...]:
    """What a guest sees of its placement (a planned node as JSON): vCPUs and the
    guest cell of each, cells' memory and vCPUs, memory, page size, MAC, address."""
    vcpus = tuple((v["vcpu"], v["guest_node"]) for v in node["vcpus"])
    cells = tuple((c["guest_node"], c["memory_mib"], tuple(c["vcpus"])) for c in node["numa"])
    hp = node.get("hugepages") or {}
    return (vcpus, cells, node["memory_mib"], hp.get("size_kib"), node["mac"], node["ip"])


def placer(node: str, source_view: dict[str, Any]) -> across.Placer:
    """How the target places ``node`` into its share: within the CPUs the share
    has (the job's on this host), the share's nodes kept, then the node's MAC and
    address from the source (``source_view``: the source's planned node as JSON)."""
    ip, mac = str(source_view["ip"]), str(source_view["mac"])

    def place(spec: Spec, host: str, topo: Topology, res: Reservations, old: Plan) -> Plan:
        cpus = {c for n in old.nodes for c in (*n.cpuset, *n.emulator_cpus)}
        mine = restrict(topo, cpus) if cpus else topo
        part = spec.model_copy(update={"name": old.cluster})
        # The node alone, beside what every cluster here holds (the share's own
        # nodes included): the planner takes a share's nodes or a running
        # cluster's, not both at once.
        try:
            one = plan_cluster(part, [(host, mine)], res, only={node})
        except DoesNotFit as e:
            raise DoesNotFit(f"node {node} does not fit on {host}: {e.why}", e.fix) from e
        moved = replace(one.node(node), ip=ip, mac=mac)
        if one.node(node).ip != ip:
            raise HpvcError(f"node {node}", f"its address would change from {ip}")
        # hosts: what the new node needs grown here (the record's pages are
        # counted per node, hpvc.cluster.pages).
        return replace(old, nodes=(*old.nodes, moved), hosts=one.hosts)

    return place


# ---- where things are on this host ---------------------------------------------------


@dataclass(frozen=True)
class Here:
    """The job's share on this host that runs ``node``."""

    share: str
    node: tuple[str, str, str]  # name, ip, mac
    overlay: Overlay


def find(store: Store, job: int, node: str) -> Here:
    for name in job_shares(store, job):
        rec = store.load(name)
        if rec is None:
            continue
        plan = rec.the_plan()
        if node in {n.name for n in plan.nodes}:
            if not rec.overlay:
                raise InputError(
                    f"node {node} of job {job}", "the job runs on one host", "nothing to move to"
                )
            pn = plan.node(node)
            return Here(name, (pn.name, pn.ip, pn.mac), Overlay.from_json(rec.overlay))
    raise InputError(
        f"node {node} of job {job}",
        "does not run on this host",
        "run hpvc node migrate on the host it lives on (hpvc node ls there)",
    )


def share_of(store: Store, job: int) -> str:
    names = [n for n in job_shares(store, job) if store.load(n) is not None]
    if not names:
        raise InputError(f"job {job}", "has no share on this host", "name a host of the job")
    return names[0]


def drop_join_cache(store: Store, share: str) -> None:
    """Later steps on this host ask ``hpvc node up`` again (its nodes changed)."""
    for cached in jobs_dir(store).glob(f"{share}.*.join"):
        cached.unlink(missing_ok=True)


# ---- the target's and every host's steps (run through --via) ------------------------


def receive(store: Store, job: int, node: str, source_view: dict[str, Any],
            settings: MigrationSettings, mem_mib: int, source: str,
            progress: Progress = quiet) -> dict[str, object]:  # fmt: skip
    with job_lock(store, job):
        share = share_of(store, job)
        rec = store.get(share)
        if not rec.overlay:
            raise InputError(f"job {job}", "runs on one host", "")
        local = Overlay.from_json(rec.overlay).local
        if source not in Overlay.from_json(rec.overlay).peers():
            raise InputError(f"--source-address {source}", "not a host of the job", "")
        out = across.receive(store, share, node, placer(node, source_view), settings, local,
                             source, mem_mib, progress,
                             int(source_view.get("ivshmem_mib", 0)))  # fmt: skip
        drop_join_cache(store, share)
        new = store.get(share).the_plan().node(node).to_json()
        if guest_view(new) != guest_view(source_view):
            across.abandon(store, share, node, progress)  # nothing moved yet
            raise DoesNotFit(f"node {node} would not keep its guest topology here",
                             "move it to a host with the same NUMA layout")  # fmt: skip
        return out


def abandon(store: Store, job: int, node: str, progress: Progress = quiet) -> tuple[list[str], str]:
    with job_lock(store, job):
        return across.abandon(store, share_of(store, job), node, progress)


def follow(store: Store, job: int, node: tuple[str, str, str], to: tuple[str, str] | None,
           progress: Progress = quiet) -> str:  # fmt: skip
    with job_lock(store, job):
        return across.follow(store, share_of(store, job), node, to, progress)


# ---- the whole move, from the source ---------------------------------------------------


@dataclass(frozen=True)
class Moved:
    node: str
    source: str
    target: str
    stats: MigrationStats
    followed: dict[str, str]  # host -> where it points the node


class Remote:
    """hpvc on another host of the job, through the site's template."""

    def __init__(self, via: str, hpvc: Sequence[str] | None = None) -> None:
        self.via = via
        self.hpvc = list(hpvc or [sys.executable, "-m", "hpvc"])

    def __call__(self, host: str, *args: str, stdin: str = "") -> str:
        argv = via_argv(self.via, host, [*self.hpvc, "node", *args])
        try:
            r = subprocess.run(argv, input=stdin, capture_output=True, text=True,
                               timeout=REMOTE_TIMEOUT_S, check=False)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as e:
            raise HpvcError(f"hpvc on {host}", f"{argv[0]}: {e}", "check --via") from e
        if r.returncode != 0:
            line = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
            err = InputError if r.returncode == 2 else HpvcError
            raise err(f"on {host}", line.removeprefix("hpvc: "), "")
        return r.stdout


def scontrol_memory(job: int) -> dict[str, int]:
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return {}
    r = subprocess.run([scontrol, "show", "job", "-d", str(job)],
                       capture_output=True, text=True, check=False)  # fmt: skip
    return allocation_memory(r.stdout) if r.returncode == 0 else {}


def migrate(
    job: int,
    node: str,
    target: str,
    settings: MigrationSettings,
    remote: Remote,
    store: Store | None = None,
    progress: Progress = quiet,
) -> Moved:
    store = store or Store()
    if os.geteuid() != 0:
        raise InputError("hpvc node migrate", "needs root", "run it as root on the node's host")
    here = find(store, job, node)
    hosts = {v.host: v.address for v in here.overlay.remotes}
    if target not in hosts:
        raise InputError(
            f"--to {target}",
            f"not another host of job {job} ({', '.join(sorted(hosts)) or 'none'})",
            "name a host of the job's allocation",
        )
    source = next((h for h, a in hosts.items() if a == here.overlay.local), "")
    source = source or os.uname().nodename
    across.check(store, here.share, node)  # what cannot move is refused before anything moves
    mem = scontrol_memory(job).get(target, 0)
    pn = store.get(here.share).the_plan().node(node)
    # The source's region size rides with the node: the target gives it its own.
    view = pn.to_json() | {"ivshmem_mib": across.region_mib(store, here.share, node)}
    progress(f"{node}: planning on {target}")
    got = json.loads(remote(target, "migrate-in", f"--job={job}", f"--node={node}",
                            f"--mem-mib={mem}", f"--source-address={here.overlay.local}",
                            *settings_args(settings),
                            stdin=json.dumps(view)))  # fmt: skip
    uri = str(got["uri"])
    progress(f"{node}: sending to {target} ({uri})")
    try:
        stats = across.send(store, here.share, node, uri, settings, progress)
    except BaseException as e:
        progress(f"{node}: migration stopped; removing the target on {target}")
        said = ""
        try:
            said = remote(target, "migrate-abort", f"--job={job}", f"--node={node}").strip()
        except HpvcError as left:
            progress(f"{node}: the target on {target} may be left: {left}")
        if said and isinstance(e, across.MigrationFailed):
            raise across.MigrationFailed(e.reason, f"{e.why}; the target QEMU said: {said}") from e
        raise
    # The guest runs on the target now: whatever fails below is said, never undone.
    followed, missed = _follow_all(store, job, here, target, hosts, remote, progress)
    with job_lock(store, job):
        errors = across.release(store, here.share, node, progress)
        drop_join_cache(store, here.share)
    if errors:
        raise HpvcError(f"node {node}", f"moved to {target}, but its old QEMU is left: {errors[0]}",
                        f"hpvc node down --job {job} removes it with the job")  # fmt: skip
    if missed:
        raise HpvcError(f"node {node}", f"moved to {target}, but {missed[0]}",
                        "run hpvc node migrate-follow there (docs/slurm.md)")  # fmt: skip
    return Moved(node, source, target, stats, followed)


def _follow_all(
    store: Store,
    job: int,
    here: Here,
    target: str,
    hosts: dict[str, str],
    remote: Remote,
    progress: Progress,
) -> tuple[dict[str, str], list[str]]:
    """Point the node's MAC at ``target`` on every host of the job: the target
    first (its bridge stops sending the node's frames into the VXLAN link), then
    this host, then the others. What each host says, and the hosts that failed."""
    name, ip, mac = here.node
    addr = hosts[target]
    ident = [f"--job={job}", f"--name={name}", f"--ip={ip}", f"--mac={mac}"]
    out: dict[str, str] = {}
    missed: list[str] = []
    steps: list[tuple[str, object]] = [(target, ["--here"])]
    steps.append((here.overlay.local, None))
    steps += [(h, [f"--to={target}", f"--to-address={addr}"]) for h in sorted(hosts) if h != target]
    for host, args in steps:
        try:
            if args is None:
                out[host] = follow(store, job, here.node, (target, addr), progress)
            else:
                out[host] = remote(host, "migrate-follow", *ident, *args).strip()  # type: ignore[misc]
        except HpvcError as e:
            missed.append(f"forwarding on {host} failed: {e.why}")
            progress(f"{name}: {missed[-1]}")
    return out, missed
