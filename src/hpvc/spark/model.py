"""What is the same for Spark on the host and in a virtual cluster; pure, no I/O.

How much of a node a worker offers, the command lines of the master, the
workers and spark-submit, the TeraSort result lines, and the master's JSON
status. ``hpvc.spark.native`` runs these on the host; a virtual cluster runs
the same argv inside its nodes (Spark at ``/opt/spark``, the jar at
``/opt/hpvc/terasort.jar`` in the ``spark`` image).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Any

from hpvc.errors import InputError

MAIN_CLASS = "hpvc.terasort.TeraSort"
RECORD_BYTES = 100
# Where the pieces are in the spark image.
IMAGE_SPARK_HOME = "/opt/spark"
IMAGE_JAVA_HOME = "/usr/lib/jvm/java-17-openjdk-amd64"  # Debian's openjdk-17 in the image
IMAGE_JAR = "/opt/hpvc/terasort.jar"
# The master's and workers' JVMs (not the driver's or executors'): C1 only.
# They keep bookkeeping, not per-record work, so C2's code is not missed, and
# their start costs half the CPU (2.3-2.9 s against 1.4 s for a master here);
# under TCG, where every JIT-compiled byte is translated again, that is most
# of a VM node's Spark start. Native Spark in the benchmarks gets the same.
DAEMON_JAVA_OPTS = "-XX:TieredStopAtLevel=1"


def master_url(host: str, port: int) -> str:
    return f"spark://{host}:{port}"


def _class_argv(spark_home: str | PurePath, cls: str) -> list[str]:
    return [str(PurePath(spark_home) / "bin" / "spark-class"), cls]


def master_argv(spark_home: str | PurePath, host: str, port: int, ui_port: int) -> list[str]:
    """The standalone master in the foreground (``spark-class`` execs java: its PID is java's)."""
    argv = _class_argv(spark_home, "org.apache.spark.deploy.master.Master")
    return [*argv, "--host", host, "--port", str(port), "--webui-port", str(ui_port)]


def worker_argv(
    spark_home: str | PurePath,
    master: str,
    *,
    host: str,
    cores: int,
    memory_mib: int,
    work_dir: str | PurePath,
    port: int = 0,
    ui_port: int = 0,
) -> list[str]:
    """One worker offering ``cores`` and ``memory_mib`` to ``master`` (port 0: any)."""
    if cores < 1 or memory_mib < 1:
        raise InputError("spark worker", f"cores={cores} memory={memory_mib} MiB", "both >= 1")
    argv = _class_argv(spark_home, "org.apache.spark.deploy.worker.Worker")
    argv += ["--host", host, "--port", str(port), "--webui-port", str(ui_port)]
    argv += ["--cores", str(cores), "--memory", f"{memory_mib}M", "--work-dir", str(work_dir)]
    return [*argv, master]


def app_conf(workers: int, cores: int, memory_mib: int) -> dict[str, str]:
    """One executor per worker taking the whole worker (its cores, its memory as
    heap), and the application waiting for all of them before its first job, so
    the timings TeraSort prints measure work, not executors starting."""
    return {
        "spark.executor.cores": str(cores),
        "spark.executor.memory": f"{memory_mib}m",
        "spark.cores.max": str(workers * cores),
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
    }


def submit_argv(
    spark_home: str | PurePath,
    master: str,
    jar: str | PurePath,
    args: Sequence[str],
    conf: Mapping[str, str] | None = None,
    main_class: str | None = MAIN_CLASS,
    options: Sequence[str] = (),
) -> list[str]:
    """``spark-submit --master M [OPTIONS] [--class C] [--conf k=v ...] JAR ARGS`` (conf
    sorted by key; no --class for an application that names none, e.g. Python)."""
    argv = [str(PurePath(spark_home) / "bin" / "spark-submit"), "--master", master, *options]
    if main_class:
        argv += ["--class", main_class]
    for key, value in sorted((conf or {}).items()):
        if not key.startswith("spark.") or "=" in key or any(c.isspace() for c in key):
            raise InputError(f"spark conf {key!r}", "not a Spark property name", "e.g. spark.x.y")
        argv += ["--conf", f"{key}={value}"]
    return [*argv, str(jar), *args]


_INT_FIELDS = frozenset({"records", "partitions", "samples"})
_TAGS = ("TERAGEN", "TERASORT", "TERAVALIDATE", "TERATIME")


def _value(key: str, text: str) -> Any:
    if key in _INT_FIELDS:
        return int(text)
    if key.endswith("_s"):
        return float(text)
    if key == "sorted":
        if text not in ("true", "false"):
            raise ValueError(f"sorted={text}")
        return text == "true"
    return text


def parse_result(text: str) -> dict[str, dict[str, Any]]:
    """The TERA* lines of TeraSort's output: tag -> fields (the last line of a tag wins).

    Counts are int, ``*_s`` times float, ``sorted`` bool, the rest (checksum in
    hex, cmd, problem) str; everything else in ``text`` (Spark's log) is ignored.

    >>> parse_result("x\\nTERAVALIDATE records=3 checksum=1f sorted=true partitions=1\\n")
    {'TERAVALIDATE': {'records': 3, 'checksum': '1f', 'sorted': True, 'partitions': 1}}
    """
    return dict(_lines(text))


def _lines(text: str) -> list[tuple[str, dict[str, Any]]]:
    """Every TERA* line of ``text``, in order, as (tag, fields)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for line in text.splitlines():
        tag, _, rest = line.strip().partition(" ")
        if tag not in _TAGS:
            continue
        fields: dict[str, Any] = {}
        for token in rest.split():
            key, eq, value = token.partition("=")
            if not eq or not key:
                raise ValueError(f"malformed field {token!r} in {line.strip()!r}")
            fields[key] = _value(key, value)
        out.append((tag, fields))
    return out


_STEP_OF = {"TERAGEN": "gen", "TERASORT": "sort", "TERAVALIDATE": "validate"}


def parse_steps(text: str) -> dict[str, dict[str, dict[str, Any]]]:
    """The output of TeraSort's ``all`` command, one :func:`parse_result` per step.

    Each step prints its result line and a TERATIME line naming it (``cmd=``):
    step (gen, sort, validate) -> tag -> fields. A step that did not run is
    absent.

    >>> parse_steps("TERATIME cmd=gen total_s=1.5\\nTERATIME cmd=sort total_s=2\\n")["sort"]
    {'TERATIME': {'cmd': 'sort', 'total_s': 2.0}}
    """
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for tag, fields in _lines(text):
        step = str(fields.get("cmd")) if tag == "TERATIME" else _STEP_OF[tag]
        out.setdefault(step, {})[tag] = fields
    return out


def workers_alive(master_json: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ALIVE workers in the master's ``/json/`` status (dead ones stay listed as DEAD)."""
    workers = master_json.get("workers") or []
    return [dict(w) for w in workers if isinstance(w, Mapping) and w.get("state") == "ALIVE"]


def rows_for(size_bytes: int) -> int:
    """TeraGen rows for about ``size_bytes`` of data (100-byte records, rounded down)."""
    return size_bytes // RECORD_BYTES
