"""The storage bandwidth coordinator on real clusters (docs/io.md).

Three one-node container clusters, each serving its shared directory over NFS
(Ganesha in its own cgroup), priorities 1:2:4 in a site file that declares the
disk under the state directory with a write capacity well below what it does.
Each node writes flat out through /shared (fio, direct I/O): they get 1/7,
2/7 and 4/7 of it within 5% (two export an ext4 loop file system, throttled on
their loop device; one a plain folder, throttled on the disk). A phase that
falls short is measured once more (this 2-CPU machine is shared: a node's NFS
pipeline can be starved for a moment); one above its target fails at once.
A cluster alone on the disk is left as if unmanaged: no throttle, writes
buffered; once others come its loop file system writes synchronously (so its
server's cgroup is charged) and the folder's server writes through. When the
4 leaves, the others' throttles change within 1 s and they get 1/3 and 2/3;
a demand below its share (``hpvc io set``) is met and the rest goes to the
other; a bad site file is refused in one line and changes nothing.
Nothing is left behind: no cluster, server, cgroup, mount or loop device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpvc.cluster import lifecycle, ops
from hpvc.coordinator import coordinator
from hpvc.coordinator.site import ENV
from hpvc.coordinator.state import members
from hpvc.coordinator.status import counters, held, status
from hpvc.host import nfs_backing
from hpvc.store import Store
from tests.integration.test_cluster import cli_env, leftovers, store
from tests.integration.test_shared_nfs import mounts_under, nfs_ready, our_processes
from tests.integration.test_writable_layer import loops_under

__all__ = ["nfs_ready", "store"]  # fixtures

MB = 1_000_000
CAPACITY = 70 * MB
TOLERANCE = 0.05  # over a target: the throttle is wrong, fails at once
SHORT = 0.10  # under it: the writer fell behind on a loaded machine, tried again
ATTEMPTS = 3
SECONDS = 6  # each fio run, after a 1 s ramp


def spec(tmp_path: Path, name: str, shared: str) -> str:
    p = tmp_path / f"{name}.toml"
    p.write_text(
        f'name = "{name}"\nkind = "container"\nimage = "hpc"\n'
        '[tuning]\npinning = "shared"\nhugepages = "none"\npartition = "commodity"\n'
        f'[shared]\nserver = "nfs"\n{shared}\n'
        '[[nodes]]\nrole = "head"\nmemory = "256MiB"\n'
    )
    return str(p)


# c1: a loop file system and a demand above any share; c2: a plain folder
# (its throttle is on the disk itself); c4: a loop file system.
SHARED = {
    "p1": 'size = "512MiB"\ndemand = { write = "500MB/s" }',
    "p2": "",
    "p4": 'size = "512MiB"',
}


def site_text(store: Store, names: dict[str, int]) -> str:
    prios = ", ".join(f"{n} = {p}" for n, p in names.items())
    return (
        f'[devices.state]\npath = "{store.root}"\nwrite = "{CAPACITY}"\n'
        f"[priority]\ndefault = 1\nclusters = {{ {prios} }}\n"
    )


def fio(store: Store, name: str, seconds: int) -> subprocess.Popen[str]:
    argv = ["fio", "--name=w", "--filename=/shared/f", "--rw=write", "--bs=1M", "--size=64M"]
    argv += ["--direct=1", "--ioengine=psync", "--fallocate=none", "--ramp_time=1"]
    argv += [f"--runtime={seconds}", "--time_based", "--output-format=json"]
    return subprocess.Popen(
        ops.exec_argv(name, "head0", argv, store), stdout=subprocess.PIPE, text=True
    )


def bandwidth(p: subprocess.Popen[str]) -> float:
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0, out
    return float(json.loads(out[out.find("{") :])["jobs"][0]["write"]["bw_bytes"])


def flat_out_once(store: Store, names: list[str]) -> dict[str, tuple[float, float]]:
    """(fio's bandwidth, the server cgroup's rate) of each cluster, all writing at once."""
    procs = {n: fio(store, n, SECONDS) for n in names}
    time.sleep(2)  # exec, fio's start and its ramp
    before, t0 = counters(store), time.perf_counter()
    time.sleep(SECONDS - 2)
    after, t1 = counters(store), time.perf_counter()
    rates = {n: (after[n]["write"] - before[n]["write"]) / (t1 - t0) for n in names}
    return {n: (bandwidth(p), rates[n]) for n, p in procs.items()}


def flat_out(store: Store, targets: dict[str, float], what: str) -> dict[str, tuple[float, float]]:
    """``flat_out_once``, again (``ATTEMPTS`` in all) while a cluster falls short
    of its target by more than ``SHORT``: on a busy shared machine a node's NFS
    pipeline can be starved for a moment (a throttle only caps: being over the
    target by more than ``TOLERANCE`` fails at once). Seen 2026-11-27 on a
    fresh machine: 83% of every target, then 94-99%."""
    for attempt in range(1, ATTEMPTS + 1):
        got = flat_out_once(store, list(targets))
        report = {n: (round(f / MB, 2), round(c / MB, 2)) for n, (f, c) in got.items()}
        print(f"{what}, attempt {attempt}, (fio, cgroup) MB/s: {report}, load {os.getloadavg()}")
        for n, want in targets.items():
            assert all(v <= (1 + TOLERANCE) * want for v in got[n]), report
        if all(near(v, want) for n, want in targets.items() for v in got[n]):
            return got
    raise AssertionError(f"{what}: not within -{SHORT:.0%}/+{TOLERANCE:.0%} of {targets}: {report}")


def near(got: float, want: float) -> bool:
    return (1 - SHORT) * want <= got <= (1 + TOLERANCE) * want


def write_limit(store: Store, name: str) -> set[int | None]:
    return {v["write"] for v in held(store)[name].values()}


def export(store: Store, name: str) -> Path:
    (m,) = [m for m in members(store) if m.cluster == name]
    return m.export


def alone(store: Store, name: str) -> None:
    """A cluster alone on its disk, with no demand below the capacity: the
    coordinator leaves it as if unmanaged (no throttle, writes buffered)."""
    (row,) = [r for r in status(store, interval=0)["clusters"] if r["cluster"] == name]
    assert row["allocation"]["write"] == CAPACITY and row["limited"]["write"] is False
    assert row["writes"] == "buffered" and row["limit"]["write"] is None
    assert nfs_backing.is_sync(export(store, name)) is False
    assert write_limit(store, name) <= {None}


def test_bandwidth_is_shared_by_priority_and_demand(
    nfs_ready: None, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tag = f"q{os.getpid() % 1000}"
    c1, c2, c4 = f"{tag}p1", f"{tag}p2", f"{tag}p4"
    site = tmp_path / "io.toml"
    store.root.mkdir(parents=True, exist_ok=True)
    site.write_text(site_text(store, {c1: 1, c2: 2, c4: 4}))
    monkeypatch.setenv(ENV, str(site))
    try:
        lifecycle.up(spec(tmp_path, c1, SHARED["p1"]), store)
        alone(store, c1)  # it may take the whole disk: no limit, buffered writes
        for name in (c2, c4):  # each up rebalances (lifecycle's hook)
            lifecycle.up(spec(tmp_path, name, SHARED[name[-2:]]), store)
        doc = status(store, interval=0)
        rows = {r["cluster"]: r for r in doc["clusters"]}
        assert [rows[n]["allocation"]["write"] for n in (c1, c2, c4)] == [10 * MB, 20 * MB, 40 * MB]
        assert all(r["device"] == "state" for r in rows.values())
        # Loop file systems switched to synchronous writes; the folder's server
        # writes through for its life (it was started on a managed disk).
        assert [rows[n]["writes"] for n in (c1, c2, c4)] == ["sync", "through", "sync"]
        assert [rows[n]["stable_writes"] for n in (c1, c2, c4)] == [False, True, False]
        assert [nfs_backing.is_sync(export(store, n)) for n in (c1, c4)] == [True, True]
        assert (
            rows[c1]["demand"]["write"] == 500 * MB and rows[c1]["demand_from"]["write"] == "spec"
        )
        assert write_limit(store, c4) == {40 * MB}
        loop, disk = (list(held(store)[n]) for n in (c4, c2))
        assert loop[0].startswith("7:") and not disk[0].startswith("7:")  # loop / the disk

        shares = {c1: CAPACITY / 7, c2: 2 * CAPACITY / 7, c4: 4 * CAPACITY / 7}
        flat_out(store, shares, f"1:2:4 of {CAPACITY / MB:g} MB/s")

        # The 4 leaves while the others write: their throttles change within 1 s.
        procs = {n: fio(store, n, 20) for n in (c1, c2)}
        time.sleep(3)
        seen: dict[str, float] = {}
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                now = time.perf_counter()
                if "gone" not in seen and store.load(c4) is None:
                    seen["gone"] = now
                if "applied" not in seen and write_limit(store, c1) == {CAPACITY // 3}:
                    seen["applied"] = now
                time.sleep(0.005)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            lifecycle.down(c4, store)
            returned = time.perf_counter()
        finally:
            stop.set()
            watcher.join()
        # down rebalances before it returns: a watcher starved of CPU (a loaded
        # 2-CPU host) may miss both moments; down's return bounds them from above.
        if "applied" not in seen and write_limit(store, c1) == {CAPACITY // 3}:
            seen["applied"] = returned
        assert "applied" in seen, f"c1's throttle never became {CAPACITY // 3}"
        rebalance_s = seen["applied"] - seen.get("gone", seen["applied"])
        print(f"after the 4 left: rebalanced {rebalance_s * 1000:.0f} ms after its record went")
        assert rebalance_s < 1.0
        assert write_limit(store, c2) == {2 * CAPACITY // 3}
        time.sleep(1.0)  # from here on the new shares hold
        want = {c1: CAPACITY / 3, c2: 2 * CAPACITY / 3}
        for _attempt in range(ATTEMPTS):  # another 5 s window if one fell short (flat_out)
            before, t0 = counters(store), time.perf_counter()
            time.sleep(5)
            after, t1 = counters(store), time.perf_counter()
            rates = {n: (after[n]["write"] - before[n]["write"]) / (t1 - t0) for n in want}
            print(f"after the 4 left, MB/s: { ({n: round(r / MB, 2) for n, r in rates.items()}) }")
            assert all(rates[n] <= (1 + TOLERANCE) * w for n, w in want.items()), rates
            if all(near(rates[n], w) for n, w in want.items()):
                break
        else:
            raise AssertionError(
                f"after the 4 left: not within -{SHORT:.0%}/+{TOLERANCE:.0%}: {rates}"
            )
        for p in procs.values():
            bandwidth(p)

        # A demand below its share is met; the rest goes to the other.
        t = time.perf_counter()
        coordinator.set_cluster(store, c2, write=10 * MB)
        assert time.perf_counter() - t < 1.0
        assert write_limit(store, c2) == {10 * MB}
        assert write_limit(store, c1) == {CAPACITY - 10 * MB}
        flat_out(store, {c1: CAPACITY - 10 * MB, c2: 10 * MB}, "c2 asks 10 MB/s")

        # A bad site file: one line, exit 2, nothing changed.
        limits = held(store)
        overrides = (store.root / "io" / "overrides.json").read_text()
        site.write_text(site_text(store, {c1: 1}).replace(f'"{CAPACITY}"', '"a lot"'))
        r = subprocess.run(
            [sys.executable, "-m", "hpvc", "io", "set", c1, "--priority", "5"],
            capture_output=True, text=True, check=False,
            env={**cli_env(store), ENV: str(site), "HPVC_RESIDENT": "0"},
        )  # fmt: skip
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert f"site file {site}: devices.state.write: 'a lot' is not a size" in r.stderr
        assert held(store) == limits
        assert (store.root / "io" / "overrides.json").read_text() == overrides

        # Alone again (the site file good again): no limit, and buffered writes.
        site.write_text(site_text(store, {c1: 1, c2: 2, c4: 4}))
        lifecycle.down(c2, store)
        alone(store, c1)
    finally:
        for name in (c4, c2, c1):
            if store.load(name) is not None:
                lifecycle.down(name, store)
    for name in (c1, c2, c4):
        assert leftovers(name) == []
    assert our_processes(store.root) == []
    assert mounts_under(store.root) == []
    assert loops_under(store.root) == []
