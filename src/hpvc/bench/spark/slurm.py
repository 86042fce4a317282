"""``hpvc bench spark --slurm`` (issue 31 Figures): TeraSort on a Spark virtual
cluster run as a Slurm job across the three hosts of a private Slurm test
cluster, against native Spark standalone on the same three hosts.

- ``slurm-nfs``: one job (``sbatch -N3``, submitted by an ordinary user) of a
  head and three compute containers, head0 and compute0 on the first host,
  compute1 and compute2 on the others (docs/slurm.md, "Spark and NFS under
  Slurm"); its data on the job's shared directory, NFS from head0 over the
  job's VXLAN network. Each TeraSort step is an ``srun --overlap`` step of
  that job: the driver runs in compute0, as the user.
- ``slurm-bind``: the same job, its data in the site's ``binds=`` folder
  (this machine's disk, as native's): against ``slurm-nfs``, what NFS costs.
- ``native``: the same Spark, JRE and jar as host processes in the three
  hosts' own namespaces (``scripts/slurm/on.sh``): the master and the driver
  on the first host, a worker on each host, on the hosts' fabric addresses;
  its data in a folder all hosts see (this machine's disk, as a cluster file
  system would be); not pinned: every CPU of this machine.
- ``native-pinned``: the same daemons held to the CPUs the job's share on
  each host was given (``bench.spark.pinning``): on a test cluster whose
  hosts share the machine's CPUs, the job has only what Slurm gave it, and
  this is native on the same CPUs (the issue's "on the same three hosts").

Both offer the same workers (one core, ``WORKER_MIB`` each, one whole-worker
executor each, the same driver memory) and stay up for the whole run; every
repetition runs both, the order alternating. The figures are TeraSort's own
sort time (``TERATIME total_s``) and the sort step's wall time; ratios
native/config per repetition (above 1: the virtual cluster is faster).

And the job's time to its first task: ``srun -N3 --hpvc=SPEC hostname`` as a
new job with the Spark spec against the same nodes without ``[shared]`` and
``[spark]``, alternated: what NFS and Spark's daemons add to a job's start.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from hpvc.bench import common
from hpvc.bench.slurm.cluster import SlurmCluster, Submitter, private_slurm
from hpvc.bench.spark import pinning
from hpvc.bench.spark.runner import Runner, native_runner
from hpvc.errors import HpvcError, InputError
from hpvc.image import resolve_image
from hpvc.progress import Progress, quiet
from hpvc.spark import model
from hpvc.spark.native import NativeSpark

CONFIGS = ("native", "native-pinned", "slurm-nfs", "slurm-bind")
DEFAULT_CONFIGS = ("native", "native-pinned", "slurm-nfs")
HOSTS = 3
WORKER_MIB = 1024
NODE_MIB, HEAD_MIB, DRIVER_MIB = 3072, 1024, 512
JOB_MEM = "4G"  # per host: head0 and compute0 on the first
GOAL = 0.95
FABRIC_PREFIX = "10.250."


def spec(nfs_gib: int, services: bool = True) -> str:
    """The job's spec: head and three computes; ``services``: NFS and Spark."""
    extra = (
        f'[shared]\nserver = "nfs"\nsize = "{nfs_gib}GiB"\n'
        f'[spark]\nworker_memory = "{WORKER_MIB}MiB"\n'
        if services
        else ""
    )
    return (
        'name = "bspark"\nkind = "container"\nimage = "spark"\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        f'{extra}[[nodes]]\nrole = "head"\nmemory = "{HEAD_MIB}MiB"\n'
        f'[[nodes]]\nrole = "compute"\ncount = {HOSTS}\nmemory = "{NODE_MIB}MiB"\n'
    )


def submit_line(args: list[str]) -> list[str]:
    """spark-submit of TeraSort ``args`` in compute0, as the README's job does."""
    conf = model.app_conf(HOSTS, 1, WORKER_MIB) | {"spark.local.dir": "/tmp"}
    options = ["--deploy-mode", "client", "--driver-memory", f"{DRIVER_MIB}m"]
    argv = model.submit_argv(
        model.IMAGE_SPARK_HOME, "spark://head0:7077", model.IMAGE_JAR, args, conf,
        model.MAIN_CLASS, options,
    )  # fmt: skip
    return ["env", f"JAVA_HOME={model.IMAGE_JAVA_HOME}", *argv]


