"""Spark standalone on a virtual cluster: daemons in the nodes, status, submit.

The head runs the master and every compute node a worker offering all its
vCPUs and most of its memory (``hpvc.plan.services``, ``hpvc.spark.model``). The
daemons run inside the nodes through the backend's own exec (crun exec for
containers), as the node's root, with Debian's JRE and the Spark of the
image (``/opt/spark``, ``hpvc image build spark``). Node-local scratch (shuffle
files, the workers' folders) is in the node's own disk; logs and event logs go
to the shared directory, where the host and every node read them. The daemons
are processes of the nodes: they end with them, so they leave nothing on the
host to undo.

Status comes from the master's own JSON endpoint (``/json/`` on its web UI),
read from the host over the cluster network.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from hpvc.backends.base import Backend, ClusterEnv
from hpvc.errors import HpvcError
from hpvc.plan import Plan
from hpvc.plan.services import DEFAULT_SHARED, SparkPlan
from hpvc.progress import Progress
from hpvc.spark import cds, model
from hpvc.spec import spark as sizing

SPARK_HOME = model.IMAGE_SPARK_HOME
JAVA_HOME = model.IMAGE_JAVA_HOME
SCRATCH = "/var/lib/spark"  # node-local: the node's own disk
WAIT_S = 180.0  # JVMs start slowly on small hosts
# In VM guests under TCG (emulation: no usable KVM) every JVM starts 10-50x
# slower: a Slurm job's four guests on a 2-CPU machine (head0's master and NFS
# server, three workers) had no master answering after 180 s (docs/slurm.md).
TCG_WAIT_S = 900.0


def wait_s(backend: Backend, env: ClusterEnv) -> float:
    """How long the master and its workers may take to come up."""
    return TCG_WAIT_S if backend.emulated(env) else WAIT_S


def spark_dir(plan: Plan) -> str:
    """Logs and event logs, on the shared directory (as the nodes see it)."""
    return f"{(plan.shared or DEFAULT_SHARED).path}/spark"


def _env(sp: SparkPlan, address: str, plan: Plan) -> dict[str, str]:
    return {
        "JAVA_HOME": JAVA_HOME,
        "SPARK_HOME": SPARK_HOME,
        "SPARK_LOCAL_IP": address,
        "SPARK_LOCAL_DIRS": f"{SCRATCH}/local",
        "SPARK_WORKER_DIR": f"{SCRATCH}/work",
        "SPARK_DAEMON_MEMORY": f"{sizing.DAEMON_MEMORY_MIB}m",
        "SPARK_DAEMON_JAVA_OPTS": model.DAEMON_JAVA_OPTS,
        "SPARK_LOG_DIR": f"{spark_dir(plan)}/logs",
        "SPARK_NO_DAEMONIZE": "1",
    }


def daemon_argv(
    sp: SparkPlan,
    plan: Plan,
    node: str,
    user: dict[str, Any] | None = None,
    image_root: Path | None = None,
) -> list[str]:
    """The shell line that starts ``node``'s daemon in the background (master
    on the master node, else a worker) and returns at once. ``user`` (a Slurm
    job's, ``ClusterRecord.user``): the daemon runs as that user, known to the
    node's passwd and group files, with the node-local scratch its own; its
    files on the shared directory are the user's (the export squashes root).
    ``image_root``: the image's root on this host; where it holds the daemons'
    class-data archives (``hpvc.spark.cds``) the JVM is started directly with
    them, else through ``spark-class``."""
    role = "master" if node == sp.master else "worker"
    if role == "master":
        address = sp.address
        argv = model.master_argv(SPARK_HOME, address, sp.port, sp.ui_port)
    else:
        w = next(w for w in sp.workers if w.node == node)
        address = w.address
        argv = model.worker_argv(SPARK_HOME, sp.url, host=address, cores=w.cores,
                                 memory_mib=w.memory_mib, work_dir=f"{SCRATCH}/work",
                                 ui_port=8081)  # fmt: skip
    env = _env(sp, address, plan)
    if image_root is not None and (image_root / cds.archive(role).lstrip("/")).is_file():
        argv = cds.daemon_argv(cds.classpath(image_root), sizing.DAEMON_MEMORY_MIB, argv[1],
                               argv[2:], cds.archive(role))  # fmt: skip
        env |= cds.daemon_env(image_root)
    log = f"{env['SPARK_LOG_DIR']}/{node}.log"
    logs = shlex.quote(env["SPARK_LOG_DIR"])
    setup, drop = f"mkdir -p {SCRATCH}/local {SCRATCH}/work {logs} &&", []
    if user is not None:
        uid, gid, name = _user(user)
        env |= {"HOME": SCRATCH, "USER": name, "SPARK_USER": name, "HADOOP_USER_NAME": name}
        setup = " ".join([
            _known_line(uid, gid, name),
            f"mkdir -p {SCRATCH}/local {SCRATCH}/work && chown -R {uid}:{gid} {SCRATCH} &&",
            f"setpriv --reuid={uid} --regid={gid} --clear-groups -- mkdir -p {logs} &&",
        ])  # fmt: skip
        drop = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
    run = " ".join(
        [
            "env",
            *(shlex.quote(f"{k}={v}") for k, v in env.items()),
            "setsid",
            *map(shlex.quote, argv),
            f">{shlex.quote(log)} 2>&1 </dev/null",
        ]
    )
    if drop:  # the user's shell opens the log: root is squashed on the shared directory
        run = " ".join([*drop, "/bin/sh", "-c", shlex.quote(f"exec {run}")])
    return ["/bin/sh", "-c", f"{setup} {run} &"]


_NAME_RE = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")


def _user(user: dict[str, Any]) -> tuple[int, int, str]:
    uid, gid, name = int(user["uid"]), int(user["gid"]), str(user["name"])
    if not _NAME_RE.fullmatch(name):
        name = f"uid{uid}"  # a name the node's passwd file can hold as it is
    return uid, gid, name


def _known_line(uid: int, gid: int, name: str) -> str:
    """Shell: the job's user in the node's passwd and group files, unless there.
    The JVM's and Hadoop's user lookups (``getpwuid``) fail for a uid with no
    entry ("invalid null input: name"), and the job's tasks in the node are
    the same user."""
    entry = shlex.quote(f"{name}:x:{uid}:{gid}::{SCRATCH}:/bin/sh")
    group = shlex.quote(f"{name}:x:{gid}:")
    return (
        f"{{ cut -d: -f3 /etc/passwd | grep -qx {uid} || echo {entry} >>/etc/passwd; }} &&"
        f" {{ cut -d: -f3 /etc/group | grep -qx {gid} || echo {group} >>/etc/group; }} &&"
    )


def _run(backend: Backend, env: ClusterEnv, plan: Plan, node: str, argv: list[str]) -> None:
    full = backend.exec_argv(env, plan, plan.node(node), argv)
    r = subprocess.run(full, capture_output=True, text=True, check=False, timeout=60)
    if r.returncode != 0:
        raise HpvcError(
            f"spark on {node}", (r.stderr or r.stdout).strip() or f"exit {r.returncode}"
        )


def start(
    backend: Backend, env: ClusterEnv, plan: Plan, names: list[str], progress: Progress
) -> None:
    """Start the daemons of ``names`` (the master first), then wait until the
    master lists every planned worker alive."""
    sp = plan.spark
    if sp is None:
        return
    here = {n.name for n in plan.nodes}
    todo = [n for n in names if n in here and (n == sp.master or _is_worker(sp, n))]
    todo.sort(key=lambda n: n != sp.master)
    # As the job's user, where the nodes' tasks run as that user (not in VM guests).
    user = env.rec.user if backend.capabilities.job_user_daemons else None
    root = _image_root(plan.image)
    for node in todo:
        progress(f"spark: {'master' if node == sp.master else 'worker'} on {node}")
        _run(backend, env, plan, node, daemon_argv(sp, plan, node, user, root))
    # A Slurm share waits for its own workers, at the master on whichever host
    # it runs (reached over the job's network); the master's share for its own.
    mine = {w.node for w in sp.workers if w.node in todo}
    if sp.master in here or mine:
        wait_workers(sp, mine if sp.master not in here else {w.node for w in sp.workers},
                     progress, wait_s(backend, env))  # fmt: skip


def _image_root(image: str) -> Path | None:
    """The image's root on this host (its daemons' class-data archives), if it is here."""
    from hpvc.image import resolve_image  # the image store only when daemons start

    try:
        return resolve_image(image).rootfs
    except HpvcError:
        return None


def _is_worker(sp: SparkPlan, node: str) -> bool:
    return any(w.node == node for w in sp.workers)


def master_json(sp: SparkPlan, timeout_s: float = 2.0) -> dict[str, Any]:
    """The master's own view (its web UI's /json/); HpvcError when it does not answer."""
    try:
        with urllib.request.urlopen(f"{sp.ui}/json/", timeout=timeout_s) as r:
            doc = json.load(r)
    except (OSError, urllib.error.URLError, ValueError) as e:
        raise HpvcError("spark master", f"{sp.ui} does not answer ({e})") from None
    if not isinstance(doc, dict):
        raise HpvcError("spark master", f"{sp.ui}/json/ is not a JSON object")
    return doc


def alive_workers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The ALIVE workers of a master's JSON: host, cores and memory (MiB)."""
    return [
        {"host": w.get("host"), "cores": w.get("cores"), "memory_mib": w.get("memory")}
        for w in doc.get("workers", [])
        if w.get("state") == "ALIVE"
    ]


