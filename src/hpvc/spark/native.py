"""Native Spark standalone on this host, the baseline the virtual clusters are measured against.

``NativeSpark`` starts one master and N workers as host processes, bound to
127.0.0.1 on free ports, with the same SPARK_HOME (``hpvc.spark.dist``) and
Java the ``spark`` image carries, and the same command lines a virtual
cluster runs in its nodes (``hpvc.spark.model``). Everything it writes (logs,
work and shuffle folders, event logs) lies under the folder it is given.

Each daemon runs in its own process group (``spark-class`` execs java, so the
group leader is the JVM, and the executors a worker forks join its group);
stopping sends SIGTERM, then SIGKILL, to exactly those groups, on a normal
exit and on any failure, so no JVM of ours outlives the block.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from hpvc.errors import HpvcError, InputError
from hpvc.spark import model
from hpvc.spark.dist import cache_dir, java_home
from hpvc.spark.dist import spark_home as pinned_spark_home
from hpvc.spec import spark as sizing

STOP_GRACE_S = 10.0


@dataclass
class Daemon:
    """One JVM we started: its process (group leader) and its log."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 5) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        picked = [ln.strip() for ln in text if ln.strip()][-lines:]
        return " / ".join(picked) or "(empty log)"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _get_json(url: str, timeout: float = 2.0) -> dict[str, Any] | None:
    """GET ``url`` as JSON without any proxy (it is on loopback); None when not answering."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as resp:
            doc = json.loads(resp.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return doc if isinstance(doc, dict) else None


def stop_group(proc: subprocess.Popen[Any], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the process group led by ``proc``, SIGKILL what is left after
    ``grace_s``; return when the group is empty (``proc`` reaped)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        proc.poll()  # reap the leader: a zombie still counts as a member
        if not _group_alive(proc.pid):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            proc.poll()
            if not _group_alive(proc.pid):
                return
            time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    """Whether any process is left in the group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - only root's own groups are ours
        return True
    return True


