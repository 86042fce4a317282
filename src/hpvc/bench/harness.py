"""``hpvc bench run``: every suite in one run, one results.json, one report, plots.

Each suite returns a document with a flat list of ``samples`` (suite, config,
metric, unit, higher_is_better, rep, order, value) and a list of ``goals``.
``hpcc`` and ``isolation`` write that shape themselves; ``io`` and ``startup``
predate it and go through the adapters below. This module plans and runs the
suites and writes results.json; everything else only reads samples: the goal
table, the per-config summaries, the paired ratios against the baseline
(``report``) and the plots (``plots``) are all computed from them, so
``hpvc bench report`` re-renders a run from its results.json without measuring
anything, and ``hpvc bench compare`` can put any two runs side by side.

A suite that fails is recorded with its error and the others still run; the
run then ends with exit code 1.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpvc.bench import common
from hpvc.bench.common import error_line
from hpvc.bench.io import jobs as io_jobs
from hpvc.bench.io import runner as io
from hpvc.bench.report import Sample, suite_module
from hpvc.bench.startup import runner as startup
from hpvc.errors import InputError
from hpvc.progress import Progress, quiet

SUITES = ("hpcc", "isolation", "io", "startup")
TARGETS = ("native", "container", "vm")
HPCC_CONTAINER = ("container", "container-nopin", "container-nohuge", "container-nonuma")
ISOLATION_CONFIGS = ("idle", "partitioned", "shared")
SAMPLE_KEYS = ("suite", "config", "metric", "unit", "higher_is_better", "rep", "order", "value")
MB = 1_000_000


# --- what to run ---------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """Knobs of the suites; the defaults keep the default run under 20 minutes."""

    repeat: int = 3
    io_seconds: int = 3
    startup_nodes: tuple[int, ...] = (1, 4, 8)
    vm_nodes: tuple[int, ...] = (1, 2, 4)
    procs: int = 2
    samples: int = 3
    hpl_n: int | None = None  # hpcc: HPL's N; None: sized (hpcc.sizing)
    time_budget_s: float = 60.0  # hpcc: one native run (hpcc.sizing.BUDGET_S)
    blas: str = "openblas"  # hpcc: hpcc.blas.CHOICES


@dataclass(frozen=True)
class SuitePlan:
    """One suite and the configs it runs; no configs means skipped, and ``note`` says why."""

    suite: str
    configs: tuple[str, ...]
    note: str = ""


def parse_list(text: str, allowed: Iterable[str], option: str, example: str) -> list[str]:
    """A comma-separated choice from ``allowed``, in the order given, without repeats."""
    allowed = tuple(allowed)
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise InputError(option, "nothing given", f"{option} {example}")
    for x in items:
        if x not in allowed:
            raise InputError(
                f"{option} {x}", "unknown", f"choose from {', '.join(allowed)}, e.g. {example}"
            )
    return list(dict.fromkeys(items))


def parse_suites(text: str) -> list[str]:
    names = parse_list(text, (*SUITES, "all"), "--suite", "hpcc,io")
    return list(SUITES) if "all" in names else names


def parse_targets(text: str) -> list[str]:
    return parse_list(text, TARGETS, "--targets", "native,container")


def parse_sizes(text: str, option: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InputError(f"{option} {text}", "not a list of numbers", f"{option} 1,4,8") from None
    if not sizes or any(n < 1 for n in sizes):
        raise InputError(f"{option} {text}", "sizes must be 1 or more", f"{option} 1,4,8")
    return sizes


def plan_suites(suites: list[str], targets: list[str]) -> list[SuitePlan]:
    """Map --targets to each suite's configs (pure); suites with none carry a note."""
    ct, native, vm = "container" in targets, "native" in targets, "vm" in targets
    plans = []
    for s in suites:
        if s == "hpcc":
            cfgs = (("native",) if native else ()) + (HPCC_CONTAINER if ct else ())
            cfgs += ("vm",) if vm else ()
            note = "" if native or not cfgs else "no native baseline: no ratios (add native)"
            plans.append(SuitePlan(s, cfgs, note))
        elif s in ("isolation", "io"):
            cfgs = (ISOLATION_CONFIGS if s == "isolation" else ("container",)) if ct else ()
            plans.append(
                SuitePlan(s, cfgs, "" if ct else "container-only: container not in --targets")
            )
        else:
            cfgs = (("container",) if ct else ()) + (("vm",) if vm else ())
            plans.append(SuitePlan(s, cfgs, "" if cfgs else "needs container or vm in --targets"))
    return plans


# --- adapters: the older suites' documents as samples and goals ---------------------


@dataclass
class _Samples:
    """Samples of one suite, added one line at a time."""

    suite: str
    rows: list[Sample] = field(default_factory=list)

    def add(
        self, cfg: str, metric: str, unit: str, hib: bool, rep: Any, order: Any, value: float
    ) -> None:
        row = (self.suite, cfg, metric, unit, hib, int(rep), int(order), float(value))
        self.rows.append(dict(zip(SAMPLE_KEYS, row, strict=True)))


