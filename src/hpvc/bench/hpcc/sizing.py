"""HPL's N for this machine: the cache asks for it, memory and a time budget cap it.

The cache: ``input.problem_size`` wants a matrix of at least ``LLC_FACTOR`` x the
last-level cache (so STREAM's arrays, sized from N, measure memory, not the
cache). On a Xeon with a 480 MiB L3 that is N = 15872, and one native run with
the reference BLAS took over 6 minutes (issue 33). So N is then capped:

- by memory: a node of ``node_memory_mib(N)`` (4 x the matrix: hpcc's tests,
  MPI, the OS) must fit in what the host can give (its free memory, as the
  planner counts it); one run is measured at a time, so one node's worth;
- by time: one run must fit ``budget_s`` (default ``BUDGET_S``). A short probe,
  one native hpcc run at a small N with the suite's BLAS, gives HPL's flop
  rate and the time of hpcc's other tests (STREAM, RandomAccess, FFT, PTRANS,
  whose work grows with the matrix, N^2); a run at N is then predicted as
  HPL's 2/3 N^3 + 2 N^2 flops at the probe's rate (a small N runs below the
  rate of a large one, so this errs long) plus the other tests scaled by N^2.

``--hpl-n`` sets N by hand: it is kept even over the budget (the prediction is
reported) but refused when the nodes do not fit in memory. Every cap taken is
said in ``reasons``, which results.json and report.md carry. Pure: numbers in,
numbers out; the probe itself is run by ``runner``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hpvc.bench.hpcc.input import LLC_FACTOR, MATRIX_MIB, NB, node_memory_mib, problem_size
from hpvc.errors import InputError

BUDGET_S = 60.0  # one native hpcc run, all its tests
PROBE_N = 2048  # ~5 s native with OpenBLAS on a 2-CPU EPYC VM, ~40 s with the reference BLAS


@dataclass(frozen=True)
class Probe:
    """One short native hpcc run: its N, wall time, HPL's part of it and HPL's rate."""

    n: int
    wall_s: float
    hpl_s: float
    hpl_gflops: float

    def as_dict(self) -> dict[str, float]:
        return {"n": self.n, "wall_s": self.wall_s, "hpl_s": self.hpl_s,
                "hpl_gflops": self.hpl_gflops}  # fmt: skip


@dataclass(frozen=True)
class Sizing:
    """The N chosen and why; ``*_n``: what each rule alone would allow (None: not asked)."""

    n: int
    cache_n: int
    memory_n: int
    budget_n: int | None
    predicted_s: float | None
    budget_s: float
    asked_n: int | None = None
    reasons: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, object]:
        return {
            "n": self.n,
            "cache_n": self.cache_n,
            "memory_n": self.memory_n,
            "budget_n": self.budget_n,
            "asked_n": self.asked_n,
            "budget_s": self.budget_s,
            "predicted_s": self.predicted_s,
            "reasons": list(self.reasons),
        }


def step(procs: int) -> int:
    """N is a multiple of this: whole NB blocks for every rank."""
    return NB * procs


def probe_n(procs: int) -> int:
    """The probe's N: about PROBE_N, a multiple of ``step``."""
    s = step(procs)
    return max(s, PROBE_N // s * s)


def hpl_flops(n: int) -> float:
    """The floating-point operations HPL counts for a system of order n."""
    return 2.0 / 3.0 * n**3 + 2.0 * n**2


def predict_s(n: int, probe: Probe) -> float:
    """Seconds of one native hpcc run at ``n``, from the probe (see the module's text)."""
    rate = max(probe.hpl_gflops, 1e-6) * 1e9
    other = max(probe.wall_s - probe.hpl_s, 0.0) * (n / probe.n) ** 2
    return hpl_flops(n) / rate + other


def budget_n(probe: Probe, budget_s: float, procs: int) -> int:
    """The largest N (a multiple of ``step``, at least one step) predicted within budget."""
    s = step(procs)
    n = s
    while predict_s(n + s, probe) <= budget_s:
        n += s
    return n


def memory_n(mem_mib: int, procs: int) -> int:
    """The largest N whose node of ``node_memory_mib(N)`` fits in ``mem_mib`` (at least
    one step: a host that small fails at ``hpvc up``, which says why)."""
    s = step(procs)
    each = mem_mib
    n = math.isqrt(max(each, 0) * 2**20 // 32) // s * s  # node_memory_mib: 4 x 8 N^2 bytes
    while n > s and node_memory_mib(n) > each:
        n -= s
    return max(n, s)


def choose(
    *,
    llc_bytes: int,
    procs: int,
    mem_mib: int,
    budget_s: float = BUDGET_S,
    probe: Probe | None = None,
    asked_n: int | None = None,
) -> Sizing:
    """HPL's N on a host of ``mem_mib`` free memory and a ``llc_bytes`` last-level cache
    (``probe``: None skips the time budget)."""
    cache = problem_size(MATRIX_MIB, procs, llc_bytes)
    mem = memory_n(mem_mib, procs)
    tmax = budget_n(probe, budget_s, procs) if probe else None
    llc_mib = llc_bytes / 2**20
    if asked_n is not None:
        check_asked(asked_n, mem_mib, procs)
        pred = predict_s(asked_n, probe) if probe else None
        why = [f"N={asked_n} as asked (--hpl-n)"]
        if pred is not None and pred > budget_s:
            why.append(f"predicted {pred:.0f} s per native run, over the {budget_s:.0f} s budget")
        return Sizing(asked_n, cache, mem, tmax, pred, budget_s, asked_n, tuple(why))
    n, why = (
        cache,
        [
            f"cache: N={cache} (matrix >= {LLC_FACTOR} x the {llc_mib:.0f} MiB last-level cache"
            f" and about {MATRIX_MIB} MiB)"
        ],
    )
    if mem < n:
        n = mem
        why.append(
            f"scaled down to N={mem} by memory: a node of {node_memory_mib(mem)} MiB"
            f" (4 x the matrix) must fit in the {mem_mib} MiB this host can give"
        )
    if tmax is not None and probe is not None and tmax < n:
        n = tmax
        why.append(
            f"scaled down to N={tmax} by the time budget: {budget_s:.0f} s per native run"
            f" (probe at N={probe.n}: HPL {probe.hpl_gflops:.2f} GFLOP/s, the other tests"
            f" {probe.wall_s - probe.hpl_s:.1f} s)"
        )
    if 8 * n * n < LLC_FACTOR * llc_bytes:
        why.append(
            f"the matrix ({8 * n * n / 2**20:.0f} MiB) is under {LLC_FACTOR} x the last-level"
            " cache: STREAM and RandomAccess partly measure the cache, not memory"
        )
    pred = predict_s(n, probe) if probe else None
    return Sizing(n, cache, mem, tmax, pred, budget_s, None, tuple(why))


def check_asked(asked_n: int, mem_mib: int, procs: int) -> None:
    """InputError (exit 2) when ``--hpl-n`` cannot run here: not positive, or its node
    of ``node_memory_mib`` does not fit in ``mem_mib``."""
    if asked_n < 1:
        raise InputError(f"--hpl-n {asked_n}", "not a positive number", "--hpl-n 4096")
    most = memory_n(mem_mib, procs)
    if asked_n > most:
        raise InputError(
            f"--hpl-n {asked_n}",
            f"needs {node_memory_mib(asked_n)} MiB (4 x its matrix);"
            f" this host can give {mem_mib} MiB",
            f"--hpl-n {most} or less",
        )