class NativeSpark:
    """A Spark standalone cluster of host processes; use it as a context manager.

    >>> with NativeSpark(Path("/tmp/run"), workers=2, cores=1, memory_mib=1024) as spark:
    ...     done = spark.submit(["gen", "1000", "/tmp/run/in"])  # doctest: +SKIP
    """

    def __init__(
        self,
        workdir: Path,
        workers: int = 1,
        cores: int = 1,
        memory_mib: int = 1024,
        *,
        spark_home: Path | None = None,
        java: Path | None = None,
        host: str = "127.0.0.1",
        start_timeout_s: float = 90.0,
        daemon_memory_mib: int = sizing.DAEMON_MEMORY_MIB,
        places: Sequence[tuple[str, Sequence[str]]] = (),
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        """``places``: hosts apart (the Slurm test cluster's, ``hpvc bench spark
        --slurm``), each an (address, command prefix that runs a program
        there); the master and the driver run at the first, worker ``i`` at
        place ``i`` modulo their number, on the places' own addresses and
        Spark's default ports. ``extra_env``: added to every daemon's and
        submit's environment (what the prefix needs)."""
        if workers < 1:
            raise InputError("native spark", f"{workers} workers", "ask for at least 1")
        self.workdir = workdir.absolute()
        self.workers, self.cores, self.memory_mib = workers, cores, memory_mib
        self.spark_home = spark_home or pinned_spark_home()
        self.java_home = java or java_home()
        self.host = host
        self.start_timeout_s = start_timeout_s
        self.daemon_memory_mib = daemon_memory_mib
        self.places = [(a, list(p)) for a, p in places]
        self.extra_env = dict(extra_env or {})
        if self.places:
            self.host = self.places[0][0]
        self.port = 0
        self.ui_port = 0
        self.daemons: list[Daemon] = []
        self._logs: list[IO[bytes]] = []

    @property
    def master_url(self) -> str:
        return model.master_url(self.host, self.port)

    @property
    def ui_url(self) -> str:
        return f"http://{self.host}:{self.ui_port}"

    @property
    def events_dir(self) -> Path:
        return self.workdir / "events"

    def pids(self) -> list[int]:
        """The PIDs (and process groups) of the daemons started."""
        return [d.proc.pid for d in self.daemons]

    def env(self, local_dir: Path, host: str | None = None) -> dict[str, str]:
        """A daemon's or a submit's environment; ``host``: the address its place
        binds (default the master's)."""
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(self.spark_home),
            JAVA_HOME=str(self.java_home),
            SPARK_CONF_DIR=str(self.workdir / "conf"),
            SPARK_LOCAL_IP=host or self.host,
            SPARK_LOCAL_DIRS=str(local_dir),
            SPARK_DAEMON_MEMORY=f"{self.daemon_memory_mib}m",
            SPARK_DAEMON_JAVA_OPTS=model.DAEMON_JAVA_OPTS,
        )
        env.pop("SPARK_ENV_LOADED", None)
        env.update(self.extra_env)
        return env

    def _prefix(self, i: int = 0) -> list[str]:
        return self.places[i % len(self.places)][1] if self.places else []

    def _spawn(
        self, name: str, argv: list[str], prefix: Sequence[str] = (), host: str | None = None
    ) -> Daemon:
        local = self.workdir / "local" / name
        local.mkdir(parents=True, exist_ok=True)
        log = self.workdir / "logs" / f"{name}.log"
        out = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self._logs.append(out)
        proc = subprocess.Popen(
            [*prefix, *argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=self.env(local, host),
            cwd=self.workdir,
            start_new_session=True,
        )
        daemon = Daemon(name, proc, log)
        self.daemons.append(daemon)
        return daemon

    def _wait_alive(self, count: int) -> None:
        """Until the master's JSON lists ``count`` ALIVE workers (0: until it answers)."""
        deadline = time.monotonic() + self.start_timeout_s
        doc: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            for d in self.daemons:
                if d.proc.poll() is not None:
                    raise HpvcError(
                        f"native spark {d.name}",
                        f"exited with status {d.proc.returncode}: {d.tail()}",
                        f"see {d.log}",
                    )
            doc = _get_json(f"{self.ui_url}/json/")
            if doc is not None and len(model.workers_alive(doc)) >= count:
                return
            time.sleep(0.25)
        if doc is None:
            why = f"the master's {self.ui_url}/json/ did not answer"
        else:
            why = f"{len(model.workers_alive(doc))} of {count} workers alive"
        raise HpvcError(
            "native spark",
            f"{why} after {self.start_timeout_s:.0f} s: {self.daemons[-1].tail()}",
            f"see the logs in {self.workdir / 'logs'}",
        )

    def start(self) -> None:
        for sub in ("conf", "logs", "work", "local", "events"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        try:
            if self.places:  # each place is a network of its own: Spark's own ports
                self.port, self.ui_port = 7077, 8080
            else:
                self.port, self.ui_port = free_port(self.host), free_port(self.host)
            argv = model.master_argv(self.spark_home, self.host, self.port, self.ui_port)
            self._spawn("master", argv, self._prefix())
            self._wait_alive(0)
            for i in range(self.workers):
                host = self.places[i % len(self.places)][0] if self.places else self.host
                argv = model.worker_argv(
                    self.spark_home,
                    self.master_url,
                    host=host,
                    cores=self.cores,
                    memory_mib=self.memory_mib,
                    work_dir=self.workdir / "work" / f"worker-{i}",
                    port=0 if self.places else free_port(self.host),
                    ui_port=0 if self.places else free_port(self.host),
                )
                self._spawn(f"worker-{i}", argv, self._prefix(i), host)
            self._wait_alive(self.workers)
        except BaseException:
            self.stop()
            raise

    def conf(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The application conf: whole-worker executors, loopback driver, event logs here."""
        conf = model.app_conf(self.workers, self.cores, self.memory_mib)
        conf.update(
            {
                "spark.driver.host": self.host,
                "spark.driver.bindAddress": self.host,
                "spark.local.dir": str(self.workdir / "local" / "driver"),
                "spark.ui.enabled": "false",
                "spark.eventLog.enabled": "true",
                "spark.eventLog.dir": self.events_dir.as_uri(),
            }
        )
        conf.update(extra or {})
        return conf

    def submit(
        self,
        args: Sequence[str],
        conf: Mapping[str, str] | None = None,
        *,
        jar: Path | None = None,
        timeout_s: float = 1800.0,
    ) -> subprocess.CompletedProcess[str]:
        """``spark-submit`` (client mode) of TeraSort ``args``; its output, whatever its status."""
        if jar is None:
            from hpvc.spark.app import build_jar

            jar = build_jar(self.spark_home, cache_dir() / "jars")
        argv = model.submit_argv(self.spark_home, self.master_url, jar, args, self.conf(conf))
        (self.workdir / "local" / "driver").mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            [*self._prefix(), *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env(self.workdir / "local" / "driver"),
            cwd=self.workdir,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except BaseException:
            stop_group(proc, grace_s=5.0)
            raise
        finally:
            if proc.poll() is not None and _group_alive(proc.pid):
                stop_group(proc, grace_s=5.0)
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def stop(self) -> None:
        """Stop every daemon's process group, workers first; idempotent."""
        for d in reversed(self.daemons):
            stop_group(d.proc)
        self.daemons.clear()
        for f in self._logs:
            f.close()
        self._logs.clear()

    def __enter__(self) -> NativeSpark:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