def io_samples(doc: dict[str, Any]) -> tuple[list[Sample], list[dict[str, Any]]]:
    """Samples and goals of ``io.run``'s document.

    throttled: ``<node>_<read|write>_vs_target`` (measured / target, 1.0 = exact) and
    ``<node>_<read|write>_MBps``; weighted: ``<job>_w900_per_w100`` (target 9) and each
    side's MB/s; native / open / high: ``<job>_MBps`` (overhead of idle limits, paired
    with native). Goals: every throttle within 5% of its target (median).
    """
    s, goals = _Samples("io"), []
    pct = float(doc.get("goal", {}).get("throttle_abs_error_pct_at_most", io_jobs.GOAL_ERROR_PCT))
    order_t = [(label, job.key) for label, job, _ in io_jobs.throttle_targets()]
    for t in doc.get("throttle", []):
        name, key = f"{t['node']}_{t['direction']}", (t["node"], t["job"])
        target = float(t["target_bps"])
        for x in t["samples"]:
            rot = io_jobs.rotate(order_t, int(x["rep"]))
            order, bw = rot.index(key) if key in rot else 0, float(x["bw_bytes"])
            s.add("throttled", f"{name}_vs_target", "ratio", True, x["rep"], order, bw / target)
            s.add("throttled", f"{name}_MBps", "MB/s", True, x["rep"], order, bw / MB)
        goals.append(
            {
                "metric": f"{name}_vs_target",
                "config": "throttled",
                "within_pct": pct,
                "of": "median",
                "target_MBps": target / MB,
            }
        )
    weight_jobs = [j.key for j in io_jobs.WEIGHT_JOBS]
    for w in doc.get("weight", []):
        for x in w["samples"]:
            rot = io_jobs.rotate(weight_jobs, int(x["rep"]))
            order = rot.index(w["job"]) if w["job"] in rot else 0
            s.add(
                "weighted", f"{w['job']}_w900_per_w100", "ratio", True, x["rep"], order, x["ratio"]
            )
            for side in ("w100", "w900"):
                mbps = float(x[side]["bw_bytes"]) / MB
                s.add("weighted", f"{w['job']}_{side}_MBps", "MB/s", True, x["rep"], order, mbps)
    for j in doc.get("overhead", {}).get("jobs", []):
        for x in j["samples"]:
            mbps = float(x["bw_bytes"]) / MB
            s.add(x["config"], f"{j['job']}_MBps", "MB/s", True, x["rep"], x.get("order", 0), mbps)
    return s.rows, goals


def startup_samples(doc: dict[str, Any]) -> tuple[list[Sample], list[dict[str, Any]]]:
    """Samples and goals of one ``startup.run`` document (config = its kind).

    ``up_s_<N>`` and ``down_s_<N>`` in seconds, lower is better; the goal (container
    clusters): ``up_s_8`` median below 2 s.
    """
    kind, s = str(doc.get("kind", "container")), _Samples("startup")
    for size in doc["sizes"]:
        for r in size["runs"]:
            for what in ("up", "down"):
                metric = f"{what}_s_{size['nodes']}"
                s.add(kind, metric, "s", False, r["rep"], r.get("order", 0), r[f"{what}_s"])
    goal, goals = doc.get("goal") or {}, []
    if kind == "container" and any(x.get("goal_s") is not None for x in doc["sizes"]):
        goals.append(
            {
                "metric": f"up_s_{goal.get('nodes', startup.GOAL_NODES)}",
                "config": kind,
                "median_below": float(goal.get("median_below_s", startup.GOAL_S)),
            }
        )
    return s.rows, goals


# --- the suites ----------------------------------------------------------------------


def _run_hpcc(p: SuitePlan, s: Settings, progress: Progress) -> dict[str, Any]:
    doc: dict[str, Any] = suite_module("hpcc").run(
        list(p.configs), s.repeat, s.procs, progress, n_override=s.hpl_n,
        budget_s=s.time_budget_s, choice=s.blas,
    )  # fmt: skip
    return doc


def _run_isolation(p: SuitePlan, s: Settings, progress: Progress) -> dict[str, Any]:
    doc: dict[str, Any] = suite_module("isolation").run(s.repeat, s.samples, progress)
    return doc


def _run_io(p: SuitePlan, s: Settings, progress: Progress) -> dict[str, Any]:
    doc = io.run(s.repeat, s.io_seconds, progress)
    doc["samples"], doc["goals"] = io_samples(doc)
    return doc


def _run_startup(p: SuitePlan, s: Settings, progress: Progress) -> dict[str, Any]:
    """Container and/or VM start-up; one kind failing leaves the other's results."""
    doc: dict[str, Any] = {"benchmark": "cluster-startup", "kinds": {}, "samples": [], "goals": []}
    errors = {}
    for kind in p.configs:
        sizes = list(s.vm_nodes if kind == "vm" else s.startup_nodes)
        try:
            d = startup.run(sizes, s.repeat, progress, kind=kind)
        except Exception as e:
            errors[kind] = error_line(e)
            progress(f"{kind} failed: {errors[kind]}")
            continue
        samples, goals = startup_samples(d)
        doc["kinds"][kind] = d
        doc["samples"] += samples
        doc["goals"] += goals
    if errors:
        doc["error"] = "; ".join(f"{k}: {v}" for k, v in errors.items())
    return doc


