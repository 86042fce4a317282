"""The pure parts of Spark on a virtual cluster and of ``hpvc bench spark``."""

from __future__ import annotations

import shlex
import subprocess
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from hpvc.backends import registry
from hpvc.backends.base import ClusterEnv
from hpvc.backends.qemu.backend import VmState
from hpvc.bench.spark import report as spark_report
from hpvc.cluster import spark
from hpvc.cluster import spark_jobs as jobs
from hpvc.errors import InputError
from hpvc.plan import Plan, Reservations, plan_cluster
from hpvc.spark import model
from hpvc.spec import parse_spec
from hpvc.spec import spark as sizing
from tests.unit.topogen import make_topology


def spark_plan(**shared: Any) -> Plan:
    spec = parse_spec(
        {
            "name": "sp",
            "image": "spark",
            "tuning": {"pinning": "shared", "hugepages": "none"},
            "shared": shared or {"server": "nfs", "path": "/data"},
            "spark": {"master_port": 7100, "ui_port": 8100},
            "nodes": [
                {"role": "head", "memory": "2GiB"},
                {"role": "compute", "count": 2, "vcpus": 2, "memory": "4GiB"},
            ],
        },
        "t.toml",
    )
    return plan_cluster(spec, [("h", make_topology())], Reservations())


def _line(argv: list[str]) -> str:
    assert argv[:2] == ["/bin/sh", "-c"]
    return argv[2]


def test_master_and_worker_lines_start_in_the_background_with_their_sizes() -> None:
    plan = spark_plan()
    sp = plan.spark
    assert sp is not None
    master = _line(spark.daemon_argv(sp, plan, "head0"))
    assert "org.apache.spark.deploy.master.Master" in master
    assert "--port 7100 --webui-port 8100" in master and master.endswith("&")
    assert "SPARK_LOCAL_IP=10.88.0.2" in master
    assert ">/data/spark/logs/head0.log" in master  # logs on the shared directory
    worker = _line(spark.daemon_argv(sp, plan, "compute1"))
    assert "org.apache.spark.deploy.worker.Worker" in worker
    assert f"--cores 2 --memory {sizing.worker_memory_mib(4096)}M" in worker
    assert worker.split(" >")[0].endswith("spark://10.88.0.2:7100")
    assert "SPARK_LOCAL_IP=10.88.0.4" in worker
    shlex.split(worker)  # a well-formed shell line
    # Both daemons' JVMs C1 only (spark.model.DAEMON_JAVA_OPTS), as native Spark's.
    for line in (master, worker):
        assert "SPARK_DAEMON_JAVA_OPTS=-XX:TieredStopAtLevel=1" in shlex.split(line)


def test_an_image_with_class_archives_starts_the_jvms_directly_with_them(
    tmp_path: Path,
) -> None:
    """hpvc.spark.cds: the archive's class path is explicit (jars by name, as
    recorded at build), not spark-class's ``jars/*`` in listing order."""
    plan = spark_plan()
    sp = plan.spark
    assert sp is not None
    jars = tmp_path / "opt/spark/jars"
    jars.mkdir(parents=True)
    for name in ("z.jar", "spark-core_2.12-3.5.3.jar", "m.jar"):
        (jars / name).write_bytes(b"")
    (tmp_path / "opt/hpvc/cds").mkdir(parents=True)
    (tmp_path / "opt/hpvc/cds/master.jsa").write_bytes(b"x")  # the master's only
    master = shlex.split(_line(spark.daemon_argv(sp, plan, "head0", image_root=tmp_path)))
    java = master.index("/usr/lib/jvm/java-17-openjdk-amd64/bin/java")
    assert master[java + 1 : java + 3] == [
        "-cp", "/opt/spark/conf/:/opt/spark/jars/m.jar:/opt/spark/jars/spark-core_2.12-3.5.3.jar"
        ":/opt/spark/jars/z.jar"
    ]  # fmt: skip
    # What spark-class would export: a worker's launcher needs the Scala version.
    assert "SPARK_SCALA_VERSION=2.12" in master and "SPARK_CONF_DIR=/opt/spark/conf" in master
    assert "-XX:SharedArchiveFile=/opt/hpvc/cds/master.jsa" in master
    assert f"-Xmx{sizing.DAEMON_MEMORY_MIB}m" in master and "-XX:TieredStopAtLevel=1" in master
    cls = master.index("org.apache.spark.deploy.master.Master")
    assert master[cls + 1 : cls + 7] == ["--host", "10.88.0.2", "--port", "7100",
                                         "--webui-port", "8100"]  # fmt: skip
    # No archive of its own: the worker goes through spark-class, as without any.
    worker = shlex.split(_line(spark.daemon_argv(sp, plan, "compute1", image_root=tmp_path)))
    assert "/opt/spark/bin/spark-class" in worker
    assert not [w for w in worker if "SharedArchiveFile" in w]


