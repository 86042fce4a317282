"""``hpvc bench run``: every suite in one run, one results.json, one report, plots.

Each suite returns a document with a flat list of ``samples`` (suite, config,
metric, unit, higher_is_better, rep, order, value) and a list of ``goals``.
``hpcc`` and ``isolation`` write that shape themselves; ``io`` and ``startup``
predate it and go through the adapters below. The harness only reads samples:
the goal table, the per-config summaries, the paired ratios against the
baseline and the plots are all computed from them, so ``hpvc bench report``
re-renders a run from its results.json without measuring anything, and
``hpvc bench compare`` can put any two runs side by side.

A suite that fails is recorded with its error and the others still run; the
run then ends with exit code 1.
"""

from __future__ import annotations

import importlib
import json
import math
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpvc.bench import common, io, startup
from hpvc.bench.stats import summary
from hpvc.errors import HpvcError, InputError

Progress = Callable[[str], None]
Sample = dict[str, Any]

SUITES = ("hpcc", "isolation", "io", "startup")
TARGETS = ("native", "container", "vm")
# The config every other config of the suite is paired with (ratios per repetition).
BASELINE = {"hpcc": "native", "isolation": "idle", "io": "native"}
HPCC_CONTAINER = ("container", "container-nopin", "container-nohuge", "container-nonuma")
ISOLATION_CONFIGS = ("idle", "partitioned", "shared")
SAMPLE_KEYS = ("suite", "config", "metric", "unit", "higher_is_better", "rep", "order", "value")
MB = 1_000_000


def _quiet(_: str) -> None:
    pass


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
    pct = float(doc.get("goal", {}).get("throttle_abs_error_pct_at_most", io.GOAL_ERROR_PCT))
    order_t = [(label, job.key) for label, job, _ in io.throttle_targets()]
    for t in doc.get("throttle", []):
        name, key = f"{t['node']}_{t['direction']}", (t["node"], t["job"])
        target = float(t["target_bps"])
        for x in t["samples"]:
            rot = io.rotate(order_t, int(x["rep"]))
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
    weight_jobs = [j.key for j in io.WEIGHT_JOBS]
    for w in doc.get("weight", []):
        for x in w["samples"]:
            rot = io.rotate(weight_jobs, int(x["rep"]))
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


def _module(name: str) -> Any:
    """A suite written apart from the harness (hpcc, isolation), imported when used."""
    try:
        return importlib.import_module(f"hpvc.bench.{name}")
    except ImportError as e:
        raise HpvcError(f"suite {name}", f"cannot import hpvc.bench.{name}: {e}") from None


def _run_hpcc(p: SuitePlan, s: Settings, progress: Progress) -> dict[str, Any]:
    doc: dict[str, Any] = _module("hpcc").run(list(p.configs), s.repeat, s.procs, progress)
    return doc


def _run_isolation(p: SuitePlan, s: Settings, progress: Progress) -> dict[str, Any]:
    doc: dict[str, Any] = _module("isolation").run(s.repeat, s.samples, progress)
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
            errors[kind] = _error_line(e)
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


def _error_line(e: BaseException) -> str:
    return e.line() if isinstance(e, HpvcError) else f"{type(e).__name__}: {e}"


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
    progress: Progress = _quiet,
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
        "accelerator": accelerator(),
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
            sdoc = {"error": _error_line(e), "samples": [], "goals": []}
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


def accelerator() -> dict[str, Any]:
    """The VM accelerator of this host (kvm or tcg) and why, for reading the VM figures."""
    try:
        from hpvc.backends import vm_qemu

        a = vm_qemu.accelerator()
    except Exception as e:
        return {"vm": None, "error": _error_line(e)}
    return {"vm": a.name, "forced": a.forced, "note": a.warning}


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


# --- numbers from samples --------------------------------------------------------------


def select(samples: list[Sample], config: str, metric: str) -> list[float]:
    return [float(x["value"]) for x in samples if x["config"] == config and x["metric"] == metric]


def keys(samples: list[Sample]) -> list[tuple[str, str]]:
    """(metric, config) pairs in first-seen order."""
    return list(dict.fromkeys((str(x["metric"]), str(x["config"])) for x in samples))


