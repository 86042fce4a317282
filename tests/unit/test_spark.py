"""Spark without a cluster: the pure rules (worker memory, argv, result lines, master
JSON), the pinned distribution's cache (with a fake sdist and a fake pip), the
TeraSort sources' pin, and the gensort reference the Java TeraGen is checked against."""

from __future__ import annotations

import io
import os
import tarfile
import threading
from pathlib import Path

import pytest

from hpvc.errors import HpvcError, InputError, MissingDependency
from hpvc.image.extras import SPARK_EXTRA
from hpvc.spark import app, cds, dist, model
from hpvc.spec import spark as sizing
from tests import gensort

# --- worker memory ------------------------------------------------------------------------


def test_worker_memory_leaves_the_os_the_daemon_and_the_jvm_their_share() -> None:
    assert sizing.worker_memory_mib(4096) == 2944
    assert sizing.worker_memory_mib(16384) == 13120
    sizes = [sizing.worker_memory_mib(m) for m in range(2048, 65536, 512)]
    assert sizes == sorted(sizes) and all(s % 64 == 0 for s in sizes)
    for node in (2048, 8192, 65536):
        heap = sizing.worker_memory_mib(node)
        assert node - heap >= sizing.OS_RESERVE_MIN_MIB + sizing.DAEMON_MEMORY_MIB + 384


def test_worker_memory_refuses_a_node_too_small() -> None:
    with pytest.raises(InputError, match="at least 2 GiB"):
        sizing.worker_memory_mib(1024)


# --- command lines ------------------------------------------------------------------------


def test_submit_argv_is_spark_submit_with_sorted_conf() -> None:
    argv = model.submit_argv(
        "/opt/spark",
        "spark://10.0.0.1:7077",
        "/opt/hpvc/terasort.jar",
        ["sort", "/shared/in", "/shared/out"],
        {"spark.executor.memory": "1024m", "spark.cores.max": "4"},
    )
    assert argv == [
        "/opt/spark/bin/spark-submit",
        "--master",
        "spark://10.0.0.1:7077",
        "--class",
        "hpvc.terasort.TeraSort",
        "--conf",
        "spark.cores.max=4",
        "--conf",
        "spark.executor.memory=1024m",
        "/opt/hpvc/terasort.jar",
        "sort",
        "/shared/in",
        "/shared/out",
    ]


@pytest.mark.parametrize("key", ["executor.memory", "spark.a=b", "spark.a b", ""])
def test_submit_argv_refuses_what_is_no_property(key: str) -> None:
    with pytest.raises(InputError):
        model.submit_argv("/s", "spark://h:1", "/j.jar", [], {key: "1"})


def test_daemon_argv() -> None:
    assert model.master_argv("/opt/spark", "10.0.0.1", 7077, 8080) == [
        "/opt/spark/bin/spark-class",
        "org.apache.spark.deploy.master.Master",
        *("--host", "10.0.0.1", "--port", "7077", "--webui-port", "8080"),
    ]
    worker = model.worker_argv(
        "/opt/spark", "spark://10.0.0.1:7077", host="10.0.0.2", cores=4, memory_mib=2944,
        work_dir="/scratch/work",
    )  # fmt: skip
    assert worker == [
        "/opt/spark/bin/spark-class",
        "org.apache.spark.deploy.worker.Worker",
        *("--host", "10.0.0.2", "--port", "0", "--webui-port", "0"),
        *("--cores", "4", "--memory", "2944M", "--work-dir", "/scratch/work"),
        "spark://10.0.0.1:7077",
    ]
    with pytest.raises(InputError):
        model.worker_argv("/s", "spark://h:1", host="h", cores=0, memory_mib=1, work_dir="/w")


def test_app_conf_waits_for_every_executor() -> None:
    conf = model.app_conf(workers=2, cores=3, memory_mib=1024)
    assert conf["spark.cores.max"] == "6" and conf["spark.executor.cores"] == "3"
    assert conf["spark.executor.memory"] == "1024m"
    assert conf["spark.scheduler.minRegisteredResourcesRatio"] == "1.0"


# --- output -------------------------------------------------------------------------------