RUNNERS: dict[str, Callable[[SuitePlan, Settings, Progress], dict[str, Any]]] = {
    "hpcc": _run_hpcc,
    "isolation": _run_isolation,
    "io": _run_io,
    "startup": _run_startup,
}


def checked(name: str, doc: Any) -> dict[str, Any]:
    """The suite's document with only well-formed samples (``suite`` filled in if missing)."""
    if not isinstance(doc, dict):
        return {"error": f"suite returned {type(doc).__name__}, not a document", "samples": []}
    good, bad = [], 0
    for x in doc.get("samples") or []:
        if not isinstance(x, dict):
            bad += 1
            continue
        x.setdefault("suite", name)
        if all(k in x for k in SAMPLE_KEYS) and isinstance(x["value"], int | float):
            good.append(x)
        else:
            bad += 1
    doc["samples"] = good
    doc.setdefault("goals", [])
    if bad:
        doc["error"] = (doc.get("error", "") + f"; {bad} malformed samples dropped").lstrip("; ")
    return doc


def _clock(s: float) -> str:
    m, sec = divmod(int(s), 60)
    return f"{m // 60}:{m % 60:02d}:{sec:02d}" if m >= 60 else f"{m}:{sec:02d}"


@dataclass
class Steps:
    """Progress lines: ``[suite k/n] step i, elapsed (+ in this suite): message``."""

    emit: Progress
    total: int
    t0: float = field(default_factory=time.monotonic)

    def suite(self, name: str, k: int) -> Progress:
        start, count = time.monotonic(), [0]

        def line(msg: str) -> None:
            count[0] += 1
            now = time.monotonic()
            self.emit(
                f"[{name} {k}/{self.total}] step {count[0]}, {_clock(now - self.t0)}"
                f" (+{_clock(now - start)}): {msg}"
            )

        return line


def run(
    plans: list[SuitePlan],
    settings: Settings,
    targets: list[str],
    out: Path,
    argv: list[str],
    progress: Progress = quiet,
) -> dict[str, Any]:
    """Run every planned suite in turn; results.json is rewritten after each suite."""
    started = time.time()
    doc: dict[str, Any] = {
        "harness": {
            "argv": argv,
            "started": _iso(started),
            "finished": None,
            "wall_s": None,
            "suites": [p.suite for p in plans],
            "targets": targets,
            "repeat": settings.repeat,
            "settings": asdict(settings),
            "configs": {p.suite: list(p.configs) for p in plans},
            "suite_wall_s": {},
            "notes": {p.suite: p.note for p in plans if p.note},
        },
        "host": common.host_facts(),
        "accelerator": common.accelerator(),
        "suites": {},
        "samples": [],
    }
    todo = [p for p in plans if p.configs]
    steps = Steps(progress, len(todo))
    for p in plans:  # in plan order; "pending" stays if the run is interrupted
        state = {"pending": "not run (interrupted)"} if p.configs else {"skipped": p.note}
        doc["suites"][p.suite] = {**state, "samples": [], "goals": []}
        if not p.configs:
            progress(f"[{p.suite}] skipped: {p.note}")
    for k, p in enumerate(todo, 1):
        say = steps.suite(p.suite, k)
        say(f"start: {', '.join(p.configs)}")
        t0 = time.monotonic()
        try:
            sdoc = checked(p.suite, RUNNERS[p.suite](p, settings, say))
        except Exception as e:  # one suite failing must not lose the others
            sdoc = {"error": error_line(e), "samples": [], "goals": []}
        doc["harness"]["suite_wall_s"][p.suite] = round(time.monotonic() - t0, 3)
        say("failed: " + sdoc["error"] if sdoc.get("error") else "done")
        doc["suites"][p.suite] = sdoc
        doc["samples"] = [x for d in doc["suites"].values() for x in d.get("samples", [])]
        write_json(out, doc)
    doc["harness"]["finished"] = _iso(time.time())
    doc["harness"]["wall_s"] = round(time.time() - started, 3)
    write_json(out, doc)
    return doc


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def failed_suites(doc: dict[str, Any]) -> dict[str, str]:
    return {k: str(v["error"]) for k, v in doc["suites"].items() if v.get("error")}


def write_json(out: Path, doc: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(out / "results.json")


def load(directory: Path) -> dict[str, Any]:
    """A run's results.json, checked to be one written by ``hpvc bench run``."""
    path = directory / "results.json"
    fix = "give a directory written by `hpvc bench run --out DIR`"
    if not path.is_file():
        raise InputError(str(directory), "no results.json there", fix)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(str(path), f"not readable JSON ({e})", fix) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("suites"), dict):
        raise InputError(str(path), "not the results of `hpvc bench run` (no suites)", fix)
    return doc