def per_rep(samples: list[Sample], config: str, metric: str) -> dict[int, float]:
    """Mean value per repetition (suites may take several samples per repetition)."""
    by: dict[int, list[float]] = {}
    for x in samples:
        if x["config"] == config and x["metric"] == metric:
            by.setdefault(int(x["rep"]), []).append(float(x["value"]))
    return {r: statistics.fmean(v) for r, v in by.items()}


def higher_is_better(samples: list[Sample], metric: str) -> bool:
    return next((bool(x["higher_is_better"]) for x in samples if x["metric"] == metric), True)


def better_ratio(base: float, other: float, hib: bool) -> float:
    """``other`` against ``base``, direction-aware: > 1 means ``other`` is better."""
    num, den = (other, base) if hib else (base, other)
    if den == 0:
        return math.inf if num > 0 else math.nan
    return num / den


def paired_ratios(samples: list[Sample], metric: str, config: str, baseline: str) -> list[float]:
    """One ratio per repetition both configs ran (higher is better, 1.0 = as the baseline)."""
    a, b = per_rep(samples, baseline, metric), per_rep(samples, config, metric)
    hib = higher_is_better(samples, metric)
    return [better_ratio(a[r], b[r], hib) for r in sorted(a.keys() & b.keys())]


def stdev(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _metrics_of(samples: list[Sample], goal: dict[str, Any]) -> list[str]:
    m = goal.get("metric")
    if m and m != "*":
        return [str(m)]
    return list(dict.fromkeys(str(x["metric"]) for x in samples if x["config"] == goal["config"]))


@dataclass(frozen=True)
class GoalResult:
    suite: str
    text: str
    figure: str
    met: bool | None  # None: nothing measured to decide it
    value: float | None = None


# goal key -> (what it says, the worst of several metrics' figures, the test)
GOAL_KINDS: dict[
    str, tuple[str, Callable[[list[float]], float], Callable[[float, float], bool]]
] = {
    "median_ratio_at_least": ("median ratio vs {vs} ≥ {thr:g}", min, lambda f, t: f >= t),
    "stdev_vs_idle_at_most": ("stdev / stdev of {vs} ≤ {thr:g}", max, lambda f, t: f <= t),
    "within_pct": ("median within {thr:g}% of target", max, lambda f, t: f <= t),
    "median_below": ("median < {thr:g}", max, lambda f, t: f < t),
    "median_at_most": ("median ≤ {thr:g}", max, lambda f, t: f <= t),
    "median_at_least": ("median ≥ {thr:g}", min, lambda f, t: f >= t),
}


def _figure(
    kind: str, goal: dict[str, Any], samples: list[Sample], cfg: str, metric: str, vs: str
) -> float | None:
    """One metric's figure for a goal of ``kind``; None when it was not measured."""
    if kind == "median_ratio_at_least":
        r = paired_ratios(samples, metric, cfg, vs)
        return statistics.median(r) if r else None
    if kind == "stdev_vs_idle_at_most":
        a, b = select(samples, vs, metric), select(samples, cfg, metric)
        if len(a) < 2 or len(b) < 2:
            return None
        return stdev(b) / stdev(a) if stdev(a) > 0 else math.inf
    v = select(samples, cfg, metric)
    if not v:
        return None
    if kind == "within_pct":
        return abs(statistics.median(v) / float(goal.get("target", 1.0)) - 1) * 100
    return statistics.median(v)


def evaluate(
    suite: str, goal: dict[str, Any], samples: list[Sample], apart: dict[str, str] | None = None
) -> GoalResult:
    """Decide a goal from the samples (never from a ``met`` the suite wrote).

    A goal without a metric (or ``"*"``) holds for every metric of its config; the
    figure is then the worst one.
    """
    cfg, apart = str(goal.get("config", "")), apart or {}
    name = f"{cfg} {goal.get('metric') or 'every metric'}"
    kind = next((k for k in GOAL_KINDS if k in goal), None)
    if kind is None:
        met = goal.get("met")
        flag = met if isinstance(met, bool) else None
        return GoalResult(suite, f"{name}: {json.dumps(goal)}", "as the suite reports", flag)
    says, worst, test = GOAL_KINDS[kind]
    thr = float(goal[kind])
    default_vs = "idle" if kind == "stdev_vs_idle_at_most" else BASELINE.get(suite, "")
    vs = str(goal.get("vs", default_vs))
    text = f"{name}: " + says.format(vs=vs, thr=thr)
    if cfg in apart:
        return GoalResult(suite, text, f"not comparable: {apart[cfg]}", None)
    metrics = _metrics_of(samples, goal)
    figs = [_figure(kind, goal, samples, cfg, m, vs) for m in metrics]
    if not figs or any(f is None for f in figs):
        return GoalResult(suite, text, "no samples", None)
    fig = worst([f for f in figs if f is not None])
    shown = f"{fig:.2f}%" if kind == "within_pct" else f"{fig:.3g}"
    return GoalResult(suite, text, shown, test(fig, thr), fig)


def goal_results(doc: dict[str, Any]) -> list[GoalResult]:
    out = []
    for name, sdoc in doc["suites"].items():
        if sdoc.get("error") and not sdoc.get("samples"):
            out.append(GoalResult(name, f"suite failed: {sdoc['error']}", "", False))
            continue
        samples, apart = sdoc.get("samples", []), sdoc.get("not_comparable") or {}
        ran = {s["config"] for s in samples}
        # A goal about a configuration this run did not measure (--targets
        # without container) is not a failed goal: leave it out.
        goals = [g for g in sdoc.get("goals", []) if not g.get("config") or g["config"] in ran]
        out += [evaluate(name, g, samples, apart) for g in goals]
    return out


# --- the report --------------------------------------------------------------------------


def num(v: float) -> str:
    if math.isnan(v) or math.isinf(v):
        return str(v)
    return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.0f}"


