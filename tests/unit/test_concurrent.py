"""hpvc.concurrent.each: side by side, and on a failure nothing new starts while
what is under way finishes before the error is raised."""

from __future__ import annotations

import threading
import time

import pytest

from hpvc.concurrent import each


def test_every_item_runs_and_they_overlap() -> None:
    seen: list[int] = []
    inside = 0
    most = 0
    lock = threading.Lock()

    def fn(i: int) -> None:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        time.sleep(0.05)
        with lock:
            inside -= 1
            seen.append(i)

    each(list(range(6)), fn, workers=3)
    assert sorted(seen) == list(range(6))
    assert most == 3


def test_a_failure_stops_new_starts_and_waits_for_those_under_way() -> None:
    started: list[int] = []
    finished: list[int] = []
    lock = threading.Lock()

    def fn(i: int) -> None:
        with lock:
            started.append(i)
        if i == 0:
            raise ValueError("node 0 failed")
        time.sleep(0.1)
        with lock:
            finished.append(i)

    with pytest.raises(ValueError, match="node 0 failed"):
        each(list(range(20)), fn, workers=2)
    # The one running beside the failure finished before each() raised; the
    # rest never started.
    assert sorted(finished) == sorted(i for i in started if i != 0)
    assert len(started) < 20


def test_one_item_or_one_worker_runs_in_order_in_this_thread() -> None:
    where: list[str] = []
    each([1, 2, 3], lambda _: where.append(threading.current_thread().name), workers=1)
    assert where == [threading.current_thread().name] * 3
