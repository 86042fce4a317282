"""The pure parts of a Slurm job's checkpoint (hpvc.slurm.checkpoint), and the
cut's order across hosts: ``take`` talks to one worker per host, here small
Python programs run through a real ``--via`` template that speak
``hpvc node checkpoint-share``'s line protocol and log what they were told,
so the test sees every host frozen before any saves, and a host failing make
every host abort and the cut's folder go."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from hpvc.errors import HpvcError, InputError
from hpvc.slurm import checkpoint as jck
from hpvc.slurm import checkpoint_timer
from hpvc.slurm.policy import Site

WORKER = r"""
import os, sys, time
host, log, fail = sys.argv[1], sys.argv[2], sys.argv[3]
index = {"a": 0, "b": 1, "c": 2}[host]
def note(what):
    with open(log, "a") as f:
        f.write(f"{time.monotonic():.6f} {host} {what}\n")
if fail == host + ":ready":
    sys.stderr.write("hpvc: job 7 has no hpvc share on this host\n"); sys.exit(2)
print(f"ready {index} node{index}", flush=True)
steps = [("freeze", "frozen"), ("save", "saved")]
for want, answer in steps:
    word = sys.stdin.readline().strip()
    if word != want:
        note("aborted"); sys.exit(1)
    note(want)
    if fail == f"{host}:{want}":
        sys.stderr.write(f"hpvc: {want} failed on {host}\n"); note("aborted"); sys.exit(1)
    print(answer, flush=True)
word = sys.stdin.readline().strip()
if word not in ("thaw", "stop"):
    note("aborted"); sys.exit(1)
note(word)
print('done {"size": 1024}', flush=True)
"""


def _take(tmp_path: Path, fail: str = "", hosts: tuple[str, ...] = ("a", "b", "c")) -> jck.Taken:
    prog = tmp_path / "worker.py"
    prog.write_text(WORKER)
    log = tmp_path / "log"
    log.touch()
    via = f"{sys.executable} {prog} {{host}} {log} {fail or '-'}"
    return jck.take(7, list(hosts), tmp_path / "job", via, hpvc=["--"])


def _events(tmp_path: Path) -> list[tuple[float, str, str]]:
    out = []
    for line in (tmp_path / "log").read_text().splitlines():
        t, host, what = line.split()
        out.append((float(t), host, what))
    return out


def test_every_host_is_frozen_before_any_saves(tmp_path: Path) -> None:
    taken = _take(tmp_path)
    ev = _events(tmp_path)
    last_freeze = max(t for t, _, w in ev if w == "freeze")
    first_save = min(t for t, _, w in ev if w == "save")
    assert last_freeze < first_save
    assert sorted(h for _, h, w in ev if w == "thaw") == ["a", "b", "c"]
    m = jck.read_job(taken.dir)
    assert [(s.index, s.host, s.dir, s.nodes) for s in m.shares] == [
        (0, "a", "share-0", ("node0",)),
        (1, "b", "share-1", ("node1",)),
        (2, "c", "share-2", ("node2",)),
    ]
    assert jck.latest(tmp_path / "job") == taken.dir
    assert taken.as_dict()["size"] == 3 * 1024


def test_a_host_failing_to_save_aborts_every_host_and_removes_the_cut(tmp_path: Path) -> None:
    with pytest.raises(HpvcError, match="save failed on b"):
        _take(tmp_path, fail="b:save")
    ev = _events(tmp_path)
    assert sorted(h for _, h, w in ev if w == "aborted") == ["a", "b", "c"]
    assert not any(w in ("thaw", "stop") for _, _, w in ev)
    assert not (tmp_path / "job").exists()  # nothing of the job was there before


def test_a_host_refusing_is_input_error_and_nothing_is_frozen(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no hpvc share"):
        _take(tmp_path, fail="c:ready")
    assert not any(w == "freeze" for _, _, w in _events(tmp_path))


def test_only_the_newest_two_cuts_stay(tmp_path: Path) -> None:
    for _ in range(4):
        _take(tmp_path, hosts=("a",))
        time.sleep(0.002)  # the stamps are to the millisecond
    assert len(jck.cuts(tmp_path / "job")) == 2


def test_no_one_listing_the_cuts_ever_sees_more_than_two(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The periodic test (test_slurm_checkpoint_requeue.py) polls the job's folder; a
    third cut must not show while the oldest is being deleted or before it goes."""
    seen: list[int] = []
    rmtree, replace = jck.shutil.rmtree, jck.os.replace

    def counting_rmtree(path: Path, ignore_errors: bool = False) -> None:
        seen.append(len(jck.cuts(tmp_path / "job")))
        rmtree(path, ignore_errors=ignore_errors)

    def counting_replace(a: Path, b: Path) -> None:
        replace(a, b)
        seen.append(len(jck.cuts(tmp_path / "job")))

    monkeypatch.setattr(jck.shutil, "rmtree", counting_rmtree)
    monkeypatch.setattr(jck.os, "replace", counting_replace)
    for _ in range(4):
        _take(tmp_path, hosts=("a",))
        time.sleep(0.002)  # the stamps are to the millisecond
    assert len(jck.cuts(tmp_path / "job")) == 2
    assert seen and max(seen) <= 2, seen
    assert not [p for p in (tmp_path / "job").iterdir() if p.name.startswith(jck.GOING)]