class SlurmSpark:
    """The Spark job: up (sleeping step on every host) until ``close``."""

    def __init__(self, cluster: SlurmCluster, user: Submitter, work: Path, spec_path: Path):
        self.cluster, self.user, self.work, self.spec = cluster, user, work, spec_path
        r = cluster.submit(user, ["sbatch", "--parsable", "-N3", f"--mem={JOB_MEM}",
                                  f"--hpvc={spec_path}", "-o", "bench-%j.out", "--wrap",
                                  "srun -N3 --ntasks-per-node=1 sleep 86400"], work)  # fmt: skip
        if r.returncode != 0:
            raise HpvcError("bench spark --slurm: sbatch", r.stderr.strip()[-300:])
        self.job = int(r.stdout.strip().split(";")[0])
        deadline = time.monotonic() + 300
        while len(self._running()) < HOSTS:
            if time.monotonic() > deadline:
                out = work / f"bench-{self.job}.out"
                tail = out.read_text()[-500:] if out.exists() else ""
                self.close()
                raise HpvcError("bench spark --slurm", f"job {self.job} not up: {tail}")
            time.sleep(1)

    def _running(self) -> list[Path]:
        return [
            p
            for h in self.cluster.hosts
            for p in (self.cluster.store(h).root / "jobs").glob(f"j{self.job}-*.join")
        ]

    def terasort(self, rows: int, tag: str, under: str = "/shared") -> dict[str, Any]:
        """gen, sort, validate under ``under`` as the nodes see it: the job's
        NFS directory, or the site's binds folder (this machine's disk)."""
        base = f"{under}/{tag}"
        out: dict[str, Any] = {"steps": {}}
        for step, args in (("gen", ["gen", str(rows), f"{base}/in"]),
                           ("sort", ["sort", f"{base}/in", f"{base}/out"]),
                           ("validate", ["validate", f"{base}/out"])):  # fmt: skip
            t0 = time.perf_counter()
            r = self.step(submit_line(args))
            out[f"{step}_wall_s"] = time.perf_counter() - t0
            if r.returncode != 0:
                tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-5:])
                raise HpvcError(f"slurm terasort {step}", f"exit {r.returncode}: {tail}")
            out["steps"][step] = model.parse_result(r.stdout)
        self.step(["rm", "-rf", base])
        return out

    def step(self, argv: list[str]) -> Any:
        return self.cluster.submit(
            self.user,
            ["srun", f"--jobid={self.job}", f"--hpvc={self.spec}", "--overlap", "-N1", "-n1",
             "-w", self.cluster.hosts[0], *argv],
            self.work, timeout=3600,
        )  # fmt: skip

    def close(self) -> None:
        self.cluster.submit(self.user, ["scancel", str(self.job)], self.work)


def _places(cluster: SlurmCluster) -> list[tuple[str, list[str]]]:
    """(fabric address, command prefix) of each host."""
    out = []
    for h in cluster.hosts:
        words = cluster.run_on(h, ["ip", "-4", "-o", "addr", "show", "eth0"]).split()
        address = next(w.split("/")[0] for w in words if w.startswith(FABRIC_PREFIX))
        out.append((address, cluster.on(h, [])))
    return out


def _image_jar() -> Path:
    """The spark image's own TeraSort jar (the jar the nodes run)."""
    return resolve_image("spark").rootfs / model.IMAGE_JAR.lstrip("/")


def _first_task(cluster: SlurmCluster, user: Submitter, work: Path, spec_path: Path) -> float:
    t0 = time.perf_counter()
    r = cluster.submit(user, ["srun", "-N3", "--ntasks-per-node=1", f"--mem={JOB_MEM}",
                              f"--hpvc={spec_path}", "hostname"], work, timeout=600)  # fmt: skip
    wall = time.perf_counter() - t0
    if r.returncode != 0 or "compute0" not in r.stdout:
        raise HpvcError("bench spark --slurm: first task", (r.stderr or r.stdout)[-300:])
    return wall


def _verdict(result: dict[str, Any], rows: int, config: str) -> None:
    gen = result["steps"]["gen"].get("TERAGEN", {})
    val = result["steps"]["validate"].get("TERAVALIDATE", {})
    if not (val.get("sorted") and val.get("records") == rows == gen.get("records")
            and val.get("checksum") == gen.get("checksum")):  # fmt: skip
        raise HpvcError(f"terasort on {config}", f"did not validate: {val} vs {gen}")


def _samples(config: str, rep: int, size: str, result: dict[str, Any]) -> list[dict[str, Any]]:
    """The step times, and the sort's own phases (TeraSort's TERATIME: the
    executors' start-up, sampling, the sort with its shuffle and output), so
    a gap to native can be placed in a phase."""
    base = {"suite": "spark-slurm", "config": config, "rep": rep, "unit": "s",
            "higher_is_better": False}  # fmt: skip
    steps = result["steps"]
    sort = steps["sort"]["TERATIME"]
    phases = [
        {**base, "metric": f"sort {size}: {key.removesuffix('_s')}", "value": value}
        for key, value in sort.items()
        if key.endswith("_s") and key != "total_s" and isinstance(value, float)
    ]
    return [
        {**base, "metric": f"sort {size}", "value": sort["total_s"]},
        {**base, "metric": f"sort step wall {size}", "value": result["sort_wall_s"]},
        {**base, "metric": f"gen {size}", "value": steps["gen"]["TERATIME"]["total_s"]},
        {**base, "metric": f"validate {size}", "value": steps["validate"]["TERATIME"]["total_s"]},
        *phases,
    ]