def _yes(met: bool | None) -> str:
    return "n/a" if met is None else "yes" if met else "no"


def sample_table(suite: str, samples: list[Sample], apart: dict[str, str]) -> list[str]:
    """Per metric and config: n, min / median / max, stdev, and the paired ratios to the
    baseline (none for configs the suite marks not comparable, with why)."""
    base = BASELINE.get(suite)
    lines = [
        "| metric (unit) | config | n | min | median | max | stdev | ratio min / median / max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for metric, cfg in keys(samples):
        v = select(samples, cfg, metric)
        s = summary(v)
        unit = next(x["unit"] for x in samples if x["metric"] == metric)
        ratio = ""
        if base and cfg == base:
            ratio = "1 (baseline)"
        elif cfg in apart:
            ratio = f"not comparable: {apart[cfg]}"
        elif base and (r := paired_ratios(samples, metric, cfg, base)):
            ratio = " / ".join(f"{x:.3f}" for x in summary(r).values())
        lines.append(
            f"| {metric} ({unit}) | {cfg} | {len(v)} | {num(s['min'])} | "
            f"{num(s['median'])} | {num(s['max'])} | {num(stdev(v))} | {ratio} |"
        )
    return lines


def _suite_text(name: str, sdoc: dict[str, Any]) -> str:
    """The suite's own report, or why there is none (a broken report must not stop ours)."""
    try:
        if name == "startup":
            return "\n".join(startup.report_md(d) for d in sdoc.get("kinds", {}).values())
        mod = io if name == "io" else _module(name)
        return str(mod.report_md(sdoc))
    except Exception as e:
        return f"(the suite's own report failed: {_error_line(e)})\n"


def _header(doc: dict[str, Any]) -> list[str]:
    h, host, acc = doc["harness"], doc.get("host", {}), doc.get("accelerator") or {}
    wall = f"{h['wall_s']:.0f} s" if h.get("wall_s") is not None else "unfinished"
    return [
        "# hpvc benchmark run",
        "",
        f"`{' '.join(h.get('argv') or ['hpvc', 'bench', 'run'])}`: suites"
        f" {', '.join(h['suites'])}; targets {', '.join(h['targets'])}; {h['repeat']}"
        f" repetitions; started {h['started']}, {wall}.",
        "",
        f"Host {host.get('host')} ({host.get('cpu_model')}, {host.get('cpus')} CPUs"
        + "".join(f", {k} {host[k]}" for k in ("kernel", "hpvc") if k in host)
        + "".join(f", {host[k]}" for k in ("crun", "open_mpi") if k in host)
        + f"); VM accelerator: {acc.get('vm')}.",
        "",
    ]


def report_md(doc: dict[str, Any], plots: dict[str, str] | None = None) -> str:
    plots = plots or {}
    lines = [
        *_header(doc),
        "## Goals",
        "",
        "Every figure is computed from the samples in results.json.",
        "",
    ]
    goals = goal_results(doc)
    if goals:
        lines += ["| suite | goal | figure | met |", "|---|---|---|---|"]
        lines += [f"| {g.suite} | {g.text} | {g.figure} | {_yes(g.met)} |" for g in goals]
    else:
        lines.append("No goal applies to the configurations this run measured.")
    for name, sdoc in doc["suites"].items():
        lines += ["", f"## {name}", ""]
        if sdoc.get("skipped") or sdoc.get("pending"):
            lines += [f"Skipped: {sdoc['skipped']}." if sdoc.get("skipped") else "Not run."]
            continue
        samples = sdoc.get("samples", [])
        cfgs = list(dict.fromkeys(str(x["config"]) for x in samples)) or doc["harness"].get(
            "configs", {}
        ).get(name, [])
        wall = doc["harness"].get("suite_wall_s", {}).get(name)
        lines += [f"Configs: {', '.join(cfgs)}" + (f"; {wall:.1f} s." if wall is not None else ".")]
        if sdoc.get("error"):
            lines += ["", f"**Error:** {sdoc['error']}"]
        if not samples:
            continue
        if name in plots:
            lines += ["", f"![{name}]({plots[name]})"]
        base = BASELINE.get(name)
        lines += ["", "### Samples", ""]
        if base:
            lines += [
                f"Ratio: paired per repetition with {base}, direction-aware (higher is"
                f" better, 1.0 = as {base}).",
                "",
            ]
        lines += sample_table(name, samples, sdoc.get("not_comparable") or {})
        lines += ["", "### Suite report", "", _suite_text(name, sdoc).rstrip()]
    return "\n".join(lines) + "\n"


def render(out: Path, doc: dict[str, Any]) -> tuple[Path, dict[str, str]]:
    """Write report.md and the plots next to results.json; return the report and plots."""
    from hpvc.bench import plots as plotting

    written = plotting.write_all(doc, out)
    path = out / "report.md"
    path.write_text(report_md(doc, written))
    return path, written


# --- two runs side by side -------------------------------------------------------------


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Per suite / config / metric in both runs: medians and B against A (> 1: B better)."""
    rows = []
    for suite in [s for s in a["suites"] if s in b["suites"]]:
        sa, sb = a["suites"][suite].get("samples", []), b["suites"][suite].get("samples", [])
        have_b = set(keys(sb))
        for metric, cfg in keys(sa):
            if (metric, cfg) not in have_b:
                continue
            va, vb = select(sa, cfg, metric), select(sb, cfg, metric)
            ma, mb = statistics.median(va), statistics.median(vb)
            hib = higher_is_better(sa, metric)
            rows.append(
                {
                    "suite": suite,
                    "config": cfg,
                    "metric": metric,
                    "unit": next(x["unit"] for x in sa if x["metric"] == metric),
                    "higher_is_better": hib,
                    "n_a": len(va),
                    "n_b": len(vb),
                    "median_a": ma,
                    "median_b": mb,
                    "b_vs_a": better_ratio(ma, mb, hib),
                }
            )
    if not rows:
        sa = sorted(k for k, v in a["suites"].items() if v.get("samples"))
        sb = sorted(k for k, v in b["suites"].items() if v.get("samples"))
        raise InputError(
            "bench compare",
            f"the runs share no measured suite, config and metric (A: {', '.join(sa) or 'none'};"
            f" B: {', '.join(sb) or 'none'})",
            "compare two runs of the same suites and targets",
        )
    return rows