def test_a_slurm_jobs_daemons_run_as_its_user_known_to_the_node(tmp_path: Path) -> None:
    """ClusterRecord.user (a Slurm share): the daemon drops to the job's user,
    who gets a passwd and group entry once (Hadoop's login needs a name), and
    owns the node-local scratch."""
    plan = spark_plan()
    sp = plan.spark
    assert sp is not None
    user = {"uid": 1234, "gid": 1235, "name": "hpvct1"}
    line = _line(spark.daemon_argv(sp, plan, "compute0", user))
    words = shlex.split(line)
    drop = len(words) - 1 - words[::-1].index("setpriv")  # the last: the daemon's
    assert words[drop : drop + 5] == ["setpriv", "--reuid=1234", "--regid=1235",
                                      "--clear-groups", "--"]  # fmt: skip
    # The user's own shell opens the log (root is squashed on the shared directory).
    assert words[drop + 5 : drop + 7] == ["/bin/sh", "-c"] and words[-1] == "&"
    inner = shlex.split(words[drop + 7])
    assert inner[:2] == ["exec", "env"]
    assert ">/data/spark/logs/compute0.log" in words[drop + 7]
    assert "SPARK_USER=hpvct1" in inner and "HADOOP_USER_NAME=hpvct1" in inner
    assert "chown -R 1234:1235 /var/lib/spark" in line
    assert "setpriv" not in _line(spark.daemon_argv(sp, plan, "compute0"))  # root's clusters
    # The entries' part, run twice against files of the test's own: one entry each.
    passwd, group = tmp_path / "passwd", tmp_path / "group"
    passwd.write_text("root:x:0:0:root:/root:/bin/sh\n")
    group.write_text("root:x:0:\n")
    known = spark._known_line(1234, 1235, "hpvct1").removesuffix("&&")
    known = known.replace("/etc/passwd", str(passwd)).replace("/etc/group", str(group))
    for _ in range(2):
        subprocess.run(["/bin/sh", "-c", known], check=True)
    assert passwd.read_text().splitlines()[1:] == ["hpvct1:x:1234:1235::/var/lib/spark:/bin/sh"]
    assert group.read_text().splitlines()[1:] == ["hpvct1:x:1235:"]
    # A name the passwd file could not hold as it is goes by its uid.
    odd = _line(spark.daemon_argv(sp, plan, "compute0", {**user, "name": "a:b\nc"}))
    assert "SPARK_USER=uid1234" in odd and "a:b" not in odd


def test_submit_runs_in_client_mode_with_event_logs_on_shared() -> None:
    plan = spark_plan()
    line = _line(spark.submit_argv(plan, "/data/app.jar", ["a b", "c"], cls="x.Main",
                                   conf={"spark.foo": "1"}))  # fmt: skip
    words = shlex.split(line.split("&& exec ", 1)[1])
    assert words[words.index("--master") + 1] == "spark://10.88.0.2:7100"
    assert words[words.index("--deploy-mode") + 1] == "client"
    assert words[words.index("--class") + 1] == "x.Main"
    assert "spark.eventLog.dir=file:///data/spark/events" in words
    assert "spark.foo=1" in words
    assert words[-3:] == ["/data/app.jar", "a b", "c"]
    assert words[words.index("--driver-memory") + 1] == f"{sizing.worker_memory_mib(2048)}m"


def test_alive_workers_reads_the_masters_json() -> None:
    doc = {
        "status": "ALIVE",
        "workers": [
            {"host": "10.0.0.3", "cores": 2, "memory": 2944, "state": "ALIVE"},
            {"host": "10.0.0.4", "cores": 2, "memory": 2944, "state": "DEAD"},
        ],
    }
    assert spark.alive_workers(doc) == [{"host": "10.0.0.3", "cores": 2, "memory_mib": 2944}]


def test_job_inputs() -> None:
    assert jobs.resolve_app("terasort", None) == (model.IMAGE_JAR, model.MAIN_CLASS)
    assert jobs.resolve_app("/shared/x.py", None) == ("/shared/x.py", None)
    assert jobs.parse_conf(["spark.a=1", "spark.b=x=y"]) == {"spark.a": "1", "spark.b": "x=y"}
    with pytest.raises(InputError):
        jobs.parse_conf(["a=1"])
    assert jobs.rows_of("64MiB") == 671088
    for bad in ("lots", "50B"):
        with pytest.raises(InputError):
            jobs.rows_of(bad)


def _doc(native: list[float], container: list[float]) -> dict[str, Any]:
    base = {"suite": "spark", "unit": "s", "higher_is_better": False, "metric": "sort 1GiB"}
    nfs = [v * 2 for v in container]
    samples = [
        {**base, "config": config, "rep": rep, "value": v}
        for config, values in (("native", native), ("container", container), ("container-nfs", nfs))
        for rep, v in enumerate(values)
    ]
    return {
        "host": {
            "date": "d",
            "host": "h",
            "cpu_model": "c",
            "cpus": 2,
            "kernel": "k",
            "loadavg_start": [0.5],
        },
        "repeat": len(native),
        "workers": 2,
        "worker_mib": 2944,
        "node_mib": 4096,
        "configs": ["native", "container", "container-nfs"],
        "sizes_gib": [1],
        "samples": samples,
        "goal": {"metric": "sort", "config": "container", "median_ratio_at_least": 0.95},
    }


