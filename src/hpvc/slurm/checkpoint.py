"""``hpvc node checkpoint``: one consistent cut of a Slurm job's whole virtual
cluster, across all its hosts (issue 28 item 4; docs/checkpoint.md "Under Slurm").

The job's folder (``--out``, or the site's ``checkpoints=<dir>`` plus the job
id) holds one folder per cut, named by its UTC time::

    <job dir>/<stamp>/job.json        written last: a cut without it never finished
    <job dir>/<stamp>/share-<i>/...   host i's share: an ordinary checkpoint
                                      (hpvc.cluster.checkpoint_format's manifest)

How the cut stays one cut: this host starts ``hpvc node checkpoint-share``
on every host of the job through the site's command (``--via``), and talks to
each over its stdin and stdout (``hpvc.slurm.checkpoint_share``): every host
first says ``ready`` (its share found and checked, under its locks), then
**every** host freezes its share, and only once all have said ``frozen`` does
any host save; then all thaw (or, ``--stop``, take their shares down). So no
node of the job runs between the first freeze and the last save, on any host:
the argument of docs/checkpoint.md "The cut" holds across VXLAN as on one
bridge. A host that fails, or a link that breaks, makes every host abort:
each thaws its share and removes its partial folder (a host whose link to
this one is gone sees its stdin end and does the same), and this host removes
the cut's folder: one line, exit 1.

Pure parts (the job manifest, which cuts are complete, which to keep, what
``scontrol`` says) are unit-tested in tests/unit/test_slurm_checkpoint.py.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpvc import __version__
from hpvc.errors import HpvcError, InputError
from hpvc.locks import file_lock
from hpvc.paths import private_dir
from hpvc.progress import Progress, quiet
from hpvc.slurm.migrate import via_argv
from hpvc.slurm.policy import job_hosts

JOB_MANIFEST = "job.json"
SCHEMA = 1
KEEP = 2  # cuts kept per job: the last and the one before (a cut is never half-kept)
STEP_TIMEOUT_S = 600.0  # one phase on one host: a big VM's save writes its memory


# ---- the job's folder (pure but for reading and removing folders) ------------------


@dataclass(frozen=True)
class ShareEntry:
    index: int
    host: str
    dir: str  # relative to the cut's folder
    nodes: tuple[str, ...]
    size: int = 0


@dataclass(frozen=True)
class JobManifest:
    job: int
    created: float
    hosts: tuple[str, ...]
    shares: tuple[ShareEntry, ...]
    frozen_s: float = 0.0
    stopped: bool = False
    schema: int = SCHEMA
    hpvc_version: str = __version__
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "hpvc_version": self.hpvc_version,
            "job": self.job,
            "created": self.created,
            "hosts": list(self.hosts),
            "frozen_s": self.frozen_s,
            "stopped": self.stopped,
            "shares": [
                {
                    "index": s.index,
                    "host": s.host,
                    "dir": s.dir,
                    "nodes": list(s.nodes),
                    "size": s.size,
                }
                for s in self.shares
            ],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any], where: str) -> JobManifest:
        try:
            if d["schema"] != SCHEMA:
                raise InputError(
                    where,
                    f"schema {d['schema']}, this hpvc reads {SCHEMA}",
                    "restore it with the hpvc that took it",
                )
            shares = tuple(
                ShareEntry(
                    int(s["index"]),
                    str(s["host"]),
                    str(s["dir"]),
                    tuple(s["nodes"]),
                    int(s.get("size", 0)),
                )
                for s in d["shares"]
            )
            if [s.index for s in shares] != list(range(len(shares))) or any(
                "/" in s.dir or s.dir.startswith(".") for s in shares
            ):
                raise InputError(where, "its shares are not 0..n-1 in folders of the cut", "")
            return cls(
                int(d["job"]),
                float(d["created"]),
                tuple(d["hosts"]),
                shares,
                float(d.get("frozen_s", 0.0)),
                bool(d.get("stopped", False)),
                hpvc_version=str(d.get("hpvc_version", "")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(where, f"not a job checkpoint manifest ({e})", "") from None


def stamp(now: float | None = None) -> str:
    """A cut's folder name: its UTC time, to the millisecond (sorts in time order)."""
    t = time.time() if now is None else now
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


