"""Class-data archives of the Spark daemons, made at image build (docs/spark.md).

A JVM spends most of its start loading, parsing and verifying classes: the
master and a worker load a few thousand from Spark's jars, and under
emulation (TCG) that takes tens of seconds. The JDK's application class-data
sharing (AppCDS, JDK 17's dynamic archive: ``-XX:ArchiveClassesAtExit``)
saves the classes a run loaded, already parsed and verified, in a file that
later runs map (``-XX:SharedArchiveFile``). The image build starts the
master and one worker registered with it, in the image's root with the
image's JDK, and keeps their archives in ``/opt/hpvc/cds``.

A JVM uses an archive only when its class path is the one the archive was
made with, entry by entry, each jar of the same size and time. Spark's
``spark-class`` gives ``jars/*``, which the JVM expands in the folder's
listing order; that order differs between the image's folder and the disk
of a VM made from it (ext4 lists by hash). So the daemons are started with
the explicit class path :func:`classpath` (names sorted) both here and in
the nodes. A JVM that finds no archive, or one that does not match, runs
without it (the JDK's ``-Xshare:auto``): slower, never wrong.
"""

from __future__ import annotations

import hashlib
import shlex
import subprocess
from pathlib import Path, PurePath

from hpvc.errors import HpvcError
from hpvc.progress import Progress
from hpvc.spark import model

ARCHIVES = PurePath("/opt/hpvc/cds")
MASTER, WORKER = "org.apache.spark.deploy.master.Master", "org.apache.spark.deploy.worker.Worker"
DUMP_S = 300  # the master and a worker starting and stopping natively: seconds


def archive(role: str) -> str:
    """Where the image keeps the archive of ``role`` (``master`` or ``worker``)."""
    return str(ARCHIVES / f"{role}.jsa")


def classpath(rootfs: Path, spark_home: str = model.IMAGE_SPARK_HOME) -> str:
    """``conf/`` and every jar of the image's Spark, by name: the daemons' class path."""
    jars = sorted(p.name for p in (rootfs / spark_home.lstrip("/") / "jars").iterdir())
    return ":".join([f"{spark_home}/conf/", *(f"{spark_home}/jars/{j}" for j in jars)])


def daemon_env(rootfs: Path, spark_home: str = model.IMAGE_SPARK_HOME) -> dict[str, str]:
    """What ``spark-class`` exports (its ``load-spark-env.sh``) that the daemons
    pass on: a worker starts its executors with Spark's launcher, which needs
    the Scala version (read off ``spark-core_<scala>-*.jar``)."""
    jars = (rootfs / spark_home.lstrip("/") / "jars").glob("spark-core_*.jar")
    scala = sorted(j.name.split("_", 1)[1].split("-", 1)[0] for j in jars)
    if len(scala) != 1:
        raise HpvcError(f"image Spark {spark_home}", f"not one spark-core jar: {scala}")
    return {"SPARK_ENV_LOADED": "1", "SPARK_CONF_DIR": f"{spark_home}/conf",
            "SPARK_SCALA_VERSION": scala[0]}  # fmt: skip


def daemon_argv(cp: str, memory_mib: int, cls: str, args: list[str], cds: str | None) -> list[str]:
    """The JVM of a daemon as ``spark-class`` would start it (its launcher's own
    line for a daemon: class path, options, heap), with the class path
    explicit and the archive ``cds`` when there is one."""
    java = f"{model.IMAGE_JAVA_HOME}/bin/java"
    shared = [f"-XX:SharedArchiveFile={cds}"] if cds else []
    opts = [*model.DAEMON_JAVA_OPTS.split(), *shared, f"-Xmx{memory_mib}m"]
    return [java, "-cp", cp, *opts, cls, *args]


def _script(cp: str, env: dict[str, str]) -> str:
    """Shell, run chrooted in the image: the master and a worker registered with it,
    each writing its archive at exit (SIGTERM ends a JVM through its exit path)."""
    master = daemon_argv(cp, 256, MASTER, ["--host", "127.0.0.1", "--port", "0",
                                           "--webui-port", "0"], None)  # fmt: skip
    worker = daemon_argv(cp, 256, WORKER, ["--host", "127.0.0.1", "--port", "0",
                                           "--webui-port", "0", "--cores", "1",
                                           "--memory", "256M", "--work-dir", "/tmp/cds-work"],
                         None)  # fmt: skip
    dump = "-XX:ArchiveClassesAtExit="
    m = " ".join(map(shlex.quote, [master[0], f"{dump}{archive('master')}", *master[1:]]))
    w = " ".join(map(shlex.quote, [worker[0], f"{dump}{archive('worker')}", *worker[1:]]))
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    return f"""
set -u
export {exports}
# The host's name means nothing in the image: the daemons' own address is loopback's.
export SPARK_LOCAL_IP=127.0.0.1 SPARK_LOCAL_HOSTNAME=localhost
wait_for() {{  # LOG PATTERN PID: while PID runs, up to {DUMP_S // 2} s
  i=0
  while ! grep -q "$2" "$1" 2>/dev/null; do
    i=$((i + 1))
    if [ $i -ge {DUMP_S * 5 // 2} ] || ! kill -0 "$3" 2>/dev/null; then
      grep -v 'warning.\\[cds' "$1" | grep -m3 -E 'Exception|ERROR' >&2 || tail -3 "$1" >&2
      exit 1
    fi
    sleep 0.2
  done
}}
mkdir -p {ARCHIVES} /tmp/cds-work
{m} >/tmp/cds-master.log 2>&1 &
mpid=$!
wait_for /tmp/cds-master.log 'Starting Spark master at spark://' $mpid
url=$(sed -n 's|.*Starting Spark master at \\(spark://[^ ]*\\).*|\\1|p' /tmp/cds-master.log)
{w} "$url" >/tmp/cds-worker.log 2>&1 &
wpid=$!
wait_for /tmp/cds-worker.log 'Successfully registered with master' $wpid
kill -TERM $wpid; wait $wpid
kill -TERM $mpid; wait $mpid
rm -rf /tmp/cds-work /tmp/cds-master.log /tmp/cds-worker.log /tmp/hsperfdata_root
test -s {archive("master")} && test -s {archive("worker")}
"""


def recipe() -> str:
    """What the recording runs, digested: part of the spark extra's content digest
    (``hpvc.image.extras``), so a change here builds the image again."""
    return hashlib.sha256(_script("CLASSPATH", {"ENV": "ENV"}).encode()).hexdigest()[:16]


def make_archives(rootfs: Path, progress: Progress) -> None:
    """Write ``/opt/hpvc/cds/{master,worker}.jsa`` into the image ``rootfs``.

    The daemons run chrooted in the rootfs, in their own PID and mount
    namespaces (the rootfs's ``/proc`` is mounted there only, and every
    process they start ends with the namespace), on the host's loopback with
    ports the kernel picks."""
    progress("recording the Spark daemons' classes (AppCDS)")
    argv = ["unshare", "--mount", "--pid", "--fork", "--kill-child",
            f"--mount-proc={rootfs / 'proc'}", "chroot", str(rootfs),
            "/bin/sh", "-c", _script(classpath(rootfs), daemon_env(rootfs))]  # fmt: skip
    r = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=DUMP_S)
    if r.returncode != 0:
        tail = " / ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
        raise HpvcError("image extra spark", f"recording the daemons' classes failed: {tail}")
