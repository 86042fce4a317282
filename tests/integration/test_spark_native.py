"""Real Spark on this host: TeraGen's bytes against the gensort reference, and a
native standalone cluster (master + 2 workers of 1 core, 1 GiB) running TeraGen,
TeraSort and TeraValidate on 64 MiB, leaving no JVM behind.

The pinned Spark is fetched once (pip, ~320 MB) into the default cache
(/var/cache/hpvc/spark, or $HPVC_CACHE_DIR/spark) and reused by later runs.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from hpvc.spark import model
from hpvc.spark.app import build_jar
from hpvc.spark.dist import cache_dir, java_home, spark_home
from hpvc.spark.native import NativeSpark
from tests import gensort
from tests.helpers import requires

ROWS_16MIB = model.rows_for(16 << 20) + 1  # 167773 rows: just over 16 MiB


def _pgid(pid: str) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[2])


def processes_in_groups(groups: set[int]) -> list[int]:
    """PIDs of live processes whose process group is one of ``groups``."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _pgid(p) in groups]


def _local_submit(args: list[str]) -> dict[str, dict[str, Any]]:
    """Run TeraSort's ``args`` in ``local[2]``; its TERA* result lines."""
    home = spark_home()
    jar = build_jar(home, cache_dir() / "jars")
    argv = model.submit_argv(
        home, "local[2]", jar, args,
        {"spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1"},
    )  # fmt: skip
    env = dict(os.environ, JAVA_HOME=str(java_home()), SPARK_LOCAL_IP="127.0.0.1")
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, f"{args[0]}: {done.stderr[-3000:]}"
    return model.parse_result(done.stdout)


def test_teragen_writes_gensort_records(tmp_path: Path) -> None:
    requires("java")
    out = tmp_path / "gen"
    result = _local_submit(["gen", "2000", str(out), "--partitions", "3"])
    files = sorted(out.iterdir())
    assert [f.name for f in files] == ["part-00000", "part-00001", "part-00002"]
    assert [f.stat().st_size for f in files] == [66700, 66700, 66600]  # 667, 667, 666 rows
    data = b"".join(f.read_bytes() for f in files)
    assert data == gensort.records(0, 2000)
    assert result["TERAGEN"]["records"] == 2000
    assert int(result["TERAGEN"]["checksum"], 16) == gensort.checksum(data)


def test_sort_samples_runs_from_ten_evenly_spaced_files(tmp_path: Path) -> None:
    """The split points come from runs of consecutive records at the start of
    10 of the 12 input files (0-4 and 6-10), as Hadoop's TeraSort samples 10
    splits; not from keys scattered over every file (a round trip each on NFS)."""
    requires("java")
    data, out = tmp_path / "data", tmp_path / "sorted"
    _local_submit(["gen", "2000", str(data), "--partitions", "12"])
    sort = _local_submit(["sort", str(data), str(out), "--partitions", "3"])
    rows = [2000 // 12 + (i < 2000 % 12) for i in range(12)]  # 167 x 8, then 166 x 4
    assert sort["TERASORT"]["samples"] == sum(rows[i] for i in (0, 1, 2, 3, 4, 6, 7, 8, 9, 10))
    parts = [f.read_bytes() for f in sorted(out.iterdir())]
    assert len(parts) == 3
    assert _keys(b"".join(parts)) == sorted(_keys(gensort.records(0, 2000)))
    for part in parts:  # the sample's quantiles split the keys about evenly
        assert 500 <= len(part) // 100 <= 833, [len(p) // 100 for p in parts]


def _keys(data: bytes) -> list[bytes]:
    """The 10-byte keys of 100-byte records, in their order."""
    return [data[i : i + 10] for i in range(0, len(data), 100)]


def test_native_terasort_16mib(tmp_path: Path) -> None:
    requires("java")
    groups: set[int] = set()
    spark = NativeSpark(tmp_path / "run", workers=2, cores=1, memory_mib=1024)
    with spark:
        groups.update(spark.pids())
        # `all`: the three steps in one application, as `hpvc spark terasort` runs them
        # (gen and sort alone: the tests above).
        done = spark.submit(["all", str(ROWS_16MIB), str(tmp_path)])
        assert done.returncode == 0, done.stderr[-3000:]
        results = model.parse_steps(done.stdout)
        out = tmp_path / "out"
    gen, sort, valid = results["gen"], results["sort"], results["validate"]
    assert gen["TERAGEN"]["records"] == sort["TERASORT"]["records"] == ROWS_16MIB
    assert valid["TERAVALIDATE"] == {
        "records": ROWS_16MIB,
        "checksum": gen["TERAGEN"]["checksum"],
        "sorted": True,
        "partitions": sort["TERASORT"]["partitions"],
    }
    assert sum(f.stat().st_size for f in out.iterdir()) == ROWS_16MIB * 100
    for r in results.values():
        assert r["TERATIME"]["total_s"] > 0
    assert list((tmp_path / "run" / "events").iterdir())  # event logs where we asked
    assert len(groups) == 3 and processes_in_groups(groups) == []
    assert spark.daemons == []
