"""Applications on a running Spark virtual cluster: submit, and TeraSort end to end.

spark-submit runs inside the master node (client mode: the driver is the
head's), through the cluster API (``hpvc.cluster.ops.exec_argv``), so it works
for any backend that can exec into a node.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

from hpvc.cluster import ops, spark
from hpvc.errors import HpvcError, InputError
from hpvc.plan import Plan
from hpvc.plan.services import DEFAULT_SHARED
from hpvc.progress import Progress, quiet
from hpvc.spark import model
from hpvc.store import Store
from hpvc.units import parse_size

TERASORT = "terasort"


def spark_plan(name: str, store: Store | None = None) -> Plan:
    """The plan of cluster ``name``; InputError when it is not a Spark cluster."""
    plan = (store or Store()).get(name).the_plan()
    if plan.spark is None:
        raise InputError(
            f"cluster {name!r}", "is not a Spark cluster", "add a [spark] section (docs/spark.md)"
        )
    return plan


def resolve_app(app: str, cls: str | None) -> tuple[str, str | None]:
    """``terasort`` is the image's TeraSort jar and class; anything else as given."""
    if app == TERASORT:
        return model.IMAGE_JAR, cls or model.MAIN_CLASS
    return app, cls


def check_app(name: str, plan: Plan, app: str) -> None:
    """A local application file (an absolute path) must exist on the master node
    before spark-submit runs: else one line with the fix, not Spark's log."""
    if not app.startswith("/") or plan.spark is None:
        return
    argv = ops.exec_argv(name, plan.spark.master, ["test", "-r", app])
    if subprocess.run(argv, capture_output=True, check=False).returncode != 0:
        raise InputError(
            f"spark submit {app}",
            f"no readable file {app} on node {plan.spark.master}",
            f"copy it into the cluster's shared directory ({DEFAULT_SHARED.path} on the nodes) and"
            f" give that path, or run the image's TeraSort: hpvc spark submit {name} terasort",
        )


def parse_conf(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.startswith("spark."):
            raise InputError(f"--conf {item!r}", "is not KEY=VALUE with a spark.* key",
                             "e.g. --conf spark.executor.memory=2g")  # fmt: skip
        out[key] = value
    return out


def host_spark_dir(name: str, store: Store | None = None) -> str:
    """Where the host sees the cluster's Spark logs (its shared directory)."""
    st = ops.status(name, store).get("shared_dir") or {}
    base = st.get("backing") or st.get("host")
    return f"{base}/spark" if base else "(no shared directory on this host)"


def rows_of(size: str) -> int:
    try:
        rows = model.rows_for(parse_size(size))
    except ValueError:
        raise InputError(f"--size {size!r}", "is not a size", "e.g. 64MiB or 1GiB") from None
    if rows < 1:
        raise InputError(f"--size {size!r}", "is under one 100-byte record", "e.g. 64MiB")
    return rows


def _submit(name: str, plan: Plan, args: list[str], store: Store | None) -> tuple[str, float]:
    sp = plan.spark
    assert sp is not None
    conf = model.app_conf(len(sp.workers), sp.workers[0].cores, sp.workers[0].memory_mib)
    argv = spark.submit_argv(plan, model.IMAGE_JAR, args, cls=model.MAIN_CLASS, conf=conf)
    t0 = time.perf_counter()
    r = subprocess.run(ops.exec_argv(name, sp.master, argv, store), capture_output=True,
                       text=True, check=False)  # fmt: skip
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-5:])
        raise HpvcError(f"terasort {args[0]} on {name}", f"exit {r.returncode}: {tail}")
    return r.stdout, seconds


def terasort(
    name: str,
    rows: int,
    directory: str | None = None,
    store: Store | None = None,
    progress: Progress = quiet,
    separate: bool = False,
) -> dict[str, Any]:
    """TeraGen ``rows`` records, sort them, validate: timings and the verdict.

    One application runs the three steps (TeraSort's ``all``: Spark's driver
    and executors start once, seconds natively and tens under emulation);
    ``separate`` submits one application per step, as the benchmarks do to
    time each step's wall clock with its start (``{step}_wall_s``).
    ``{step}_s`` is the step's own time (its TERATIME total, no start),
    ``wall_s`` the whole. ``valid``: the output is sorted, holds every
    record, and its checksum is the generated data's."""
    plan = spark_plan(name, store)
    base = directory or f"{(plan.shared or DEFAULT_SHARED).path}/spark/terasort"
    src, dst = f"{base}/in", f"{base}/out"
    wipe = ["/bin/sh", "-c", f"rm -rf '{src}' '{dst}' && mkdir -p '{base}'"]
    assert plan.spark is not None
    if subprocess.run(ops.exec_argv(name, plan.spark.master, wipe, store), check=False).returncode:
        raise HpvcError(f"terasort on {name}", f"cannot prepare {base}")
    out: dict[str, Any] = {"cluster": name, "records": rows, "bytes": rows * model.RECORD_BYTES,
                           "dir": base}  # fmt: skip
    steps: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    if separate:
        for step, args in (("gen", ["gen", str(rows), src]), ("sort", ["sort", src, dst]),
                           ("validate", ["validate", dst])):  # fmt: skip
            progress(f"terasort {step}")
            text, seconds = _submit(name, plan, args, store)
            out[f"{step}_wall_s"] = seconds
            steps[step] = model.parse_result(text)
    else:
        progress("terasort gen, sort, validate")
        text, _ = _submit(name, plan, ["all", str(rows), base], store)
        steps = model.parse_steps(text)
    out["wall_s"] = time.perf_counter() - t0
    missing = [s for s in ("gen", "sort", "validate") if "TERATIME" not in steps.get(s, {})]
    if missing:
        raise HpvcError(f"terasort on {name}", f"no timing line of {', '.join(missing)}")
    results: dict[str, dict[str, Any]] = {}
    for step, lines in steps.items():
        out[f"{step}_s"] = lines["TERATIME"]["total_s"]
        results.update(lines)
    gen, val = results.get("TERAGEN", {}), results.get("TERAVALIDATE", {})
    out["checksum"] = val.get("checksum")
    out["valid"] = bool(
        val.get("sorted") and val.get("records") == rows == gen.get("records")
        and val.get("checksum") == gen.get("checksum")
    )  # fmt: skip
    out["results"] = results
    out["steps"] = steps  # each step's own lines (TERATIME: its phases, without JVM start)
    return out