def read_job(cut: Path) -> JobManifest:
    where = f"job checkpoint {cut}"
    try:
        d = json.loads((cut / JOB_MANIFEST).read_text())
    except FileNotFoundError:
        raise InputError(where, "has no job.json: it never finished", "take a new one") from None
    except (OSError, ValueError) as e:
        raise InputError(where, f"job.json is unreadable ({e})", "take a new one") from None
    return JobManifest.from_json(d, where)


def cuts(job_dir: Path) -> list[Path]:
    """The job's complete cuts (a ``job.json``), newest first."""
    if not job_dir.is_dir():
        return []
    return sorted((p for p in job_dir.iterdir() if (p / JOB_MANIFEST).is_file()), reverse=True)


def latest(job_dir: Path) -> Path | None:
    found = cuts(job_dir)
    return found[0] if found else None


def to_remove(names: Sequence[str], complete: set[str], keep: int = KEEP) -> list[str]:
    """Which cut folders go: complete ones past the newest ``keep``, and unfinished
    ones older than the newest complete one (a newer unfinished one may be in
    progress: it stays)."""
    done = sorted((n for n in names if n in complete), reverse=True)
    newest = done[0] if done else ""
    old = done[keep:]
    unfinished = [n for n in names if n not in complete and n < newest]
    return sorted(old + unfinished)


GOING = ".going-"  # a cut being removed: hidden from ``cuts`` at once