def run(
    sizes: list[int],
    repeat: int = 3,
    progress: Progress = quiet,
    user: str = "nobody",
    configs: tuple[str, ...] = DEFAULT_CONFIGS,
    partial: Path | None = None,
) -> dict[str, Any]:
    """The ``configs`` and the first-task figures, ``repeat`` alternated
    repetitions each, jobs submitted by ``user``; results.json's doc (after
    each size so far, into ``partial``)."""
    if repeat < 1:
        raise InputError("--repeat", "must be at least 1", "--repeat 3")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or "native" not in configs or "slurm-nfs" not in configs:
        raise InputError(f"--configs {','.join(configs)!r}", "needs native and slurm-nfs",
                         f"from: {', '.join(CONFIGS)}")  # fmt: skip
    common.require("bench spark --slurm", ["crun", "ganesha.nfsd", "srun"], root=True)
    submitter = Submitter.named(user)
    common.ensure_image("spark", progress)
    facts = common.host_facts(mpi=False)
    tmp = Path(tempfile.mkdtemp(prefix="hpvc-bench-spark-slurm-"))
    os.chmod(tmp, 0o755)
    work = tmp / "work"
    work.mkdir()
    os.chown(work, submitter.uid, submitter.gid)
    nfs_gib = 3 * -(-max(sizes) // (1 << 30)) + 1
    with_services, plain = work / "spark.toml", work / "plain.toml"
    with_services.write_text(spec(nfs_gib))
    plain.write_text(spec(nfs_gib, services=False))
    samples: list[dict[str, Any]] = []
    rootfs = resolve_image("spark").rootfs
    doc: dict[str, Any] = {
        "suite": "spark-slurm",
        "host": facts,
        "configs": list(configs),
        "sizes": [_label(x) for x in sizes],
        "repeat": repeat,
        "hosts": HOSTS,
        "workers": HOSTS,
        "worker_mib": WORKER_MIB,
        "node_mib": NODE_MIB,
        "submitted_by": submitter.name,
        "samples": samples,
        "goal": {"metric": "sort", "config": "slurm-nfs", "median_ratio_at_least": GOAL},
    }
    try:
        site = f"images=hpc,spark binds={work}"
        subnet = common.free_subnets(1)[0]
        with private_slurm(tmp, subnet, progress, extra_args=site) as cluster:
            for rep in range(repeat):
                order = [(with_services, "with NFS and Spark"), (plain, "without")]
                for path, label in order if rep % 2 == 0 else order[::-1]:
                    progress(f"first task rep {rep + 1}/{repeat}: {label}")
                    wall = _first_task(cluster, submitter, work, path)
                    samples.append({"suite": "spark-slurm", "config": label, "rep": rep,
                                    "metric": "srun -N3 hostname, new job", "unit": "s",
                                    "value": wall, "higher_is_better": False})  # fmt: skip
            time.sleep(5)  # the epilogs of the last srun
            native = NativeSpark(tmp / "native", HOSTS, 1, WORKER_MIB,
                                 java=rootfs / "usr/lib/jvm/java-17-openjdk-amd64",
                                 places=_places(cluster), extra_env=cluster.env)  # fmt: skip
            progress(f"native spark on {', '.join(cluster.hosts)}; the job of {HOSTS} hosts")
            job = SlurmSpark(cluster, submitter, work, with_services)
            try:
                cpus = pinning.share_cpus(cluster, job.job)
                doc["share_cpus"] = {h: list(c) for h, c in cpus.items()}
                progress(f"CPUs of the job's shares: {doc['share_cpus']}")
                with native:
                    unpinned = native_runner(
                        native, tmp / "native" / "data", DRIVER_MIB, _image_jar()
                    )
                    held = pinning.place_cpus(cpus, cluster.hosts)

                    def pinned(rows: int, tag: str) -> dict[str, Any]:
                        with pinning.pinned(native, held):
                            return unpinned(rows, tag)

                    runners: dict[str, Runner] = {
                        "native": unpinned,
                        "native-pinned": pinned,
                        "slurm-nfs": job.terasort,
                        "slurm-bind": lambda r, t: job.terasort(r, t, str(work)),
                    }
                    for size in sizes:
                        rows, label = model.rows_for(size), _label(size)
                        for rep in range(repeat):
                            shift = rep % len(configs)
                            for config in configs[shift:] + configs[:shift]:
                                progress(f"{label} rep {rep + 1}/{repeat}: {config}")
                                result = runners[config](rows, f"r{rep}")
                                _verdict(result, rows, config)
                                samples += _samples(config, rep, label, result)
                        if partial is not None:
                            partial.parent.mkdir(parents=True, exist_ok=True)
                            partial.write_text(json.dumps(doc, indent=2) + "\n")
            finally:
                job.close()
            left = _wait_swept(cluster)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if left:
        raise HpvcError("bench spark --slurm", f"shares left after the runs: {left}", "")
    return doc


def _wait_swept(cluster: SlurmCluster, timeout: float = 120) -> list[tuple[str, str]]:
    """After the last job: its epilogs first, then whatever is left taken down."""
    deadline = time.monotonic() + timeout
    while cluster.shares() and time.monotonic() < deadline:
        time.sleep(1)
    return cluster.sweep(cluster.env["HPVC_BIN"])


def _label(size: int) -> str:
    gib, mib = 1 << 30, 1 << 20
    return f"{size // gib}GiB" if size % gib == 0 else f"{size // mib}MiB"
