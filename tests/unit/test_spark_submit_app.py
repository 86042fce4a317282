"""`hpvc spark submit NAME /path/app.jar`: a jar the master node does not have
is one line with the fix before spark-submit runs (issue 32, item 8)."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace
from typing import Any

import pytest

from hpvc.cluster import ops
from hpvc.cluster import spark_jobs as jobs
from hpvc.errors import InputError

PLAN: Any = SimpleNamespace(spark=SimpleNamespace(master="head0"))


def _exec_with(monkeypatch: pytest.MonkeyPatch, rc: int) -> list[list[str]]:
    ran: list[list[str]] = []
    monkeypatch.setattr(ops, "exec_argv", lambda name, node, argv: ["exec", name, node, *argv])

    def run(argv: list[str], **_: object) -> subprocess.CompletedProcess[bytes]:
        ran.append(argv)
        return subprocess.CompletedProcess(argv, rc, b"", b"")

    monkeypatch.setattr(jobs.subprocess, "run", run)
    return ran


def test_a_missing_jar_is_one_line_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    ran = _exec_with(monkeypatch, 1)
    with pytest.raises(InputError) as e:
        jobs.check_app("spark", PLAN, "/shared/app.jar")
    assert ran == [["exec", "spark", "head0", "test", "-r", "/shared/app.jar"]]
    line = e.value.line()
    assert "no readable file /shared/app.jar on node head0" in line
    assert "hpvc spark submit spark terasort" in line and "/shared on the nodes" in line


def test_a_present_jar_and_non_paths_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    ran = _exec_with(monkeypatch, 0)
    jobs.check_app("spark", PLAN, "/opt/hpvc/terasort.jar")
    assert len(ran) == 1
    _exec_with(monkeypatch, 1)
    jobs.check_app("spark", PLAN, "hdfs://nn/app.jar")  # not a node path: Spark checks it