def wait_workers(
    sp: SparkPlan, nodes: set[str], progress: Progress, limit_s: float = WAIT_S
) -> None:
    want = {w.address for w in sp.workers if w.node in nodes}
    deadline = time.monotonic() + limit_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            alive = {w["host"] for w in alive_workers(master_json(sp))}
            if want <= alive:
                progress(f"spark: master {sp.url}, {len(alive)} worker(s) alive, UI {sp.ui}")
                return
            last = f"{len(want & alive)} of {len(want)} workers alive"
        except HpvcError as e:
            last = e.why
        time.sleep(0.5)
    raise HpvcError(
        "spark", f"not ready after {limit_s:.0f} s: {last}", "see the logs in /shared/spark/logs"
    )


def status(plan: Plan) -> dict[str, Any] | None:
    """What ``hpvc status`` shows of Spark: the master and its live workers."""
    sp = plan.spark
    if sp is None:
        return None
    out: dict[str, Any] = {"master": sp.url, "ui": sp.ui, "planned_workers": len(sp.workers)}
    try:
        doc = master_json(sp)
    except HpvcError as e:
        out["error"] = e.why
        return out
    out["master_status"] = doc.get("status")
    out["workers"] = alive_workers(doc)
    out["applications"] = len(doc.get("activeapps", []))
    return out


def submit_argv(plan: Plan, app: str, args: list[str], *, cls: str | None = None,
                conf: dict[str, str] | None = None) -> list[str]:  # fmt: skip
    """spark-submit in the master node, in client mode, event logs on the shared directory."""
    sp = plan.spark
    assert sp is not None
    head = plan.node(sp.master) if sp.master in {n.name for n in plan.nodes} else None
    try:
        driver_mib = sizing.worker_memory_mib(head.memory_mib if head else 2048)
    except HpvcError:  # a small head: the driver keeps Spark's own default
        driver_mib = 512
    settings = {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": f"file://{spark_dir(plan)}/events",
        "spark.driver.host": sp.address,
        "spark.local.dir": f"{SCRATCH}/local",
        **(conf or {}),
    }
    options = ["--deploy-mode", "client", "--driver-memory", f"{driver_mib}m"]
    argv = model.submit_argv(SPARK_HOME, sp.url, app, args, settings, cls, options)
    line = f"mkdir -p {shlex.quote(spark_dir(plan))}/events && exec env JAVA_HOME={JAVA_HOME} "
    line += " ".join(map(shlex.quote, argv))
    return ["/bin/sh", "-c", line]
