"""hpcc's output: the summary section of ``hpccoutf.txt`` read into the suite's metrics.

hpcc appends to its output file, so only the last summary counts; ``checked``
also proves that hpcc read our input (its N) and passed its own checks. Pure:
text in, numbers out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hpvc.errors import HpvcError

SUITE = "hpcc"


@dataclass(frozen=True)
class Metric:
    key: str
    field: str  # in hpccoutf.txt's summary
    unit: str
    higher_is_better: bool
    scale: float = 1.0  # field value -> unit


# "Star": every rank runs it at once; the figure is the mean per rank.
METRICS = (
    Metric("HPL", "HPL_Tflops", "GFLOP/s", True, 1000.0),
    Metric("DGEMM", "StarDGEMM_Gflops", "GFLOP/s", True),
    Metric("STREAM_Triad", "StarSTREAM_Triad", "GB/s", True),
    Metric("STREAM_Copy", "StarSTREAM_Copy", "GB/s", True),
    Metric("RandomAccess", "StarRandomAccess_GUPs", "GUP/s", True),
    Metric("FFT", "StarFFT_Gflops", "GFLOP/s", True),
    Metric("PingPong_latency", "AvgPingPongLatency_usec", "us", False),
    Metric("PingPong_bandwidth", "AvgPingPongBandwidth_GBytes", "GB/s", True),
)


def summary_fields(text: str) -> dict[str, str]:
    """``Key=value`` lines of the last summary section (hpcc appends to its output)."""
    begin = text.rfind("Begin of Summary section.")
    end = text.find("End of Summary section.", begin)
    if begin < 0 or end < 0:
        tail = "\n".join(text.strip().splitlines()[-8:]) or "(no output)"
        raise HpvcError(
            "hpcc",
            f"no summary section in its output (it failed or was cut short); last lines:\n{tail}",
            "run hpcc by hand in a directory with the same hpccinf.txt",
        )
    out: dict[str, str] = {}
    for line in text[begin:end].splitlines()[1:]:
        key, eq, value = line.partition("=")
        if eq:
            out[key.strip()] = value.strip()
    return out


def rank0_host(text: str) -> str:
    """The host (node) hpcc's rank 0 ran on, from the output's header."""
    found = re.findall(r"^Hostname: '([^']*)'", text, re.M)
    return found[-1] if found else ""


def parse(text: str) -> dict[str, float]:
    """The METRICS of an hpccoutf.txt, in their units (HPL in GFLOP/s)."""
    fields = summary_fields(text)
    missing = [m.field for m in METRICS if m.field not in fields]
    if missing:
        raise HpvcError("hpcc", f"summary lacks {', '.join(missing)}", "")
    return {m.key: float(fields[m.field]) * m.scale for m in METRICS}


def checked(text: str, n: int, what: str) -> dict[str, float]:
    """parse(), and proof that hpcc read our input (its N) and passed its checks."""
    fields = summary_fields(text)
    if fields.get("HPL_N") != str(n):
        raise HpvcError(
            what,
            f"hpcc ran N={fields.get('HPL_N')}, not {n}",
            "it did not read a valid hpccinf.txt and fell back to its defaults",
        )
    if fields.get("Success") != "1":
        raise HpvcError(what, "hpcc reports Success != 1 (a check failed)", "see hpccoutf.txt")
    return parse(text)