def test_to_remove_keeps_the_newest_complete_and_a_newer_unfinished() -> None:
    names = ["20261126T080000.000Z", "20261126T080100.000Z", "20261126T080200.000Z",
             "20261126T080230.000Z", "20261126T080300.000Z"]  # fmt: skip
    complete = {names[0], names[2], names[3]}
    # names[1]: unfinished and older than the newest complete; names[4]: in progress.
    assert jck.to_remove(names, complete, keep=2) == [names[0], names[1]]
    assert jck.to_remove(names[:2], set(), keep=2) == []


def test_job_manifest_round_trip_and_refusals(tmp_path: Path) -> None:
    shares = (
        jck.ShareEntry(0, "n1", "share-0", ("head0",)),
        jck.ShareEntry(1, "n2", "share-1", ("c",)),
    )
    m = jck.JobManifest(5, 1.5, ("n1", "n2"), shares)
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / jck.JOB_MANIFEST).write_text(json.dumps(m.to_json()))
    assert jck.read_job(cut) == m
    bad = m.to_json() | {"shares": [{"index": 1, "host": "n1", "dir": "../x", "nodes": []}]}
    (cut / jck.JOB_MANIFEST).write_text(json.dumps(bad))
    with pytest.raises(InputError, match=r"not 0\.\.n-1"):
        jck.read_job(cut)
    (cut / jck.JOB_MANIFEST).write_text(json.dumps(m.to_json() | {"schema": 99}))
    with pytest.raises(InputError, match="schema 99"):
        jck.read_job(cut)
    (cut / jck.JOB_MANIFEST).write_text("{trunc")
    with pytest.raises(InputError, match="unreadable"):
        jck.read_job(cut)
    with pytest.raises(InputError, match="never finished"):
        jck.read_job(tmp_path)


def test_scontrol_fields_and_a_job_that_is_not_running() -> None:
    text = "JobId=12 JobName=x UserId=u(1) JobState=RUNNING Reason=None NodeList=n[2-3] X=\n"
    info = jck.parse_scontrol(text)
    assert jck.running_hosts(info, 12) == ["n2", "n3"]
    with pytest.raises(InputError, match="is PENDING"):
        jck.running_hosts(info | {"JobState": "PENDING"}, 12)


def test_site_checkpoint_settings_and_the_period() -> None:
    site = Site.parse(["checkpoints=/shared/ck", "checkpoint_min=60", "checkpoint_via=/x/on"])
    assert (site.checkpoints, site.checkpoint_min_s, site.checkpoint_via) == (
        "/shared/ck",
        60,
        "/x/on",
    )
    assert checkpoint_timer.via(site) == "/x/on {host}"
    for bad in ("checkpoints=rel", "checkpoint_min=0", "checkpoint_min=soon"):
        with pytest.raises(InputError):
            Site.parse([bad])
    checkpoint_timer.check_every(0, Site())
    checkpoint_timer.check_every(60, site)
    with pytest.raises(InputError, match="more often"):
        checkpoint_timer.check_every(59, site)
    with pytest.raises(InputError, match="keeps no checkpoints"):
        checkpoint_timer.check_every(600, Site())
