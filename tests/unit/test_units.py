"""CPU-list notation: parse_cpulist and format_cpulist."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpvc.units import format_cpulist, parse_cpulist


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("", []),
        ("  \n", []),
        ("0", [0]),
        ("0-3,8", [0, 1, 2, 3, 8]),
        ("8,0-3", [0, 1, 2, 3, 8]),
        ("1,1,0-1", [0, 1]),
        ("0-7:2", [0, 2, 4, 6]),
        ("4-20\n", list(range(4, 21))),
    ],
)
def test_parse_cpulist(text: str, cpus: list[int]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["3-1", "a", "0-", "1-3:0"])
def test_parse_cpulist_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(text)


@pytest.mark.parametrize(
    ("cpus", "text"),
    [([], ""), ([5], "5"), ([0, 1, 2, 3, 8], "0-3,8"), ((3, 1, 2), "1-3"), ({0, 2, 4}, "0,2,4")],
)
def test_format_cpulist(cpus: list[int], text: str) -> None:
    assert format_cpulist(cpus) == text


@given(st.sets(st.integers(min_value=0, max_value=4096)))
def test_round_trip(cpus: set[int]) -> None:
    assert parse_cpulist(format_cpulist(cpus)) == sorted(cpus)