OUTPUT = """\
26/11/24 04:31:21 INFO SparkContext: Running Spark version 3.5.3
TERAGEN records=671089 checksum=51f81a890d1d4 partitions=2
TERATIME cmd=gen startup_s=9.696 gen_s=2.742 total_s=2.743
TERAVALIDATE records=10 checksum=123 sorted=false partitions=2 problem=part-00001:unsorted-at-9
"""


def test_parse_result_types_the_fields_and_ignores_the_log() -> None:
    got = model.parse_result(OUTPUT)
    assert got["TERAGEN"] == {"records": 671089, "checksum": "51f81a890d1d4", "partitions": 2}
    assert got["TERATIME"] == {"cmd": "gen", "startup_s": 9.696, "gen_s": 2.742, "total_s": 2.743}
    assert got["TERAVALIDATE"]["sorted"] is False
    assert got["TERAVALIDATE"]["checksum"] == "123"  # hex stays a string
    assert got["TERAVALIDATE"]["problem"] == "part-00001:unsorted-at-9"
    assert model.parse_result("nothing here\n") == {}


def test_parse_result_refuses_a_malformed_line() -> None:
    with pytest.raises(ValueError, match="malformed"):
        model.parse_result("TERAGEN records=1 oops\n")
    with pytest.raises(ValueError):
        model.parse_result("TERAVALIDATE sorted=maybe\n")


ALL_OUTPUT = """\
25/11/27 INFO SparkContext: Running Spark version 3.5.3
TERAGEN records=10 checksum=a1 partitions=1
TERATIME cmd=gen startup_s=8.100 gen_s=1.000 total_s=1.200
TERASORT records=10 partitions=2
TERATIME cmd=sort startup_s=0.000 sample_s=0.300 sort_s=2.000 total_s=2.500
25/11/27 INFO DAGScheduler: Job 2 finished
TERAVALIDATE records=10 checksum=a1 sorted=true partitions=2
TERATIME cmd=validate startup_s=0.000 validate_s=0.700 total_s=0.800
"""


def test_parse_steps_gives_each_step_of_all_its_own_lines() -> None:
    got = model.parse_steps(ALL_OUTPUT)
    assert sorted(got) == ["gen", "sort", "validate"]
    assert got["gen"]["TERAGEN"] == {"records": 10, "checksum": "a1", "partitions": 1}
    assert got["sort"] == {
        "TERASORT": {"records": 10, "partitions": 2},
        "TERATIME": {"cmd": "sort", "startup_s": 0.0, "sample_s": 0.3, "sort_s": 2.0,
                     "total_s": 2.5},
    }  # fmt: skip
    assert [got[s]["TERATIME"]["total_s"] for s in ("gen", "validate")] == [1.2, 0.8]
    assert got["validate"]["TERAVALIDATE"]["sorted"] is True
    # A run that stopped after gen has no sort or validate.
    assert sorted(model.parse_steps(ALL_OUTPUT.split("TERASORT")[0])) == ["gen"]
    assert model.parse_steps("no result\n") == {}


def test_workers_alive_from_the_master_json() -> None:
    doc = {
        "url": "spark://127.0.0.1:7077",
        "aliveworkers": 1,
        "workers": [
            {"id": "worker-1", "host": "127.0.0.1", "cores": 1, "memory": 1024, "state": "ALIVE"},
            {"id": "worker-2", "host": "127.0.0.1", "cores": 1, "memory": 1024, "state": "DEAD"},
        ],
        "status": "ALIVE",
    }
    assert [w["id"] for w in model.workers_alive(doc)] == ["worker-1"]
    assert model.workers_alive({}) == [] and model.workers_alive({"workers": None}) == []


def test_rows_for() -> None:
    assert model.rows_for(64 << 20) == 671088
    assert model.rows_for(1 << 30) == 10737418


# --- the gensort reference ----------------------------------------------------------------


def test_reference_generator_matches_gensorts_published_skip_table() -> None:
    # rand16.c's / Hadoop Random16's genArray[1] and [2]: f^2 and f^4 of the generator.
    assert gensort.skip_ahead(1) == gensort.C
    a1, c1 = 0x17BCE35BDF69743C529ED9EB20E0AE99, 0x95E0E48262B3EDFE04479485C755B646
    a2, c2 = 0xF4DD417327DB7A9BD194DFBE42D45771, 0x882A02C315362B60765F100068B33A1C
    assert gensort.skip_ahead(2) == c1  # f^2(0) = c1
    assert gensort.skip_ahead(4) == c2
    assert a1 == (gensort.A * gensort.A) % gensort.MOD and a2 == (a1 * a1) % gensort.MOD
    assert gensort.records(5, 3) == gensort.records(0, 8)[500:]


