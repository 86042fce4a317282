"""``hpvc bench network``, the pure half: the tools' output, the pairing, the goals, report.md.

The captured outputs below are real (iperf3 3.12 and sockperf 3.7 on Debian
bookworm, over loopback in a namespace), trimmed to what the parsers read.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from hpvc.bench.network import report as network_report
from hpvc.bench.network import runner as network
from hpvc.bench.network.report import build, goals, parse_iperf3, parse_sockperf, report_md
from hpvc.cli import main
from hpvc.errors import HpvcError, MissingDependency

IPERF3 = """{
  "start": {"version": "iperf 3.12", "test_start": {"protocol": "TCP", "num_streams": 1,
            "blksize": 131072, "omit": 0, "duration": 1}},
  "intervals": [],
  "end": {
    "streams": [],
    "sum_sent": {"start": 0, "end": 1.00012, "seconds": 1.00012, "bytes": 2707947520,
                 "bits_per_second": 21660980842.298927, "retransmits": 5, "sender": true},
    "sum_received": {"start": 0, "end": 1.000653, "seconds": 1.000653, "bytes": 2707947308,
                     "bits_per_second": 21649441378.779655, "sender": true},
    "cpu_utilization_percent": {"host_total": 96.6240095067381, "host_user": 0.911927860634415,
                                "host_system": 95.7120816461037, "remote_total": 43.6499600764693,
                                "remote_user": 0.5585296948123394,
                                "remote_system": 43.0912305141691},
    "sender_tcp_congestion": "cubic", "receiver_tcp_congestion": "cubic"
  }
}"""

IPERF3_REFUSED = """{
\t"start":\t{
\t\t"connected":\t[],
\t\t"version":\t"iperf 3.12",
\t\t"system_info":\t"Linux vm 6.18.44-fc-v669 #1 SMP PREEMPT_DYNAMIC @0 x86_64"
\t},
\t"intervals":\t[],
\t"end":\t{
\t},
\t"error":\t"unable to connect to server: Connection refused"
}"""

SOCKPERF = """\
sockperf: \x1b[2;35m== version #3.7-no.git == \x1b[0m
sockperf[CLIENT] send on:sockperf: using recvfrom() to block on socket(s)

[ 0] IP = 127.0.0.1       PORT = 11111 # TCP
sockperf: Warmup stage (sending a few dummy messages)...
sockperf: Starting test...
sockperf: Test end (interrupted by timer)
sockperf: Test ended
sockperf: [Total Run] RunTime=1.000 sec; Warm up time=400 msec; SentMessages=20561
sockperf: ========= Printing statistics for Server No: 0
sockperf: [Valid Duration] RunTime=0.550 sec; SentMessages=9474; ReceivedMessages=9474
sockperf: \x1b[2;35m====> avg-latency=29.010 (std-dev=10.615)\x1b[0m
sockperf: # dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0
sockperf: Summary: Latency is 29.010 usec
sockperf: \x1b[2;35mTotal 9474 observations\x1b[0m; each percentile contains 94.74 observations
sockperf: ---> <MAX> observation =  752.771
sockperf: ---> percentile 99.999 =  752.771
sockperf: ---> percentile 99.990 =  429.738
sockperf: ---> percentile 99.900 =   64.090
sockperf: ---> percentile 99.000 =   44.220
sockperf: ---> percentile 90.000 =   35.442
sockperf: ---> percentile 75.000 =   29.644
sockperf: ---> percentile 50.000 =   27.480
sockperf: ---> percentile 25.000 =   26.669
sockperf: ---> <MIN> observation =    9.779
"""

# sockperf exits 0 when it cannot connect: only its output tells.
SOCKPERF_REFUSED = """\
sockperf: \x1b[2;35m== version #3.7-no.git == \x1b[0m
sockperf: ERROR: Can`t connect socket (errno=111 Connection refused)
"""


def test_iperf3_gives_the_receivers_rate_and_context() -> None:
    got = parse_iperf3(IPERF3)
    assert got["value"] == pytest.approx(21.649441, rel=1e-6)  # Gbit/s received
    assert got["sender_gbps"] == pytest.approx(21.660981, rel=1e-6)
    assert got["retransmits"] == 5
    assert got["bytes"] == 2707947308
    assert got["cpu_sender_pct"] == pytest.approx(96.62, abs=0.01)
    assert got["cpu_receiver_pct"] == pytest.approx(43.65, abs=0.01)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (IPERF3_REFUSED, "unable to connect to server: Connection refused"),
        ("iperf3: error - unable to connect", "not JSON"),
        ('{"start": {}, "end": {}}', "no end summary"),
    ],
)
def test_iperf3_failures_are_one_line(text: str, why: str) -> None:
    with pytest.raises(HpvcError) as e:
        parse_iperf3(text)
    assert why in e.value.why
    assert "\n" not in e.value.line()


def test_sockperf_latencies_without_colour_codes() -> None:
    got = parse_sockperf(SOCKPERF)
    assert got["value"] == got["p50_us"] == 27.48
    assert (got["avg_us"], got["stdev_us"], got["p99_us"]) == (29.01, 10.615, 44.22)
    assert (got["min_us"], got["max_us"], got["observations"]) == (9.779, 752.771, 9474)


def test_sockperf_error_is_its_own_line() -> None:
    with pytest.raises(HpvcError) as e:
        parse_sockperf(SOCKPERF_REFUSED)
    assert e.value.why == "Can`t connect socket (errno=111 Connection refused)"
    with pytest.raises(HpvcError, match="no avg_us"):
        parse_sockperf("sockperf: Test ended\n")


def sample(rep: int, side: str, metric: str, value: float, **extra: float) -> dict[str, Any]:
    return {"rep": rep, "order": 0, "side": side, "metric": metric, "value": value, **extra}


def samples(bw: list[tuple[float, float]], lat: list[tuple[float, float]]) -> list[dict[str, Any]]:
    """(fabric, node) per repetition for bandwidth and latency."""
    out = []
    for rep, (f, n) in enumerate(bw):
        out += [sample(rep, "fabric", "bandwidth", f), sample(rep, "node", "bandwidth", n)]
    for rep, (f, n) in enumerate(lat):
        for side, v in (("fabric", f), ("node", n)):
            out.append(sample(rep, side, "latency", v, avg_us=v + 1, p99_us=2 * v))
    return out


def test_ratios_are_paired_per_repetition() -> None:
    # Unpaired medians would give 9.5 / 15 = 0.63; paired: 0.9 and 0.5.
    rows = network_report.summarize(samples([(10, 9), (20, 10)], [(10, 12), (20, 22)]))
    bw = rows["bandwidth"]
    assert bw["ratios"] == [0.9, 0.5]
    assert bw["ratio"] == {"n": 2, "min": 0.5, "median": pytest.approx(0.7), "max": 0.9}
    assert bw["fabric"] == {"min": 10, "median": 15, "max": 20}
    assert rows["latency"]["ratios"] == [1.2, 1.1]
    assert rows["latency_avg"]["ratios"] == [13 / 11, 23 / 21]
    assert rows["latency_p99"]["node"]["max"] == 44


def test_a_repetition_missing_a_side_is_not_paired() -> None:
    s = samples([(10, 9), (20, 10)], [(10, 12)])
    s = [x for x in s if not (x["rep"] == 1 and x["side"] == "node")]
    rows = network_report.summarize(s)
    assert rows["bandwidth"]["ratios"] == [0.9]
    assert rows["bandwidth"]["fabric"]["max"] == 20  # every sample still counts


@pytest.mark.parametrize(
    ("bw", "lat", "met"),
    [
        ((10, 9), (10, 12), (True, True)),  # 0.90 and 1.2: on the line is met
        ((10, 8.9), (10, 12.1), (False, False)),
        ((10, 11), (10, 5), (True, True)),  # faster than the fabric
    ],
)
def test_goals_bandwidth_at_least_latency_at_most(
    bw: tuple[float, float], lat: tuple[float, float], met: tuple[bool, bool]
) -> None:
    got = goals(network_report.summarize(samples([bw], [lat])))
    assert [g["row"] for g in got] == ["bandwidth", "latency"]
    assert (got[0]["met"], got[1]["met"]) == met


def test_a_goal_without_samples_is_not_met() -> None:
    got = goals(network_report.summarize(samples([(10, 9)], [])))
    assert got[1]["median"] is None and got[1]["met"] is False


FACTS = {
    "host": "vm",
    "cpu_model": "AMD EPYC",
    "cpus": 2,
    "kernel": "6.1",
    "date": "2026-11-23T00:00:00Z",
}
PARAMS = {
    "repeat": 2,
    "seconds": 1,
    "message_bytes": 64,
    "tools": {"iperf3": "iperf 3.12", "sockperf": "sockperf version 3.7"},
    "sides": {"fabric": "host A to host B", "node": "node A to node B"},
    "pinning": {"host_a": 0, "host_b": 1},
    "testbed": {"what": "namespaces", "fabric_mtu": 9000, "node_mtu": 8950, "vni": 7},
}


def test_document_and_report() -> None:
    doc = build(FACTS, PARAMS, samples([(20, 15), (10, 8)], [(30, 36), (28, 31)]))
    assert json.loads(json.dumps(doc)) == doc
    assert doc["benchmark"] == "network" and len(doc["samples"]) == 8
    assert doc["meets_goal"] is False  # bandwidth 0.775, latency 1.15
    md = report_md(doc)
    assert "| node/fabric bandwidth >= 0.90 | 0.775 | 0.750 / 0.800 | **no** |" in md
    assert "| node/fabric latency <= 1.2 | 1.154 | 1.107 / 1.200 | yes |" in md
    assert "| 1 | 20 | 15 | 0.750 | 30 | 36 | 1.200 |" in md
    assert "| 2 | 10 | 8 | 0.800 | 28 | 31 | 1.107 |" in md
    assert "namespaces on this one machine" in md and "not a NIC" in md
    assert "CPU 0" in md and "CPU 1" in md
    assert "on vm (AMD EPYC, 2 CPUs)" in md  # the pinning does not hide the host's facts
    assert "Goals (median of the ratios paired per repetition): not met." in md


def _with_knobs(on: bool, value: int | None) -> dict[str, Any]:
    knobs = {} if value is None else {"bridge-nf-call-iptables": value}
    bed: dict[str, Any] = {**PARAMS["testbed"], "bridge_netfilter": on}
    bed["bridge_netfilter_knobs"] = {"fab": knobs, "a": knobs, "b": knobs}
    return {**PARAMS, "testbed": bed}


@pytest.mark.parametrize(
    ("on", "value", "says"),
    [
        (False, 0, "Bridge netfilter: off in the fabric's and the hosts' namespaces"),
        (True, 1, "Bridge netfilter: on in the fabric's and the hosts' namespaces"),
        (False, None, "Bridge netfilter: not in this kernel"),
    ],
)
def test_report_says_whether_bridged_frames_met_the_firewall_hooks(
    on: bool, value: int | None, says: str
) -> None:
    doc = build(FACTS, _with_knobs(on, value), samples([(20, 15)], [(30, 36)]))
    md = report_md(doc)
    assert says in md
    if value is not None:
        assert f"bridge-nf-call-iptables/ip6tables/arptables = {value})" in md
    # Documents from before the setting existed still render, without the line.
    assert "Bridge netfilter" not in report_md(build(FACTS, PARAMS, samples([(2, 1)], [])))


def test_report_says_which_cpu_did_each_hosts_receive_work() -> None:
    steered = {**PARAMS, "testbed": {**PARAMS["testbed"], "rx_cpus": {"host_a": 0, "host_b": 1}}}
    md = report_md(build(FACTS, steered, samples([(20, 15)], [(30, 36)])))
    assert "what arrives at host A is processed on CPU 0, at host B on CPU 1" in md
    md = report_md(build(FACTS, PARAMS, samples([(20, 15)], [(30, 36)])))
    assert "one CPU does both hosts' part of a packet's path" in md


def test_preflight_names_the_missing_tool_and_its_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(network.os, "geteuid", lambda: 0)
    monkeypatch.setattr(network.shutil, "which", lambda t: None if t == "sockperf" else t)
    with pytest.raises(MissingDependency) as e:
        network.preflight(2, 1)
    assert e.value.line() == "bench network: sockperf not found (apt-get install sockperf)"


def test_cli_missing_iperf3_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(network.os, "geteuid", lambda: 0)
    monkeypatch.setattr(network.shutil, "which", lambda t: None if t == "iperf3" else t)
    with pytest.raises(SystemExit) as e:
        main(["bench", "network", "--repeat", "2"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == "hpvc: bench network: iperf3 not found (apt-get install iperf3)"


def test_cli_help_has_examples_and_refuses_bad_numbers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as e:
        main(["bench", "network", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "hpvc bench network --repeat 10" in out and "--seconds" in out
    with pytest.raises(SystemExit) as e:
        main(["bench", "network", "--seconds", "0"])
    assert e.value.code == 2