def prune(job_dir: Path, keep: int = KEEP, coming: str | None = None) -> list[str]:
    """Remove what ``to_remove`` names; ``coming``: a cut about to be published
    (counted complete). Each goes by a rename to a hidden name first, then is
    deleted (with any left by an earlier prune): a cut's ``job.json`` could
    otherwise outlive its deletion's start by as long as the deletion takes,
    and anyone listing the cuts meanwhile would see one more than ``keep``."""
    names = [p.name for p in job_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
    complete = {p.name for p in cuts(job_dir)} | ({coming} if coming else set())
    gone = to_remove(names, complete, keep)
    for n in gone:
        os.replace(job_dir / n, job_dir / (GOING + n))
    for p in job_dir.iterdir():
        if p.name.startswith(GOING):
            shutil.rmtree(p, ignore_errors=True)
    return gone


def job_dir(root: str | Path, job: int) -> Path:
    return Path(root) / str(job)


# ---- what Slurm says of the job --------------------------------------------------------


def parse_scontrol(text: str) -> dict[str, str]:
    """``Key=Value`` fields of ``scontrol show job -o`` (the first job)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return dict(re.findall(r"(\w+)=(\S*)", line))


def job_info(job: int) -> dict[str, str]:
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        raise InputError(f"job {job}", "scontrol is not on PATH", "give --hosts HOST,HOST,...")
    r = subprocess.run(
        [scontrol, "show", "job", "-o", str(job)], capture_output=True, text=True, check=False
    )
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or ["unknown"])[-1]
        raise InputError(f"--job {job}", why, "give a running job's id (squeue)")
    return parse_scontrol(r.stdout)


def running_hosts(info: dict[str, str], job: int) -> list[str]:
    state = info.get("JobState", "")
    if state != "RUNNING":
        raise InputError(
            f"job {job}", f"is {state or 'unknown'}, not RUNNING", "checkpoint a running job"
        )
    hosts = job_hosts(info.get("NodeList", ""))
    if not hosts:
        raise InputError(f"job {job}", "has no hosts", "")
    return hosts


# ---- the cut, from one host ---------------------------------------------------------


class Worker:
    """``hpvc node checkpoint-share`` on one host, spoken to line by line."""

    def __init__(self, host: str, argv: list[str]) -> None:
        self.host = host
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.err: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self.err_pump = threading.Thread(target=self._pump_err, daemon=True)
        self.err_pump.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err.append(line.rstrip("\n"))

    def send(self, word: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(word + "\n")
            self.proc.stdin.flush()
        except OSError as e:
            raise HpvcError(f"checkpoint on {self.host}", f"its hpvc went away ({e})") from None

    def expect(self, word: str, timeout: float = STEP_TIMEOUT_S) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise HpvcError(
                f"checkpoint on {self.host}",
                f"no {word!r} after {timeout:.0f} s",
                "see the host's load; try again",
            ) from None
        if line is None:
            rc = self.proc.wait(timeout=30)
            self.err_pump.join(timeout=5)  # its last words
            said = next((e for e in reversed(self.err) if e.strip()), f"exit {rc}")
            err = InputError if rc == 2 else HpvcError
            raise err(f"on {self.host}", said.strip().removeprefix("hpvc: "), "")
        if line.split(" ", 1)[0] != word:
            raise HpvcError(f"checkpoint on {self.host}", f"said {line[:80]!r}, not {word!r}")
        return line[len(word) :].strip()

    def close(self) -> None:
        """Stdin closed: a worker still in its cut aborts it (thaw, partial folder gone)."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # ours, by its Popen (PID)
            self.proc.wait()


@dataclass(frozen=True)
class Taken:
    dir: Path
    manifest: JobManifest
    seconds: float
    removed: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {
            "dir": str(self.dir),
            "seconds": self.seconds,
            "removed": self.removed,
            "size": sum(s.size for s in self.manifest.shares),
            **self.manifest.to_json(),
        }


def take(
    job: int,
    hosts: Sequence[str],
    root: Path,
    via: str,
    *,
    stop: bool = False,
    keep: int = KEEP,
    hpvc: Sequence[str] | None = None,
    progress: Progress = quiet,
) -> Taken:
    """Cut job ``job``'s cluster on ``hosts`` into ``root/<stamp>``; keep ``keep`` cuts."""
    hpvc = list(hpvc or [sys.executable, "-m", "hpvc"])
    argvs = [via_argv(via, h, []) for h in hosts]  # a template without {host}: refused now
    private_dir(root)
    t0 = time.perf_counter()
    with file_lock(root / ".lock"):  # one cut of a job at a time
        cut = root / stamp()
        private_dir(cut)
        args = ["node", "checkpoint-share", f"--job={job}", f"--dir={cut}"]
        workers = [Worker(h, [*a, *hpvc, *args]) for h, a in zip(hosts, argvs, strict=True)]
        try:
            m = _cut(job, hosts, workers, stop, progress)
        except BaseException:
            for w in workers:
                w.close()
            shutil.rmtree(cut, ignore_errors=True)
            if not any(p.name != ".lock" for p in root.iterdir()):
                shutil.rmtree(root, ignore_errors=True)  # nothing of the job's was there
            raise
        for w in workers:
            w.close()
        tmp = cut / (JOB_MANIFEST + ".tmp")
        tmp.write_text(json.dumps(m.to_json(), indent=1))
        # the oldest go before this one is published: never more than ``keep`` seen
        removed = prune(root, keep, coming=cut.name)
        os.replace(tmp, cut / JOB_MANIFEST)
    return Taken(cut, m, time.perf_counter() - t0, removed)


def _cut(
    job: int, hosts: Sequence[str], workers: list[Worker], stop: bool, progress: Progress
) -> JobManifest:
    ready = {}
    for w in workers:
        index, _, nodes = w.expect("ready").partition(" ")
        ready[w.host] = (int(index), tuple(nodes.split(",")))
    if sorted(i for i, _ in ready.values()) != list(range(len(hosts))):
        raise HpvcError(f"job {job}", f"its shares are {sorted(ready.values())}, not one per host")
    progress(f"job {job}: freezing {len(hosts)} share(s)")
    created = time.time()
    t0 = time.perf_counter()
    for word in ("freeze", "save"):  # every host frozen before any saves
        for w in workers:
            w.send(word)
        for w in workers:
            w.expect("frozen" if word == "freeze" else "saved")
        progress(f"job {job}: every share {'frozen' if word == 'freeze' else 'saved'}")
    for w in workers:
        w.send("stop" if stop else "thaw")
    sizes = {w.host: json.loads(w.expect("done")).get("size", 0) for w in workers}
    frozen_s = time.perf_counter() - t0
    shares = sorted(
        (ShareEntry(i, h, f"share-{i}", nodes, int(sizes[h])) for h, (i, nodes) in ready.items()),
        key=lambda s: s.index,
    )
    return JobManifest(job, created, tuple(hosts), tuple(shares), frozen_s, stop)