def test_reference_record_layout() -> None:
    rec = gensort.records(0, 1)
    assert len(rec) == 100
    assert rec[10:12] == b"\x00\x11" and rec[12:44] == b"0" * 32
    assert rec[44:48] == b"\x88\x99\xaa\xbb" and rec[96:] == b"\xcc\xdd\xee\xff"
    assert all(rec[48 + 4 * i : 52 + 4 * i] == rec[48 + 4 * i : 49 + 4 * i] * 4 for i in range(12))
    assert gensort.records(255, 1)[12:44] == b"0" * 30 + b"FF"


# --- the pinned distribution --------------------------------------------------------------


def fake_sdist(path: Path, version: str = "9.9.9") -> str:
    """A tiny pyspark sdist: bin/, sbin/, jars/, plus what must stay out; its sha256."""
    files = {
        f"pyspark-{version}/deps/bin/spark-class": (b"#!/bin/sh\n", 0o755),
        f"pyspark-{version}/deps/bin/spark-class.cmd": (b"rem\n", 0o644),
        f"pyspark-{version}/deps/sbin/spark-daemon.sh": (b"#!/bin/sh\n", 0o755),
        f"pyspark-{version}/deps/jars/spark-core.jar": (b"PK", 0o644),
        f"pyspark-{version}/deps/examples/x.py": (b"", 0o644),
        f"pyspark-{version}/setup.py": (b"", 0o644),
        "../evil": (b"", 0o644),
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo(f"pyspark-{version}/deps/jars/link.jar")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    return dist.sha256_of(path)


@pytest.fixture
def pin(tmp_path: Path) -> dist.Pinned:
    sdist = tmp_path / "src" / "pyspark-9.9.9.tar.gz"
    sdist.parent.mkdir()
    return dist.Pinned("9.9.9", fake_sdist(sdist))


def fake_pip(monkeypatch: pytest.MonkeyPatch, source: Path, calls: list[Path]) -> None:
    def download(dest: Path, pin: dist.Pinned) -> Path:
        calls.append(dest)
        out = dest / pin.sdist
        out.write_bytes(source.read_bytes())
        return out

    monkeypatch.setattr(dist, "_pip_download", download)


def test_cache_dir_follows_hpvc_cache_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPVC_CACHE_DIR", raising=False)
    assert dist.cache_dir() == Path("/var/cache/hpvc/spark")
    monkeypatch.setenv("HPVC_CACHE_DIR", "/x/cache")
    assert dist.cache_dir() == Path("/x/cache/spark")
    assert dist.cache_dir("/y") == Path("/y")


def test_spark_home_fetches_once_and_extracts_only_the_distribution(
    tmp_path: Path, pin: dist.Pinned, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    fake_pip(monkeypatch, tmp_path / "src" / pin.sdist, calls)
    cache = tmp_path / "cache"
    home = dist.spark_home(cache, pin=pin)
    assert home == cache / "spark-9.9.9" and len(calls) == 1
    found = sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file())
    assert found == ["RELEASE", "bin/spark-class", "jars/spark-core.jar", "sbin/spark-daemon.sh"]
    assert (home / "conf").is_dir() and (home / "bin/spark-class").stat().st_mode & 0o111
    assert pin.sha256 in (home / "RELEASE").read_text()
    assert not (tmp_path / "evil").exists()
    assert dist.spark_home(cache, pin=pin) == home and len(calls) == 1
    assert sorted(p.name for p in cache.iterdir()) == [".lock", pin.sdist, "spark-9.9.9"]


def test_spark_home_in_two_threads_extracts_once(
    tmp_path: Path, pin: dist.Pinned, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    fake_pip(monkeypatch, tmp_path / "src" / pin.sdist, calls)
    homes: list[Path] = []
    threads = [
        threading.Thread(target=lambda: homes.append(dist.spark_home(tmp_path / "c", pin=pin)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(homes)) == 1 and len(homes) == 4 and len(calls) == 1


def test_a_download_with_another_sha256_is_refused_and_not_kept(
    tmp_path: Path, pin: dist.Pinned, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other.tar.gz"
    fake_sdist(other, "9.9.9")
    other.write_bytes(other.read_bytes() + b"tampered")
    fake_pip(monkeypatch, other, [])
    with pytest.raises(HpvcError, match="the pinned one is") as e:
        dist.fetch(tmp_path / "c", pin=pin)
    assert "put pyspark-9.9.9.tar.gz" in e.value.fix
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [".lock"]


def test_a_cached_sdist_with_another_sha256_is_an_error(tmp_path: Path, pin: dist.Pinned) -> None:
    cache = tmp_path / "c"
    cache.mkdir()
    (cache / pin.sdist).write_bytes(b"not it")
    with pytest.raises(HpvcError, match="sha256"):
        dist.spark_home(cache, pin=pin)
    assert not (cache / "spark-9.9.9").exists()


def test_pip_failures_say_what_to_do(
    tmp_path: Path, pin: dist.Pinned, monkeypatch: pytest.MonkeyPatch
) -> None:
    def run(stderr: str, rc: int = 1) -> object:
        class Done:
            returncode, stdout = rc, ""

        Done.stderr = stderr  # type: ignore[attr-defined]
        return Done()

    (tmp_path / "d").mkdir()
    monkeypatch.setattr(dist.subprocess, "run", lambda *a, **k: run("No module named pip"))
    with pytest.raises(MissingDependency, match="pip is not available"):
        dist._pip_download(tmp_path / "d", pin)
    monkeypatch.setattr(
        dist.subprocess, "run", lambda *a, **k: run("ERROR: Could not find a version\n")
    )
    with pytest.raises(HpvcError, match="Could not find a version") as e:
        dist._pip_download(tmp_path / "d", pin)
    assert "check the network" in e.value.fix


def test_java_home_says_how_to_get_java(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(MissingDependency, match="openjdk-17"):
        dist.java_home()


# --- the TeraSort sources -----------------------------------------------------------------

# The image extra spark-3.5.3 carries the jar built from these sources; the
# image recipe's digest includes their digest (Extra.content), so an image with
# an older jar is not reused (tests/unit/test_image_extras.py).


def test_terasort_sources_are_the_image_extras_content() -> None:
    from hpvc.image.extras import content_digests

    assert f"spark-{dist.VERSION}" == SPARK_EXTRA
    # The TeraSort sources and what records the daemons' class-data archives.
    want = f"{app.sources_digest()}+cds-{cds.recipe()}"
    assert content_digests([SPARK_EXTRA]) == {SPARK_EXTRA: want}
    assert set(app.sources()) == {
        "Gen.java", "Records.java", "Sort.java", "TeraSort.java", "Validate.java",
    }  # fmt: skip


# --- NativeSpark's failure paths, with a fake spark-class -----------------------------------


def fake_spark_home(tmp_path: Path, script: str) -> tuple[Path, Path]:
    home, java = tmp_path / "spark", tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    (java / "bin").mkdir(parents=True)
    (java / "bin" / "java").write_text("")
    cls = home / "bin" / "spark-class"
    cls.write_text("#!/bin/sh\n" + script)
    cls.chmod(0o755)
    return home, java


def test_a_daemon_that_dies_is_reported_with_its_log(tmp_path: Path) -> None:
    from hpvc.spark.native import NativeSpark

    home, java = fake_spark_home(tmp_path, "echo 'Error: no such class' >&2; exit 3\n")
    spark = NativeSpark(tmp_path / "run", spark_home=home, java=java, start_timeout_s=20)
    with pytest.raises(HpvcError, match="master: exited with status 3: Error: no such class"):
        spark.__enter__()
    assert spark.daemons == []


def test_a_cluster_that_never_comes_up_is_stopped_whole(tmp_path: Path) -> None:
    from hpvc.spark.native import NativeSpark

    pids = tmp_path / "pids"
    # A "master" that never answers, with a child in its process group (an executor).
    home, java = fake_spark_home(tmp_path, f"sleep 600 & echo $$ $! > {pids}\nwait\n")
    spark = NativeSpark(tmp_path / "run", spark_home=home, java=java, start_timeout_s=1.5)
    with pytest.raises(HpvcError, match="json/ did not answer after"):
        spark.__enter__()
    for pid in pids.read_text().split():
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)