def test_report_goal_is_paired_per_repetition() -> None:
    met = spark_report.verdicts(_doc([10.0, 20.0, 30.0], [10.0, 21.0, 30.0]))
    assert [(m, ok) for m, ok, _ in met] == [("sort 1GiB", True)]
    missed = spark_report.verdicts(_doc([10.0, 10.0, 10.0], [11.0, 11.0, 11.0]))
    assert missed[0][1] is False and missed[0][2] is not None
    assert missed[0][2]["median"] == pytest.approx(10 / 11)
    md = spark_report.report_md(_doc([10.0, 10.0, 10.0], [11.0, 11.0, 11.0]))
    assert "NOT met" in md and "What NFS costs" in md and "0.500 / 0.500 / 0.500" in md


def test_small_sizes_have_no_goal_and_vm_rows_say_their_accelerator() -> None:
    doc = _doc([10.0, 10.0, 10.0], [10.0, 10.0, 10.0])
    doc.pop("sizes_gib")
    doc["sizes"] = ["16MiB"]
    doc["configs"] = ["native", "container-nfs", "vm"]
    doc["host"]["accelerator"] = {"vm": "tcg", "forced": False, "note": "no usable KVM"}
    small = [dict(r, metric="sort 16MiB") for r in doc["samples"] if r["config"] != "container"]
    vm = [dict(r, config="vm", value=r["value"] * 10) for r in small if r["config"] == "native"]
    doc["samples"] = small + vm
    assert spark_report.goals(doc) == []  # the goal is for 1 GiB and up
    md = spark_report.report_md(doc)
    assert "## VMs: tcg (TCG: software emulation" in md and "None at these sizes" in md
    assert "- sort 16MiB: 0.200 / 0.200 / 0.200" in md  # vm against container-nfs (2x native)


def test_bench_sizes_are_gib_when_bare_else_sizes() -> None:
    from hpvc.bench.spark.runner import size_label
    from hpvc.cli.bench_spark import _sizes

    assert _sizes("1,4") == [1 << 30, 4 << 30]
    assert _sizes("16MiB, 1") == [16 << 20, 1 << 30]
    assert [size_label(s) for s in _sizes("16MiB,2")] == ["16MiB", "2GiB"]
    for bad in ("", "0", "1.5MiB", "100KiB", "lots"):
        with pytest.raises(InputError):
            _sizes(bad)


def test_bench_clusters_offer_native_workers_memory_and_keep_room_for_page_cache() -> None:
    from hpvc.bench.spark.runner import NODE_MIB, WORKER_MIB, spec

    for kind in ("container", "vm"):
        s = parse_spec(tomllib.loads(spec("bs", "10.77.0.0/24", "nfs", 4, kind)), "b.toml")
        p = plan_cluster(s, [("h", make_topology(memory_mib=65536))], Reservations())
        assert p.spark is not None
        assert [w.memory_mib for w in p.spark.workers] == [WORKER_MIB] * 2
        assert all(n.memory_mib == NODE_MIB[kind] for n in p.nodes if n.role == "compute")
    assert NODE_MIB["container"] > WORKER_MIB + 4096  # the rest: the node's page cache


def test_daemons_run_as_the_job_user_where_tasks_do_and_as_root_in_vm_guests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A VM guest's tasks run as root (the guest's root is the job's user), so
    its Spark daemons do too and the driver's files and the executors' agree;
    containers drop to the job's user (Capabilities.job_user_daemons)."""
    plan = spark_plan()
    ran: list[str] = []
    monkeypatch.setattr(spark, "_run", lambda b, e, p, node, argv: ran.append(_line(argv)))
    monkeypatch.setattr(spark, "wait_workers", lambda *a: None)
    user = {"uid": 1234, "gid": 1235, "name": "hpvct1"}
    env = cast(ClusterEnv, SimpleNamespace(rec=SimpleNamespace(user=user), state=VmState()))
    for name, as_user in (("crun", True), ("qemu", False), ("libvirt", False)):
        ran.clear()
        spark.start(registry.get(name), env, plan, [n.name for n in plan.nodes], lambda _m: None)
        assert len(ran) == 3 and all(("--reuid=1234" in line) == as_user for line in ran), name


def test_the_daemons_get_longer_to_come_up_in_vm_guests_under_tcg() -> None:
    """Four TCG guests on a 2-CPU machine had no master answering after 180 s:
    the backends say whether their nodes are emulated (the accelerator ``up``
    chose, kept in the VM state)."""

    def env(accel: str) -> ClusterEnv:
        return cast(ClusterEnv, SimpleNamespace(state=VmState(accel=accel)))

    assert spark.wait_s(registry.get("crun"), env("tcg")) == spark.WAIT_S == 180.0
    for name in ("qemu", "libvirt"):
        assert spark.wait_s(registry.get(name), env("tcg")) == spark.TCG_WAIT_S > spark.WAIT_S
        assert spark.wait_s(registry.get(name), env("kvm")) == spark.WAIT_S
